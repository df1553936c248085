//! Which replica takes a request: the one its conversation is on while that one can take it,
//! else the least loaded usable one (most free slots, then fewest requests; ties in turn).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use prometheus_client::encoding::EncodeLabelValue;
use serde::Deserialize;
use serde_json::value::RawValue;

/// A client's own conversation id; without it the key comes from the leading messages.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("x-switchboard-session");

/// Conversations remembered (the oldest are forgotten first).
const REMEMBERED: usize = 16 * 1024;

/// How a replica is loaded now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Slots free.
    pub free: u32,
    /// Requests holding a slot or waiting for one.
    pub load: u32,
}

/// The best of `n` replicas by their `load` (`None`: unusable), ties broken in turn from
/// `turn`: the one with the most free slots, then the fewest requests.
pub fn least_loaded(
    n: usize,
    turn: usize,
    mut load: impl FnMut(usize) -> Option<Load>,
) -> Option<usize> {
    let mut best: Option<(usize, Load)> = None;
    for k in 0..n {
        let i = (turn + k) % n;
        let Some(l) = load(i) else { continue };
        let better = match best {
            None => true,
            Some((_, b)) => l.free > b.free || (l.free == b.free && l.load < b.load),
        };
        if better {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i)
}

/// What a conversation's request found.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AffinityResult {
    /// It went to the replica its conversation is on.
    hit,
    /// That replica was full or unusable: it went to another, and the conversation moved.
    moved,
    /// A conversation not seen before (or forgotten).
    new,
}

/// Conversation key → the backend it is on. Shared by every snapshot, so it survives reloads;
/// an entry naming a backend that is gone is a miss.
#[derive(Debug)]
pub struct Affinity {
    on: quick_cache::sync::Cache<u64, Arc<str>>,
}

impl Default for Affinity {
    fn default() -> Self {
        Affinity {
            on: quick_cache::sync::Cache::new(REMEMBERED),
        }
    }
}

impl Affinity {
    /// The backend conversation `key` is on.
    pub fn get(&self, key: u64) -> Option<Arc<str>> {
        self.on.get(&key)
    }

    /// Conversation `key` is now on `backend`.
    pub fn set(&self, key: u64, backend: &str) {
        self.on.insert(key, Arc::from(backend));
    }
}

#[derive(Deserialize)]
struct Leading<'a> {
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<Vec<&'a RawValue>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Role<'a> {
    #[serde(borrow, default)]
    role: Option<std::borrow::Cow<'a, str>>,
}

/// The conversation key of a request for `alias`: its session header, else its leading
/// messages (system prompt and messages up to the first user message, which every later turn
/// repeats). `None` when the body has neither.
pub fn conversation_key(alias: &str, headers: &HeaderMap, body: &[u8]) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    alias.hash(&mut h);
    if let Some(session) = headers.get(SESSION_HEADER) {
        b"session".hash(&mut h);
        session.as_bytes().hash(&mut h);
        return Some(h.finish());
    }
    let lead: Leading<'_> = serde_json::from_slice(body).ok()?;
    if let Some(system) = lead.system {
        system.get().hash(&mut h);
    }
    let items = match (lead.messages, lead.input) {
        (Some(m), _) => m,
        (None, Some(input)) => match serde_json::from_str::<Vec<&RawValue>>(input.get()) {
            Ok(items) => items,
            // A plain string input is the whole conversation's start.
            Err(_) => vec![input],
        },
        (None, None) => return None,
    };
    if items.is_empty() {
        return None;
    }
    for item in items {
        item.get().hash(&mut h);
        let role: Option<Role<'_>> = serde_json::from_str(item.get()).ok();
        if role.and_then(|r| r.role).as_deref() == Some("user") {
            break;
        }
    }
    Some(h.finish())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn most_free_slots_then_fewest_requests_then_in_turn() {
        let loads = [
            Some(Load { free: 1, load: 3 }),
            Some(Load { free: 2, load: 2 }),
            None,
            Some(Load { free: 2, load: 1 }),
        ];
        assert_eq!(least_loaded(4, 0, |i| loads[i]), Some(3));
        let even = [Some(Load { free: 2, load: 0 }); 3];
        let picks: Vec<_> = (0..4)
            .map(|t| least_loaded(3, t, |i| even[i]).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        assert_eq!(least_loaded(2, 0, |_| None), None);
    }

    #[test]
    fn a_conversation_keeps_its_key_as_it_grows() {
        let h = HeaderMap::new();
        let turn1 = br#"{"model":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"one"}]}"#;
        let turn2 = br#"{"model":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"one"},{"role":"assistant","content":"x"},{"role":"user","content":"two"}]}"#;
        let other = br#"{"model":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"uno"}]}"#;
        let k1 = conversation_key("a", &h, turn1).unwrap();
        assert_eq!(conversation_key("a", &h, turn2), Some(k1));
        assert_ne!(conversation_key("a", &h, other), Some(k1));
        assert_ne!(conversation_key("b", &h, turn1), Some(k1));
        let mut with = HeaderMap::new();
        with.insert(SESSION_HEADER, http::HeaderValue::from_static("s1"));
        let s = conversation_key("a", &with, turn1).unwrap();
        assert_eq!(conversation_key("a", &with, other), Some(s));
        assert_eq!(conversation_key("a", &h, br#"{"model":"a"}"#), None);
        let input = br#"{"model":"a","input":"hello"}"#;
        assert!(conversation_key("a", &h, input).is_some());
    }
}
