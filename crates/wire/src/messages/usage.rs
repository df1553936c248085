//! Token usage as the Messages API reports it: `input_tokens` plus the prompt tokens read from
//! or written to the cache make the prompt; `output_tokens` the completion.
//!
//! A stream reports it in two steps: `message_start` carries the prompt (some backends send 0
//! there and the real figure later), `message_delta` the output tokens so far and, when the
//! backend knows them only at the end, the prompt again. Later figures replace earlier ones.

use serde::Deserialize;
use serde_json::Value;

use crate::usage::Usage;

/// The Messages usage fields, as far as reported.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) struct MessagesUsage {
    pub(crate) input_tokens: Option<u64>,
    pub(crate) output_tokens: Option<u64>,
    pub(crate) cache_read_input_tokens: Option<u64>,
    pub(crate) cache_creation_input_tokens: Option<u64>,
}

impl MessagesUsage {
    /// Reads the usage object `v`; `None` when it is not one.
    pub(crate) fn of(v: &Value) -> Option<MessagesUsage> {
        v.is_object()
            .then(|| MessagesUsage::deserialize(v).ok())
            .flatten()
    }

    /// Later figures (a `message_delta`'s) over these (a `message_start`'s).
    pub(crate) fn update(&mut self, later: MessagesUsage) {
        let keep = |a: &mut Option<u64>, b: Option<u64>| {
            if b.is_some() {
                *a = b;
            }
        };
        keep(&mut self.input_tokens, later.input_tokens);
        keep(&mut self.output_tokens, later.output_tokens);
        keep(
            &mut self.cache_read_input_tokens,
            later.cache_read_input_tokens,
        );
        keep(
            &mut self.cache_creation_input_tokens,
            later.cache_creation_input_tokens,
        );
    }

    /// As the proxy counts it: the whole prompt and the completion.
    pub(crate) fn usage(&self) -> Usage {
        let prompt = self.input_tokens.unwrap_or(0)
            + self.cache_read_input_tokens.unwrap_or(0)
            + self.cache_creation_input_tokens.unwrap_or(0);
        Usage {
            prompt,
            completion: self.output_tokens.unwrap_or(0),
            cached: self.cache_read_input_tokens,
            ..Usage::default()
        }
    }
}

#[derive(Deserialize)]
struct Answer {
    usage: Option<MessagesUsage>,
}

/// The usage of a whole Messages answer; `None` without one.
pub(crate) fn of_answer(body: &[u8]) -> Option<Usage> {
    let a: Answer = serde_json::from_slice(body).ok()?;
    Some(a.usage?.usage())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_input_plus_cache_tokens() {
        // A real llama-server's answer (`messages_01`).
        let body = br#"{"id":"chatcmpl-GNHW","type":"message","role":"assistant","content":[{"type":"text","text":"&[_tac"}],"model":"tiny-qwen3","stop_reason":"max_tokens","stop_sequence":null,"usage":{"cache_read_input_tokens":3,"input_tokens":14,"output_tokens":6}}"#;
        let u = of_answer(body).unwrap();
        assert_eq!((u.prompt, u.completion, u.reasoning), (17, 6, None));
        let mut s =
            MessagesUsage::of(&serde_json::json!({"input_tokens": 0, "output_tokens": 0})).unwrap();
        s.update(
            MessagesUsage::of(&serde_json::json!({"input_tokens": 9, "output_tokens": 4,
                "cache_creation_input_tokens": 2}))
            .unwrap(),
        );
        assert_eq!((s.usage().prompt, s.usage().completion), (11, 4));
        assert!(of_answer(b"{}").is_none());
        assert!(of_answer(b"[1]").is_none());
    }
}
