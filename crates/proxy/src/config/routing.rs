//! How aliases route: their replicas (`backend` or `backends`), their `fallbacks` (defined,
//! no cycle) and their `context_fallback` (a larger window).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::aliases::{Alias, RawAlias};
use super::backends::Backend;
use super::error::ConfigError;
use super::sizing::Sizing;

/// Each of `fallbacks` names another alias, and following them never comes back.
pub(crate) fn fallbacks(aliases: &BTreeMap<String, Arc<Alias>>, errs: &mut Vec<ConfigError>) {
    for a in aliases.values() {
        for (i, fb) in a.fallbacks.iter().enumerate() {
            let reason = if fb == &a.name {
                "is the alias itself"
            } else if !aliases.contains_key(fb) {
                "is not a defined alias"
            } else if a.fallbacks[..i].contains(fb) {
                "is named twice"
            } else {
                continue;
            };
            errs.push(ConfigError::BadValue {
                key: format!("aliases.{}.fallbacks[{i}]", a.name),
                value: fb.clone(),
                reason: reason.into(),
            });
        }
    }
    // A cycle: depth-first from every alias, over the fallbacks that exist.
    let mut reported: Vec<String> = Vec::new();
    for start in aliases.keys() {
        let mut path = vec![start.clone()];
        if let Some(cycle) = cycle_from(aliases, &mut path) {
            // The same cycle found from each of its aliases is reported once.
            let mut key: Vec<String> = cycle[..cycle.len() - 1].to_vec();
            key.sort();
            let key = key.join(",");
            if !reported.contains(&key) {
                reported.push(key);
                errs.push(ConfigError::BadValue {
                    key: format!("aliases.{}.fallbacks", cycle[0]),
                    value: cycle.join(" -> "),
                    reason: "is a cycle".into(),
                });
            }
        }
    }
}

/// A path of fallbacks from the last alias of `path` that comes back to an alias on it.
fn cycle_from(
    aliases: &BTreeMap<String, Arc<Alias>>,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    let last = path.last().and_then(|n| aliases.get(n))?;
    for fb in &last.fallbacks {
        if fb == &last.name || !aliases.contains_key(fb) {
            continue;
        }
        if let Some(at) = path.iter().position(|p| p == fb) {
            let mut cycle = path[at..].to_vec();
            cycle.push(fb.clone());
            return Some(cycle);
        }
        path.push(fb.clone());
        if let Some(c) = cycle_from(aliases, path) {
            return Some(c);
        }
        path.pop();
    }
    None
}

/// A context fallback must be another alias whose window is larger.
pub(crate) fn context_fallbacks(
    aliases: &BTreeMap<String, Arc<Alias>>,
    errs: &mut Vec<ConfigError>,
) {
    for a in aliases.values() {
        let Some(fb) = &a.context_fallback else {
            continue;
        };
        let key = format!("aliases.{}.context_fallback", a.name);
        // An "auto" window is known only once discovered: then the sizes are not compared here.
        let fixed = |a: &Alias| a.window_setting.and_then(Sizing::fixed);
        let reason = match (aliases.get(fb), a.window_setting) {
            (None, _) => Some("is not a defined alias".to_string()),
            (Some(_), _) if fb == &a.name => Some("is the alias itself".to_string()),
            (_, None) => Some("needs context_window on this alias".to_string()),
            (Some(f), Some(Sizing::Fixed(w))) if fixed(f).is_some_and(|fw| fw <= w) => Some(
                format!("has a window no larger than this alias's {w} tokens"),
            ),
            _ => None,
        };
        if let Some(reason) = reason {
            errs.push(ConfigError::BadValue {
                key,
                value: fb.clone(),
                reason,
            });
        }
    }
}

/// The backends of an alias: `backend = "x"` or `backends = ["a", "b"]`, exactly one, each
/// defined, none twice.
pub(crate) fn replicas(
    name: &str,
    raw: &RawAlias,
    backends: &BTreeMap<String, Arc<Backend>>,
    errs: &mut Vec<ConfigError>,
) -> Option<Vec<Arc<Backend>>> {
    let bad = |key: &str, value: &str, reason: &str| ConfigError::BadValue {
        key: format!("aliases.{name}.{key}"),
        value: value.into(),
        reason: reason.into(),
    };
    let names: Vec<(String, &String)> = match (&raw.backend, &raw.backends) {
        (Some(_), Some(_)) => {
            errs.push(bad(
                "backends",
                "set",
                "and backend are both set: use one of the two",
            ));
            return None;
        }
        (None, None) => {
            errs.push(bad("backend", "unset", "is needed (or backends = [...])"));
            return None;
        }
        (Some(b), None) => vec![("backend".to_string(), b)],
        (None, Some(list)) if list.is_empty() => {
            errs.push(bad("backends", "[]", "names no backend"));
            return None;
        }
        (None, Some(list)) => list
            .iter()
            .enumerate()
            .map(|(i, b)| (format!("backends[{i}]"), b))
            .collect(),
    };
    let mut out: Vec<Arc<Backend>> = Vec::with_capacity(names.len());
    let mut ok = true;
    for (key, b) in names {
        match backends.get(b) {
            None if key == "backend" => {
                errs.push(ConfigError::UnknownBackend {
                    alias: name.to_string(),
                    name: b.clone(),
                });
                ok = false;
            }
            None => {
                errs.push(bad(&key, b, "is not a defined backend"));
                ok = false;
            }
            Some(_) if out.iter().any(|o| &o.name == b) => {
                errs.push(bad(&key, b, "is named twice"));
                ok = false;
            }
            Some(found) => out.push(Arc::clone(found)),
        }
    }
    ok.then_some(out)
}
