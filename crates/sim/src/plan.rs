//! Reading a generation request: validation, budget and the token plan it implies.

use std::fmt::Write as _;

use serde_json::Value;

use super::config::SimConfig;
use super::frame::{Dialect, Failure, Field, Kind};
use super::gpu::CacheUse;
use super::tokenize::{count_prompt_tokens, prompt_ids, thinking_enabled, PromptIds};
use switchboard_wire::flavor::Flavor;

/// What the simulator needs from a chat or completion request.
#[derive(Debug, Clone)]
pub(crate) struct GenRequest {
    pub(crate) kind: Kind,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) prompt_tokens: u32,
    pub(crate) thinking: bool,
    /// llama.cpp's `id_slot`, as sent.
    pub(crate) id_slot: Option<i64>,
    /// What it says of the prompt cache (`cache_prompt`, `cache_salt`).
    pub(crate) cache: CacheUse,
    /// The prompt's token ids (GPU mode only).
    pub(crate) prompt: Option<PromptIds>,
}

/// Parses and validates a body; the prompt is counted with the simulator's tokenizer (and
/// tokenized when `gpu`).
pub(crate) fn parse(
    gpu: bool,
    flavor: Flavor,
    dialect: &dyn Dialect,
    kind: Kind,
    raw: &[u8],
) -> Result<GenRequest, Failure> {
    let body: Value = serde_json::from_slice(raw).map_err(|e| Failure::Json {
        line: e.line(),
        column: e.column(),
        detail: e.to_string(),
    })?;
    if !body.is_object() {
        return Err(Failure::Invalid(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    match kind {
        Kind::Chat => match body.get("messages") {
            None | Some(Value::Null) => return Err(Failure::Missing("messages")),
            Some(Value::Array(_)) => {}
            Some(_) => return Err(Failure::Invalid("'messages' must be an array".to_owned())),
        },
        Kind::Text => match body.get("prompt") {
            None | Some(Value::Null) => return Err(Failure::Missing("prompt")),
            Some(Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(Failure::Invalid(
                    "'prompt' must be a string or an array".to_owned(),
                ))
            }
        },
    }
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let keys: &[&str] = if flavor == Flavor::Llamacpp {
        &["max_completion_tokens", "max_tokens", "n_predict"]
    } else {
        &["max_completion_tokens", "max_tokens"]
    };
    let max_tokens = keys
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_i64))
        .and_then(|n| {
            // llama.cpp's -1 means "no limit"
            u32::try_from(n).ok()
        });
    Ok(GenRequest {
        kind,
        stream,
        include_usage: stream && dialect.include_usage(body.get("stream_options")),
        max_tokens,
        prompt_tokens: count_prompt_tokens(flavor, &body),
        thinking: thinking_enabled(&body),
        id_slot: body.get("id_slot").and_then(Value::as_i64),
        cache: CacheUse::of(&body),
        prompt: gpu.then(|| prompt_ids(&body)),
    })
}

/// The tokens one generation will produce.
///
/// Reasoning tokens read `think0 `, `think1 `…, content tokens `word0 `, `word1 `…; with
/// think tags in content the reasoning is wrapped in two more tokens `<think>` and
/// `</think>` and everything goes to `content`. The budget (`max_tokens`, else
/// `completion_tokens`, never past the window) cuts the sequence wherever it falls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) prompt: u32,
    pub(crate) tokens: u32,
    think: u32,
    tagged: bool,
    pub(crate) finish: &'static str,
}

impl Plan {
    pub(crate) fn new(
        cfg: &SimConfig,
        dialect: &dyn Dialect,
        req: &GenRequest,
    ) -> Result<Self, Failure> {
        let window = cfg.slot_ctx;
        if dialect.overflows(req.prompt_tokens, req.max_tokens, window) {
            return Err(Failure::Overflow {
                prompt: req.prompt_tokens,
                max_tokens: req.max_tokens,
                window,
            });
        }
        let room = window.saturating_sub(req.prompt_tokens);
        let (wanted, finish) = match req.max_tokens {
            Some(n) => (n, "length"),
            None => (cfg.completion_tokens, "stop"),
        };
        let (tokens, finish) = if wanted > room {
            (room, "length")
        } else {
            (wanted, finish)
        };
        let reasoning = cfg.reasoning && req.thinking && req.kind == Kind::Chat;
        Ok(Self {
            prompt: req.prompt_tokens,
            tokens,
            think: if reasoning { cfg.reasoning_tokens } else { 0 },
            tagged: cfg.think_tags_in_content,
            finish,
        })
    }

    /// Appends token `i`'s text to `out` and says where it goes.
    pub(crate) fn write_token(&self, i: u32, out: &mut String) -> Field {
        let r = self.think;
        if !self.tagged || r == 0 {
            if i < r {
                let _ = write!(out, "think{i} ");
                return Field::Reasoning;
            }
            let _ = write!(out, "word{} ", i - r);
        } else if i == 0 {
            out.push_str("<think>");
        } else if i <= r {
            let _ = write!(out, "think{} ", i - 1);
        } else if i == r + 1 {
            out.push_str("</think>");
        } else {
            let _ = write!(out, "word{} ", i - r - 2);
        }
        Field::Content
    }

    /// Tokens that go to the reasoning field.
    pub(crate) fn reasoning_tokens(&self) -> u32 {
        if self.tagged {
            0
        } else {
            self.think.min(self.tokens)
        }
    }

    /// The whole generation as (reasoning, content) text.
    pub(crate) fn texts(&self) -> (Option<String>, String) {
        let mut reasoning = String::new();
        let mut content = String::new();
        let mut token = String::new();
        for i in 0..self.tokens {
            token.clear();
            match self.write_token(i, &mut token) {
                Field::Reasoning => reasoning.push_str(&token),
                Field::Content => content.push_str(&token),
            }
        }
        ((!reasoning.is_empty()).then_some(reasoning), content)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::dialects::dialect;

    fn req(max_tokens: Option<u32>, prompt_tokens: u32) -> GenRequest {
        GenRequest {
            kind: Kind::Chat,
            stream: false,
            include_usage: false,
            max_tokens,
            prompt_tokens,
            thinking: true,
            id_slot: None,
            cache: CacheUse::default(),
            prompt: None,
        }
    }

    #[test]
    fn reasoning_comes_first_and_counts_toward_the_budget() {
        let cfg = SimConfig {
            reasoning: true,
            reasoning_tokens: 2,
            ..SimConfig::default()
        };
        let d = dialect(cfg.flavor);
        let plan = Plan::new(&cfg, d, &req(Some(4), 10)).expect("fits");
        assert_eq!(
            plan.texts(),
            (Some("think0 think1 ".to_owned()), "word0 word1 ".to_owned())
        );
        assert_eq!(
            (plan.tokens, plan.reasoning_tokens(), plan.finish),
            (4, 2, "length")
        );
    }

    #[test]
    fn think_tags_are_tokens_in_content() {
        let cfg = SimConfig {
            reasoning: true,
            reasoning_tokens: 2,
            think_tags_in_content: true,
            completion_tokens: 5,
            ..SimConfig::default()
        };
        let plan = Plan::new(&cfg, dialect(cfg.flavor), &req(None, 10)).expect("fits");
        assert_eq!(
            plan.texts(),
            (None, "<think>think0 think1 </think>word0 ".to_owned())
        );
        assert_eq!((plan.reasoning_tokens(), plan.finish), (0, "stop"));
    }

    #[test]
    fn llamacpp_stops_at_the_window_and_refuses_a_full_prompt() {
        let cfg = SimConfig {
            slot_ctx: 100,
            ..SimConfig::default()
        };
        let d = dialect(Flavor::Llamacpp);
        let plan = Plan::new(&cfg, d, &req(Some(50), 90)).expect("prompt fits");
        assert_eq!((plan.tokens, plan.finish), (10, "length"));
        assert!(Plan::new(&cfg, d, &req(None, 100)).is_err());
    }

    #[test]
    fn vllm_and_sglang_check_prompt_plus_max_tokens() {
        let cfg = SimConfig {
            slot_ctx: 100,
            ..SimConfig::default()
        };
        assert!(Plan::new(&cfg, dialect(Flavor::Vllm), &req(Some(10), 90)).is_ok());
        assert!(Plan::new(&cfg, dialect(Flavor::Vllm), &req(Some(11), 90)).is_err());
        assert!(Plan::new(&cfg, dialect(Flavor::Sglang), &req(Some(10), 90)).is_err());
        assert!(Plan::new(&cfg, dialect(Flavor::Sglang), &req(Some(9), 90)).is_ok());
    }
}
