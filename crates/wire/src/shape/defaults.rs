//! Per-alias defaults (set when the client sent none, member by member) and the output cap.

use serde_json::{Map, Value};

use super::body::Members;
use super::Form;
use crate::error::ProxyError;

/// Members that make up the request itself: never defaulted, never stripped (a stripped
/// `images` would be the silent drop the shaping exists to prevent).
const REQUEST: &[&str] = &["model", "messages", "input", "prompt", "stream", "images"];

/// Whether requests of `api` have a field named `key`: one it lists as its own, or one no
/// registered API lists (a field every shaped API takes).
pub fn has_field(api: &Form, key: &str) -> bool {
    api.own.contains(&key)
        || !crate::APIS
            .iter()
            .filter_map(|a| a.spec().shaping)
            .any(|f| f.own.contains(&key))
}

/// Whether `key` is part of the request itself (`model`, `messages`, `input`, `prompt`,
/// `stream`, `images`) rather than a setting.
pub fn is_request_field(key: &str) -> bool {
    REQUEST.contains(&key)
}

/// Set each default the request lacks (absent or `null`); fill in the members an object
/// default has and the client's object lacks. Whether anything changed.
pub(super) fn apply(
    members: &mut Members<'_>,
    defaults: &Map<String, Value>,
    api: &Form,
) -> Result<bool, ProxyError> {
    let mut changed = false;
    for (key, default) in defaults.iter().filter(|(k, _)| has_field(api, k)) {
        let merged = match members.get(key) {
            None | Some(b"null") => Some(default.clone()),
            Some(sent) if default.is_object() && sent.first() == Some(&b'{') => {
                let mut sent: Value = serde_json::from_slice(sent)
                    .map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
                fill(&mut sent, default).then_some(sent)
            }
            Some(_) => None,
        };
        if let Some(v) = merged {
            members.set(key, serde_json::to_vec(&v).unwrap_or_default());
            changed = true;
        }
    }
    Ok(changed)
}

/// Add the members of `default` that `sent` lacks (or has as `null`), at any depth.
fn fill(sent: &mut Value, default: &Value) -> bool {
    let (Value::Object(sent), Value::Object(default)) = (sent, default) else {
        return false;
    };
    let mut changed = false;
    for (key, d) in default {
        match sent.get_mut(key) {
            None | Some(Value::Null) => {
                sent.insert(key.clone(), d.clone());
                changed = true;
            }
            Some(s) => changed |= fill(s, d),
        }
    }
    changed
}

/// Lower every output limit in `limits` above `cap` to it; set `sets` to `cap` when none is
/// sent. A limit that is not a number is left for the guard or the backend to refuse.
pub(super) fn cap(members: &mut Members<'_>, cap: u32, limits: &[&str], sets: &str) -> bool {
    let mut changed = false;
    let mut sent = false;
    for key in limits {
        let Some(value) = members.get(key) else {
            continue;
        };
        match serde_json::from_slice::<Value>(value) {
            Ok(Value::Null) => {}
            Ok(Value::Number(n)) => {
                sent = true;
                let over = match n.as_u64() {
                    Some(u) => u > u64::from(cap),
                    None => n.as_f64().is_some_and(|f| f > f64::from(cap)),
                };
                if over {
                    members.set(key, cap.to_string().into_bytes());
                    changed = true;
                }
            }
            _ => sent = true,
        }
    }
    if !sent {
        members.set(sets, cap.to_string().into_bytes());
        changed = true;
    }
    changed
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nested_defaults_fill_only_what_is_missing() {
        let mut sent = serde_json::json!({"a": {"x": 1, "y": null}, "b": 2});
        let default =
            serde_json::json!({"a": {"x": 9, "y": 3, "z": {"q": 1}}, "b": {"c": 1}, "c": 4});
        assert!(fill(&mut sent, &default));
        assert_eq!(
            sent,
            serde_json::json!({"a": {"x": 1, "y": 3, "z": {"q": 1}}, "b": 2, "c": 4})
        );
        assert!(!fill(&mut sent, &default));
    }
}
