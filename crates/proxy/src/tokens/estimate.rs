//! The estimate strategy: prompt bytes over a learned bytes-per-token ratio, erring low.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::bound::PromptView;
use super::{saturate, CountError};
use crate::config::MediaCosts;

/// Bytes per token assumed before the backend has reported any usage. BPE tokenizers
/// average 3–4.5 bytes per token on English and code; starting above that keeps early
/// estimates low, so a request that could fit is not rejected.
pub(crate) const INITIAL_BYTES_PER_TOKEN: f32 = 6.0;
/// The learned ratio is stretched by this factor before dividing: the estimate is meant to
/// be a lower figure, since a rejection on an estimate must not refuse a request that fits.
pub(crate) const MARGIN: f32 = 1.25;
/// Weight of a new observation in the running average.
const ALPHA: f32 = 0.2;

/// Learns bytes per token for one alias from `usage.prompt_tokens`.
pub(crate) struct Estimator {
    /// `f32` bits of the running bytes-per-token average.
    ratio: AtomicU32,
    seen: AtomicU32,
}

impl Default for Estimator {
    fn default() -> Self {
        Self::new()
    }
}

impl Estimator {
    pub(crate) fn new() -> Estimator {
        Estimator {
            ratio: AtomicU32::new(INITIAL_BYTES_PER_TOKEN.to_bits()),
            seen: AtomicU32::new(0),
        }
    }

    /// The current bytes-per-token ratio.
    pub(crate) fn ratio(&self) -> f32 {
        f32::from_bits(self.ratio.load(Ordering::Relaxed))
    }

    /// Estimated tokens for `bytes` of prompt text (rounded down).
    pub(crate) fn tokens(&self, bytes: usize) -> u32 {
        let per = (self.ratio() * MARGIN).max(0.5);
        // a float estimate; precision loss on huge sizes is irrelevant
        let est = (bytes as f64) / f64::from(per);
        saturate(est.floor() as u64)
    }

    pub(crate) fn count(&self, body: &[u8], media: &MediaCosts) -> Result<u32, CountError> {
        let view = PromptView::parse(body).map_err(|e| CountError::Invalid(e.to_string()))?;
        let text = text_bytes(body).unwrap_or(body.len());
        Ok(saturate(
            u64::from(self.tokens(text)) + view.media.cost(media),
        ))
    }

    /// Folds one observation into the running average (ratios clamped to [1, 32]).
    pub(crate) fn observe(&self, prompt_bytes: usize, prompt_tokens: u32) {
        if prompt_bytes == 0 || prompt_tokens == 0 {
            return;
        }
        let r = ((prompt_bytes as f64) / f64::from(prompt_tokens)).clamp(1.0, 32.0) as f32;
        let first = self.seen.fetch_add(1, Ordering::Relaxed) == 0;
        let _ = self
            .ratio
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let old = f32::from_bits(bits);
                let new = if first { r } else { old + ALPHA * (r - old) };
                Some(new.to_bits())
            });
    }
}

/// Bytes of the string values (object keys excluded) under `messages` and `tools`, media
/// parts excluded: the text a backend tokenizes, without the JSON around it.
pub(crate) fn text_bytes(body: &[u8]) -> Option<usize> {
    #[derive(serde::Deserialize)]
    struct Top {
        #[serde(default)]
        messages: Option<Acc>,
        #[serde(default)]
        tools: Option<Acc>,
    }
    let top: Top = serde_json::from_slice(body).ok()?;
    let total = top.messages.map_or(0, |a| a.bytes) + top.tools.map_or(0, |a| a.bytes);
    usize::try_from(total).ok()
}

/// String bytes of a JSON value; `media` marks a string naming a media part type.
struct Acc {
    bytes: u64,
    media: bool,
}

impl<'de> Deserialize<'de> for Acc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Acc, D::Error> {
        d.deserialize_any(AccVisitor)
    }
}

struct AccVisitor;

const EMPTY: Acc = Acc {
    bytes: 0,
    media: false,
};

impl<'de> Visitor<'de> for AccVisitor {
    type Value = Acc;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_str<E>(self, v: &str) -> Result<Acc, E> {
        Ok(Acc {
            bytes: u64::try_from(v.len()).unwrap_or(u64::MAX),
            media: matches!(
                v,
                "image_url" | "input_image" | "image" | "video_url" | "input_audio" | "audio_url"
            ),
        })
    }
    fn visit_bool<E>(self, _: bool) -> Result<Acc, E> {
        Ok(EMPTY)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Acc, E> {
        Ok(EMPTY)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Acc, E> {
        Ok(EMPTY)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Acc, E> {
        Ok(EMPTY)
    }
    fn visit_unit<E>(self) -> Result<Acc, E> {
        Ok(EMPTY)
    }
    fn visit_none<E>(self) -> Result<Acc, E> {
        Ok(EMPTY)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Acc, A::Error> {
        let mut bytes = 0u64;
        while let Some(a) = seq.next_element::<Acc>()? {
            bytes = bytes.saturating_add(a.bytes);
        }
        Ok(Acc {
            bytes,
            media: false,
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Acc, A::Error> {
        let (mut bytes, mut media) = (0u64, false);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let a: Acc = map.next_value()?;
            media |= key == "type" && a.media;
            bytes = bytes.saturating_add(a.bytes);
        }
        Ok(Acc {
            bytes: if media { 0 } else { bytes },
            media: false,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn starts_lenient_then_learns() {
        let e = Estimator::new();
        assert_eq!(e.tokens(7500), 1000);
        e.observe(4000, 1000);
        assert!((e.ratio() - 4.0).abs() < 1e-6);
        e.observe(8000, 1000);
        assert!((e.ratio() - 4.8).abs() < 1e-5);
        e.observe(0, 10);
        e.observe(10, 0);
        assert!((e.ratio() - 4.8).abs() < 1e-5);
    }

    #[test]
    fn counts_text_and_media() {
        let e = Estimator::new();
        let body = br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        let n = e
            .count(
                body,
                &MediaCosts {
                    image: 100,
                    audio: 0,
                },
            )
            .unwrap();
        assert!((100..110).contains(&n), "{n}");
    }
}
