//! Reasoning field names: what clients receive, what backends read, and the rewrite of one message.

use std::str::FromStr;

use serde::Deserialize;
use serde_json::{Map, Value};

pub(crate) const REASONING_CONTENT: &str = "reasoning_content";
pub(crate) const REASONING: &str = "reasoning";
pub(crate) const CONTENT: &str = "content";

/// The field clients read reasoning from (`server.reasoning_field`, per alias, or the
/// `X-Reasoning-Field` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputField {
    #[default]
    ReasoningContent,
    Reasoning,
    /// The same text under both names.
    Both,
}

impl OutputField {
    /// The config and header spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OutputField::ReasoningContent => REASONING_CONTENT,
            OutputField::Reasoning => REASONING,
            OutputField::Both => "both",
        }
    }

    /// The keys written, in the order they are written.
    pub(crate) fn names(self) -> &'static [&'static str] {
        match self {
            OutputField::ReasoningContent => &[REASONING_CONTENT],
            OutputField::Reasoning => &[REASONING],
            OutputField::Both => &[REASONING_CONTENT, REASONING],
        }
    }
}

/// A reasoning field name that is not one of the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reasoning field {0:?} (expected reasoning_content, reasoning or both)")]
pub struct UnknownOutputField(pub(crate) String);

impl FromStr for OutputField {
    type Err = UnknownOutputField;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        [
            OutputField::ReasoningContent,
            OutputField::Reasoning,
            OutputField::Both,
        ]
        .into_iter()
        .find(|f| f.as_str().eq_ignore_ascii_case(name))
        .ok_or_else(|| UnknownOutputField(s.to_owned()))
    }
}

impl std::fmt::Display for OutputField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The field a backend reads reasoning from in the request history: its runtime's
/// ([`crate::runtime::Runtime::reasoning_field`]).
pub use crate::runtime::InputField;

/// Reasoning and content split out of one message's (or delta's) text by the tag splitter.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Pieces {
    pub(crate) reasoning: String,
    pub(crate) content: String,
}

/// Rewrites one message or stream delta in place so its reasoning sits under `output`.
///
/// `split` is the splitter's result for this object's `content`, when tags are configured:
/// its content replaces the original, its reasoning follows the backend's own. When the
/// split leaves no content, a string `content` is removed (`keep_empty_content` false, for
/// deltas) or set to `""` (true, for whole messages). Reasoning keys whose value is null
/// carry no reasoning and are left alone unless reasoning is written. Returns whether
/// anything changed; an unchanged object keeps its key order.
pub(crate) fn normalize(
    obj: &mut Map<String, Value>,
    output: OutputField,
    split: Option<Pieces>,
    keep_empty_content: bool,
) -> bool {
    let rc = obj.get(REASONING_CONTENT);
    let r = obj.get(REASONING);
    if [rc, r]
        .iter()
        .flatten()
        .any(|v| !v.is_null() && !v.is_string())
    {
        // Not a shape any backend writes: leave the reasoning keys as they are.
        return split.is_some_and(|p| replace_content(obj, p, keep_empty_content, output));
    }
    let backend = match (rc.and_then(Value::as_str), r.and_then(Value::as_str)) {
        (Some(a), Some(b)) if a == b => Some(a.to_owned()),
        (Some(a), Some(b)) => Some(format!("{a}{b}")),
        (Some(a), None) | (None, Some(a)) => Some(a.to_owned()),
        (None, None) => None,
    };
    let (split_reasoning, new_content) = match split {
        Some(p) => (p.reasoning, Some(p.content)),
        None => (String::new(), None),
    };
    let reasoning = match backend {
        Some(mut text) => {
            text.push_str(&split_reasoning);
            Some(text)
        }
        None if !split_reasoning.is_empty() => Some(split_reasoning),
        None => None,
    };
    let content_plan = new_content.map(|c| plan_content(obj.get(CONTENT), c, keep_empty_content));
    let reasoning_done = match &reasoning {
        None => true,
        Some(text) => [REASONING_CONTENT, REASONING].iter().all(|name| {
            let value = obj.get(*name).and_then(Value::as_str);
            if output.names().contains(name) {
                value == Some(text.as_str())
            } else {
                value.is_none()
            }
        }),
    };
    let content_done = matches!(content_plan, None | Some(ContentPlan::Keep));
    if reasoning_done && content_done {
        return false;
    }
    rebuild(
        obj,
        output,
        reasoning.filter(|_| !reasoning_done),
        content_plan,
    );
    true
}

enum ContentPlan {
    Keep,
    Set(String),
    Remove,
}

fn plan_content(old: Option<&Value>, new: String, keep_empty: bool) -> ContentPlan {
    match old {
        Some(Value::String(s)) if *s == new => ContentPlan::Keep,
        Some(Value::String(_)) if new.is_empty() && !keep_empty => ContentPlan::Remove,
        Some(Value::String(_)) => ContentPlan::Set(new),
        _ if new.is_empty() => ContentPlan::Keep,
        _ => ContentPlan::Set(new),
    }
}

/// Content-only rewrite for objects whose reasoning keys are left alone.
fn replace_content(
    obj: &mut Map<String, Value>,
    split: Pieces,
    keep_empty: bool,
    output: OutputField,
) -> bool {
    let plan = plan_content(obj.get(CONTENT), split.content, keep_empty);
    let reasoning = Some(split.reasoning).filter(|r| !r.is_empty());
    if matches!(plan, ContentPlan::Keep) && reasoning.is_none() {
        return false;
    }
    rebuild(obj, output, reasoning, Some(plan));
    true
}

/// Rebuilds `obj` with `reasoning` (when given) under the output names at the place of the
/// first reasoning key, else just before `content`, else last; and the planned content at
/// its own place, else last. Without `reasoning`, reasoning keys stay as they are.
fn rebuild(
    obj: &mut Map<String, Value>,
    output: OutputField,
    reasoning: Option<String>,
    content: Option<ContentPlan>,
) {
    let at_key = obj.contains_key(REASONING_CONTENT) || obj.contains_key(REASONING);
    let old = std::mem::take(obj);
    let write = reasoning.is_some();
    let mut reasoning = reasoning;
    let mut content = content;
    let put_reasoning = |obj: &mut Map<String, Value>, r: &mut Option<String>| {
        if let Some(text) = r.take() {
            for name in output.names() {
                obj.insert((*name).to_owned(), Value::String(text.clone()));
            }
        }
    };
    for (key, value) in old {
        match key.as_str() {
            REASONING | REASONING_CONTENT if write => put_reasoning(obj, &mut reasoning),
            CONTENT => {
                if !at_key {
                    put_reasoning(obj, &mut reasoning);
                }
                match content.take() {
                    Some(ContentPlan::Set(text)) => {
                        obj.insert(key, Value::String(text));
                    }
                    Some(ContentPlan::Remove) => {}
                    Some(ContentPlan::Keep) | None => {
                        obj.insert(key, value);
                    }
                }
            }
            _ => {
                obj.insert(key, value);
            }
        }
    }
    put_reasoning(obj, &mut reasoning);
    if let Some(ContentPlan::Set(text)) = content {
        obj.insert(CONTENT.to_owned(), Value::String(text));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn keys(m: &Map<String, Value>) -> Vec<&str> {
        m.keys().map(String::as_str).collect()
    }

    #[test]
    fn output_field_names() {
        assert_eq!(OutputField::default(), OutputField::ReasoningContent);
        for f in [
            OutputField::ReasoningContent,
            OutputField::Reasoning,
            OutputField::Both,
        ] {
            assert_eq!(f.as_str().parse::<OutputField>(), Ok(f));
            let quoted = format!("{:?}", f.as_str());
            assert_eq!(serde_json::from_str::<OutputField>(&quoted).unwrap(), f);
        }
        assert_eq!(" Both ".parse::<OutputField>(), Ok(OutputField::Both));
        let err = "thinking".parse::<OutputField>().unwrap_err();
        assert!(err.to_string().contains("\"thinking\""));
        assert!(serde_json::from_str::<OutputField>("\"thinking\"").is_err());
    }

    #[test]
    fn rename_keeps_position_and_other_keys() {
        let mut m = obj(json!({"role": "assistant", "reasoning": "r", "content": "c", "x": 1}));
        assert!(normalize(
            &mut m,
            OutputField::ReasoningContent,
            None,
            false
        ));
        assert_eq!(
            Value::Object(m.clone()),
            json!({"role": "assistant", "reasoning_content": "r", "content": "c", "x": 1})
        );
        assert_eq!(keys(&m), ["role", "reasoning_content", "content", "x"]);
        assert!(!normalize(
            &mut m,
            OutputField::ReasoningContent,
            None,
            false
        ));
    }

    #[test]
    fn both_names_from_the_backend_are_not_duplicated() {
        let mut m = obj(json!({"reasoning": "r", "reasoning_content": "r"}));
        assert!(!normalize(&mut m, OutputField::Both, None, false));
        assert!(normalize(&mut m, OutputField::Reasoning, None, false));
        assert_eq!(Value::Object(m), json!({"reasoning": "r"}));
        let mut m = obj(json!({"reasoning_content": "r", "content": null}));
        assert!(normalize(&mut m, OutputField::Both, None, false));
        assert_eq!(keys(&m), ["reasoning_content", "reasoning", "content"]);
        assert_eq!(m["reasoning"], m["reasoning_content"]);
    }

    #[test]
    fn null_and_empty_reasoning() {
        let mut m = obj(json!({"content": "c", "reasoning": null}));
        assert!(!normalize(
            &mut m,
            OutputField::ReasoningContent,
            None,
            false
        ));
        let mut m = obj(json!({"reasoning": "", "content": "c"}));
        assert!(normalize(
            &mut m,
            OutputField::ReasoningContent,
            None,
            false
        ));
        assert_eq!(
            Value::Object(m),
            json!({"reasoning_content": "", "content": "c"})
        );
    }

    #[test]
    fn split_content_and_reasoning() {
        let split = |r: &str, c: &str| {
            Some(Pieces {
                reasoning: r.into(),
                content: c.into(),
            })
        };
        // Everything became reasoning: the delta loses `content`, a message keeps `""`.
        let mut m = obj(json!({"content": "<think>r"}));
        assert!(normalize(
            &mut m,
            OutputField::ReasoningContent,
            split("r", ""),
            false
        ));
        assert_eq!(Value::Object(m), json!({"reasoning_content": "r"}));
        let mut m = obj(json!({"role": "assistant", "content": "<think>r</think>"}));
        assert!(normalize(
            &mut m,
            OutputField::Reasoning,
            split("r", ""),
            true
        ));
        assert_eq!(
            Value::Object(m),
            json!({"role": "assistant", "reasoning": "r", "content": ""})
        );
        // Backend reasoning comes first, split reasoning after it.
        let mut m = obj(json!({"content": "b</think>c", "reasoning_content": "a"}));
        assert!(normalize(
            &mut m,
            OutputField::ReasoningContent,
            split("b", "c"),
            false
        ));
        assert_eq!(
            Value::Object(m),
            json!({"reasoning_content": "ab", "content": "c"})
        );
        // A null content stays as it was when the split has nothing.
        let mut m = obj(json!({"role": "assistant", "content": null}));
        assert!(!normalize(
            &mut m,
            OutputField::ReasoningContent,
            split("", ""),
            false
        ));
        // Held text released into an event without content.
        let mut m = obj(json!({"tool_calls": []}));
        assert!(normalize(
            &mut m,
            OutputField::ReasoningContent,
            split("", "<"),
            false
        ));
        assert_eq!(Value::Object(m), json!({"tool_calls": [], "content": "<"}));
    }
}
