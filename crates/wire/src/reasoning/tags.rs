//! Inline think-tag configuration: the tag pair of a model family, presets and the raw config value.

use serde::Deserialize;

/// The markers a model writes around its reasoning when the backend leaves it in `content`.
///
/// `starts_open` is for templates that force-open the reasoning block in the prompt
/// (Qwen3 thinking models): the output then carries only `close`, and everything before it
/// is reasoning. In that mode an `open` tag seen before the first `close` is consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkTags {
    pub open: String,
    pub close: String,
    pub starts_open: bool,
}

/// Preset names accepted by [`ThinkTags::preset`], in the order error messages list them.
pub const PRESETS: &[&str] = &["qwen3", "deepseek", "gemma4", "gpt-oss"];

/// gpt-oss (harmony): the analysis channel is the reasoning.
const GPT_OSS_OPEN: &str = "<|channel|>analysis<|message|>";
/// gpt-oss: the analysis message ends with `<|end|>` and the answer follows in a new
/// assistant message on the final channel. The close tag spans both, so the final-channel
/// header is consumed as markup and `content` holds exactly the final answer. Output that
/// leaves the analysis channel for another one (`commentary` tool calls) has no such header
/// and stays reasoning: tool calls with gpt-oss need the backend's own parser anyway.
const GPT_OSS_CLOSE: &str = "<|end|><|start|>assistant<|channel|>final<|message|>";

impl ThinkTags {
    /// Tags of a model family: `qwen3` and `deepseek` (`<think>`…`</think>`), `gemma4`
    /// (`<|channel>thought`…`<channel|>`), `gpt-oss` (analysis channel up to the final
    /// channel's header). Presets start closed; see [`ThinkTagsSpec::resolve`].
    pub fn preset(name: &str) -> Option<ThinkTags> {
        let (open, close) = match name {
            "qwen3" | "deepseek" => ("<think>", "</think>"),
            "gemma4" => ("<|channel>thought", "<channel|>"),
            "gpt-oss" => (GPT_OSS_OPEN, GPT_OSS_CLOSE),
            _ => return None,
        };
        Some(ThinkTags {
            open: open.to_owned(),
            close: close.to_owned(),
            starts_open: false,
        })
    }
}

/// A `think_tags` value that names no tags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadThinkTags {
    #[error("unknown think_tags preset {0:?} (known: {known})", known = PRESETS.join(", "))]
    UnknownPreset(String),
    #[error("think_tags must not be empty (open {open:?}, close {close:?})")]
    Empty { open: String, close: String },
}

/// The raw `think_tags` config value: a preset name or an `[open, close]` pair.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ThinkTagsSpec {
    Preset(String),
    Pair([String; 2]),
}

impl ThinkTagsSpec {
    /// Turns the config value into tags; `starts_open` comes from its own config key.
    pub fn resolve(&self, starts_open: bool) -> Result<ThinkTags, BadThinkTags> {
        let mut tags = match self {
            ThinkTagsSpec::Preset(name) => {
                ThinkTags::preset(name).ok_or_else(|| BadThinkTags::UnknownPreset(name.clone()))?
            }
            ThinkTagsSpec::Pair([open, close]) => ThinkTags {
                open: open.clone(),
                close: close.clone(),
                starts_open: false,
            },
        };
        if tags.open.is_empty() || tags.close.is_empty() {
            return Err(BadThinkTags::Empty {
                open: tags.open,
                close: tags.close,
            });
        }
        tags.starts_open = starts_open;
        Ok(tags)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(toml_value: &str) -> ThinkTagsSpec {
        serde_json::from_str(toml_value).unwrap()
    }

    #[test]
    fn presets_resolve() {
        for name in PRESETS {
            let tags = spec(&format!("{name:?}")).resolve(false).unwrap();
            assert!(!tags.open.is_empty() && !tags.close.is_empty(), "{name}");
        }
        let qwen = spec("\"qwen3\"").resolve(true).unwrap();
        assert_eq!(qwen.open, "<think>");
        assert_eq!(qwen.close, "</think>");
        assert!(qwen.starts_open);
        let gemma = ThinkTags::preset("gemma4").unwrap();
        assert_eq!(
            (gemma.open.as_str(), gemma.close.as_str()),
            ("<|channel>thought", "<channel|>")
        );
    }

    #[test]
    fn pair_resolves() {
        let tags = spec(r#"["<r>", "</r>"]"#).resolve(false).unwrap();
        assert_eq!(
            tags,
            ThinkTags {
                open: "<r>".into(),
                close: "</r>".into(),
                starts_open: false
            }
        );
    }

    #[test]
    fn unknown_preset_lists_known_ones() {
        let err = spec("\"qwen9\"").resolve(false).unwrap_err().to_string();
        assert!(err.contains("\"qwen9\""), "{err}");
        assert!(err.contains("qwen3, deepseek, gemma4, gpt-oss"), "{err}");
    }

    #[test]
    fn empty_tags_rejected() {
        assert!(spec(r#"["", "</r>"]"#).resolve(false).is_err());
        assert!(spec(r#"["<r>", ""]"#).resolve(true).is_err());
    }
}
