//! The guard of a request in any guarded API: chat bodies as they are; the bodies of the other
//! APIs by a bound on their own bytes first, then their chat form as the backend converts it.

use memchr::memmem;

use super::count::{count, Use};
use super::{check_chat, counted, fits, Checked, GuardSpec, Verdict};
use crate::config::MediaCosts;
use crate::error::ProxyError;
use crate::tokens::bound::{BASE_BYTES, PER_ITEM_BYTES};
use crate::tokens::preprocess::Media;
use crate::tokens::Method;
use crate::wire::{Adapter, Converter};

/// What the guard counts of one request: its body in its API, and whose conversion makes the
/// chat form of it (the backend's own, or Switchboard's translation for a chat-only backend).
pub struct Counted<'a> {
    pub adapter: &'a dyn Adapter,
    pub body: &'a [u8],
    pub converter: Converter,
    /// The client it comes from (its part of the count gate's turns), if any.
    pub who: Option<u64>,
}

/// Bound first, exact count of the chat form only when the bound cannot clear.
pub async fn check_request(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    req: Counted<'_>,
) -> Result<Verdict, ProxyError> {
    check_counted(spec, client, req).await.map(|c| c.verdict)
}

/// [`check_request`], with the fallback the count took (for its metric).
pub async fn check_counted(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    req: Counted<'_>,
) -> Result<Checked, ProxyError> {
    if req.adapter.spec().speaks_chat {
        return check_chat(spec, client, req.body, req.who).await;
    }
    let output = req.adapter.requested_output(req.body)?;
    if fits(raw_bound(req.body, &spec.media), output, spec.window) {
        return Ok(Checked {
            verdict: Verdict::Pass {
                method: Method::Bound,
            },
            fallback: None,
            prompt: None,
        });
    }
    let chat = req.adapter.to_chat(req.body, req.converter)?;
    counted(
        spec,
        output,
        count(
            spec,
            client,
            bytes::Bytes::from(chat.into_owned()),
            Use::Guard,
            req.who,
        )
        .await?,
    )
}

/// The body with its output limit lowered to `max_tokens`, in its API's keys.
pub fn clamp_request(
    adapter: &dyn Adapter,
    body: &[u8],
    max_tokens: u32,
) -> Result<Vec<u8>, ProxyError> {
    crate::wire::request::clamp_limits(body, adapter.spec().output_limit(), max_tokens)
}

/// Media markers: JSON strings that name an image or audio part (or its field).
const IMAGE_MARKS: [&[u8]; 4] = [
    b"\"image\"",
    b"\"image_url\"",
    b"\"input_image\"",
    b"\"video_url\"",
];
const AUDIO_MARKS: [&[u8]; 2] = [b"\"input_audio\"", b"\"audio_url\""];

/// An upper bound on the prompt tokens of a Messages or Responses body, from its bytes alone.
///
/// Whatever a converter makes of the body, the rendered prompt holds the body's strings
/// (unescaped, so no longer than their JSON), structures re-serialized by `tojson` (tool
/// schemas, tool inputs: at most twice their JSON) and template text around each object (at
/// most [`PER_ITEM_BYTES`] per `{`, as the chat bound allows per message), plus
/// [`BASE_BYTES`]. So twice the body's bytes bound every string and structure; each media part
/// is charged its cost however many of its markers appear (each marker counts once).
pub fn raw_bound(body: &[u8], media: &MediaCosts) -> u64 {
    let len = u64::try_from(body.len()).unwrap_or(u64::MAX);
    let objects = u64::try_from(memchr::memchr_iter(b'{', body).count()).unwrap_or(u64::MAX);
    let count = |marks: &[&[u8]]| -> u32 {
        let n: usize = marks
            .iter()
            .map(|m| memmem::find_iter(body, m).count())
            .sum();
        u32::try_from(n).unwrap_or(u32::MAX)
    };
    let parts = Media {
        images: count(&IMAGE_MARKS),
        audio: count(&AUDIO_MARKS),
    };
    len.saturating_mul(2)
        .saturating_add(BASE_BYTES)
        .saturating_add(PER_ITEM_BYTES.saturating_mul(objects))
        .saturating_add(parts.cost(media))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_bound_charges_bytes_objects_and_media() {
        let media = MediaCosts {
            image: 100,
            audio: 7,
        };
        let text = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let n = u64::try_from(text.len()).unwrap();
        assert_eq!(
            raw_bound(text, &media),
            2 * n + BASE_BYTES + 2 * PER_ITEM_BYTES
        );
        let image = br#"{"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}"#;
        let m = u64::try_from(image.len()).unwrap();
        assert_eq!(
            raw_bound(image, &media),
            2 * m + BASE_BYTES + 4 * PER_ITEM_BYTES + 100
        );
        // A quoted word inside a text is escaped in JSON: no marker.
        let quoted = br#"{"input":"say \"image\""}"#;
        let q = u64::try_from(quoted.len()).unwrap();
        assert_eq!(
            raw_bound(quoted, &media),
            2 * q + BASE_BYTES + PER_ITEM_BYTES
        );
    }
}
