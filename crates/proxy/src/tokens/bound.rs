//! The free bound: an upper limit on a request's prompt tokens from its bytes, no tokenizer.
//!
//! Every token covers at least one byte of the rendered prompt, special tokens included, so
//! the rendered prompt's length in bytes bounds its token count. The rendering is not built
//! here; its length is bounded from the wire: each message renders its own strings
//! (unescaped, so no longer than their JSON) plus template text, tool schemas and tool-call
//! arguments are re-serialized by `tojson` with `", "`/`": "` separators (at most twice their
//! compact JSON), and media parts are replaced by their configured cost. The template's own
//! text is assumed to stay within [`BASE_BYTES`] plus [`PER_ITEM_BYTES`] per message and tool.

use memchr::memmem;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::preprocess::Media;
use crate::config::MediaCosts;

/// Template text outside the messages (system preamble, tool instructions, generation prompt).
pub(crate) const BASE_BYTES: u64 = 1024;
/// Template text around one message or tool (role markers, separators, default fields).
pub(crate) const PER_ITEM_BYTES: u64 = 64;

/// What the bound and the guard need from a chat body, read without building a JSON tree.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PromptView {
    pub max_tokens: Option<u32>,
    pub(crate) max_completion_tokens: Option<u32>,
    pub(crate) messages: usize,
    pub(crate) tools: usize,
    /// JSON bytes of the messages, media parts excluded.
    pub(crate) message_bytes: u64,
    /// JSON bytes of messages carrying `tool_calls` (counted twice in the bound).
    pub(crate) tool_call_message_bytes: u64,
    pub(crate) tool_bytes: u64,
    pub(crate) kwargs_bytes: u64,
    pub(crate) media: Media,
}

/// A body the view cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("invalid JSON body: {0}")]
    Json(String),
    #[error("messages must be an array of objects")]
    Messages,
    #[error("invalid value for {param}: {message}")]
    Param {
        param: &'static str,
        message: String,
    },
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    messages: Option<Spans<'a>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    chat_template_kwargs: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
}

/// The raw JSON of each element of an array, read in the same pass as the body; `None`
/// when the value is not an array.
struct Spans<'a>(Option<Vec<&'a RawValue>>);

impl<'de: 'a, 'a> Deserialize<'de> for Spans<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SpansVisitor(std::marker::PhantomData))
    }
}

struct SpansVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> serde::de::Visitor<'de> for SpansVisitor<'a> {
    type Value = Spans<'a>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Spans<'a>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(raw) = seq.next_element::<&'de RawValue>()? {
            out.push(raw);
        }
        Ok(Spans(Some(out)))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Spans<'a>, A::Error> {
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(Spans(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Spans<'a>, E> {
        Ok(Spans(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Spans<'a>, E> {
        Ok(Spans(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Spans<'a>, E> {
        Ok(Spans(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Spans<'a>, E> {
        Ok(Spans(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Spans<'a>, E> {
        Ok(Spans(None))
    }
    fn visit_unit<E>(self) -> Result<Spans<'a>, E> {
        Ok(Spans(None))
    }
}

#[derive(Deserialize)]
struct MessageContent<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ToolCalls<'a> {
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct PartType<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<std::borrow::Cow<'a, str>>,
}

impl PromptView {
    pub fn parse(body: &[u8]) -> Result<PromptView, ViewError> {
        let top: Top = serde_json::from_slice(body).map_err(|e| ViewError::Json(e.to_string()))?;
        let mut view = PromptView {
            max_tokens: limit(top.max_tokens, "max_tokens")?,
            max_completion_tokens: limit(top.max_completion_tokens, "max_completion_tokens")?,
            kwargs_bytes: top.chat_template_kwargs.map_or(0, |k| len(k.get())),
            ..PromptView::default()
        };
        let Some(Spans(Some(messages))) = top.messages else {
            return Err(ViewError::Messages);
        };
        view.messages = messages.len();
        for m in messages {
            view.add_message(m.get())?;
        }
        if let Some(tools) = top.tools.filter(|t| t.get() != "null") {
            let list: Vec<&RawValue> =
                serde_json::from_str(tools.get()).map_err(|_| ViewError::Param {
                    param: "tools",
                    message: "must be an array".into(),
                })?;
            view.tools = list.len();
            view.tool_bytes = len(tools.get());
        }
        Ok(view)
    }

    fn add_message(&mut self, raw: &str) -> Result<(), ViewError> {
        if !raw.starts_with('{') {
            return Err(ViewError::Messages);
        }
        let mut bytes = len(raw);
        // A key written with escapes hides from the two searches: such a message is read as
        // if it had both keys (the parse below finds what is there).
        let escaped = switchboard_json::scan::may_escape_word(raw.as_bytes());
        if escaped || memmem::find(raw.as_bytes(), b"\"type\"").is_some() {
            let msg: MessageContent = serde_json::from_str(raw).map_err(|_| ViewError::Messages)?;
            if let Some(content) = msg.content.filter(|c| c.get().starts_with('[')) {
                let parts: Vec<&RawValue> =
                    serde_json::from_str(content.get()).map_err(|_| ViewError::Messages)?;
                for part in parts {
                    let kind = serde_json::from_str::<PartType>(part.get())
                        .ok()
                        .and_then(|p| p.kind);
                    match kind.as_deref() {
                        Some("image_url" | "input_image" | "image" | "video_url") => {
                            self.media.images += 1;
                            bytes -= len(part.get());
                        }
                        Some("input_audio" | "audio_url") => {
                            self.media.audio += 1;
                            bytes -= len(part.get());
                        }
                        _ => {}
                    }
                }
            }
        }
        let tool_calls = if escaped {
            serde_json::from_str::<ToolCalls>(raw).is_ok_and(|m| m.tool_calls.is_some())
        } else {
            memmem::find(raw.as_bytes(), b"\"tool_calls\"").is_some()
        };
        if tool_calls {
            self.tool_call_message_bytes += bytes;
        }
        self.message_bytes += bytes;
        Ok(())
    }

    /// `max_completion_tokens`, else `max_tokens`: the output the client asks room for.
    pub fn requested_output(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// An upper bound on the prompt's tokens, media costed by `media`.
    pub fn prompt_bound(&self, media: &MediaCosts) -> u64 {
        let items = u64::try_from(self.messages + self.tools).unwrap_or(u64::MAX);
        self.message_bytes
            + self.tool_call_message_bytes
            + 2 * self.tool_bytes
            + self.kwargs_bytes
            + BASE_BYTES
            + PER_ITEM_BYTES.saturating_mul(items)
            + self.media.cost(media)
    }
}

fn len(s: &str) -> u64 {
    u64::try_from(s.len()).unwrap_or(u64::MAX)
}

/// A token limit (see [`switchboard_json::scan::token_limit`]), refused as the parameter `param`.
fn limit(raw: Option<&RawValue>, param: &'static str) -> Result<Option<u32>, ViewError> {
    switchboard_json::scan::token_limit(raw).map_err(|message| ViewError::Param {
        param,
        message: message.into(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_limits_and_sizes() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":100,"tools":[{"type":"function","function":{"name":"f"}}]}"#;
        let v = PromptView::parse(body).unwrap();
        assert_eq!(v.max_tokens, Some(100));
        assert_eq!(v.requested_output(), Some(100));
        assert_eq!(v.messages, 1);
        assert_eq!(v.tools, 1);
        assert_eq!(v.message_bytes, 33);
        assert_eq!(v.tool_bytes, 45);
    }

    #[test]
    fn media_parts_cost_their_configured_tokens() {
        let body = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}"#;
        let v = PromptView::parse(body).unwrap();
        assert_eq!(
            v.media,
            Media {
                images: 1,
                audio: 1
            }
        );
        let costs = MediaCosts {
            image: 10,
            audio: 20,
        };
        let without = PromptView {
            media: Media::default(),
            ..v.clone()
        }
        .prompt_bound(&costs);
        assert_eq!(v.prompt_bound(&costs), without + 30);
        assert!(v.message_bytes < 60, "{}", v.message_bytes);
    }

    /// Media parts and tool calls count the same however the message is spelled.
    #[test]
    fn escaped_keys_count_like_plain_ones() {
        let plain = br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","content":"","tool_calls":[{"id":"t"}]}]}"#;
        let escaped = br#"{"messages":[{"role":"user","content":[{"\u0074ype":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","content":"","tool\u005fcalls":[{"id":"t"}]}]}"#;
        let spaced = b"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\" : \"image_url\", \"image_url\": {\"url\": \"x\"}}]}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\" :\n[{\"id\": \"t\"}]}]}";
        let p = PromptView::parse(plain).unwrap();
        assert_eq!(p.media.images, 1);
        assert!(p.tool_call_message_bytes > 0);
        for other in [&escaped[..], &spaced[..]] {
            let v = PromptView::parse(other).unwrap();
            assert_eq!(v.media, p.media);
            assert!(v.tool_call_message_bytes > 0);
        }
    }

    #[test]
    fn limits_validate() {
        let p = |s: &str| PromptView::parse(s.as_bytes());
        assert_eq!(
            p(r#"{"messages":[],"max_completion_tokens":5.0,"max_tokens":null}"#)
                .unwrap()
                .requested_output(),
            Some(5)
        );
        assert!(matches!(
            p(r#"{"messages":[],"max_tokens":-1}"#),
            Err(ViewError::Param {
                param: "max_tokens",
                ..
            })
        ));
        assert!(matches!(
            p(r#"{"messages":[],"max_tokens":"x"}"#),
            Err(ViewError::Param { .. })
        ));
        assert!(matches!(p(r#"{"messages":{}}"#), Err(ViewError::Messages)));
        assert!(matches!(p(r#"{"model":"m"}"#), Err(ViewError::Messages)));
        assert!(matches!(p("{"), Err(ViewError::Json(_))));
    }
}
