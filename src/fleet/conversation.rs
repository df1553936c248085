//! A request's conversation, as every process reads it from the request alone: its key —
//! the id it carries (a harness's own header, its `prompt_cache_key`, Switchboard's
//! `x-switchboard-session`), else its leading messages — and whether it is a later turn.
//!
//! The key is XXH3-64 over length-prefixed pieces, fixed by its specification: every process,
//! build and platform computes the same.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};
use xxhash_rust::xxh3::xxh3_64;

use crate::json_walk;
use crate::wire::request::History;

/// A client's own conversation id; without it the key comes from the leading messages.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("x-switchboard-session");

/// The conversation ids harnesses send of their own accord, read in this order before
/// [`SESSION_HEADER`]: Claude Code's session, Codex CLI's thread (a sub-agent has a thread of
/// its own in its parent's session) and session.
pub static HARNESS_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-claude-code-session-id"),
    HeaderName::from_static("thread-id"),
    HeaderName::from_static("session-id"),
];

/// The conversation id a request carries, first found: a harness's own header
/// ([`HARNESS_HEADERS`]), the body's `prompt_cache_key` (`cache_key`: Responses and chat),
/// then [`SESSION_HEADER`]. With the id, the label it is hashed under (one per source, so the
/// same id from two sources is two conversations; [`SESSION_HEADER`]'s is `session`).
pub fn conversation_id<'a>(
    headers: &'a HeaderMap,
    cache_key: Option<&'a [u8]>,
) -> Option<(&'static str, &'a [u8])> {
    // One pass over the request's headers costs less than a hashed lookup of each name.
    let mut found: [Option<&[u8]>; 4] = [None; 4];
    let session = [&SESSION_HEADER];
    for (name, value) in headers {
        let mut named = HARNESS_HEADERS.iter().chain(session);
        if let Some(i) = named.position(|h| h == name) {
            found[i].get_or_insert(value.as_bytes());
        }
    }
    let harness = HARNESS_HEADERS
        .iter()
        .zip(found)
        .map(|(h, id)| (h.as_str(), id));
    let ids = harness.chain([("prompt_cache_key", cache_key), ("session", found[3])]);
    ids.filter_map(|(label, id)| Some((label, id?)))
        .find(|(_, id)| !id.is_empty())
}

/// A request's conversation, as every process reads it from the request alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conversation {
    /// What the order of its replicas is computed from.
    pub key: u64,
    /// Its history holds an answer of the model or a tool's result ([`Item::answers`]): a later
    /// turn, whose prefix its replica may hold cached. More user messages alone are not one.
    pub later: bool,
}

/// The conversation of a request for `alias`: its key from the id it carries
/// ([`conversation_id`]), else from its leading messages (system prompt and messages up to the
/// first user message, which every later turn repeats), and whether it is a later turn
/// ([`Item::answers`]). `None` when the request has neither.
/// The key is XXH3-64 over the pieces, each after its length (so no two different sequences
/// of pieces hash alike by their joins): the alias, then the id's label and the id, else the
/// system prompt (when there is one) and each leading item.
pub fn conversation_key(
    alias: &str,
    headers: &HeaderMap,
    body: &[u8],
    history: &History,
) -> Option<Conversation> {
    let [system, messages, input, cache_key] = history.members(body);
    let cache_key = cache_key.and_then(json_walk::string);
    let id = conversation_id(headers, cache_key.as_deref());
    let mut h = Pieces::new();
    h.piece(alias.as_bytes());
    match id {
        Some((label, id)) => {
            h.piece(label.as_bytes());
            h.piece(id);
        }
        None => system.into_iter().for_each(|s| h.piece(s)),
    }
    let mut led = false;
    let later = read_items(messages, input, |item| {
        led = true;
        if id.is_none() {
            h.piece(item);
        }
    });
    (id.is_some() || led).then(|| Conversation {
        key: h.digest(),
        later,
    })
}

/// Whether a request's items — its `messages` (chat, Messages), else its `input` items
/// (Responses; an input that is no array is one item, the whole conversation's start) — hold
/// an answer of the model or a tool's result; each leading item (up to and with the first
/// user message, all of them when none is a user's) given to `lead` in order. One walk, from
/// the start, that ends once both are known (a later turn's first answer follows its first
/// user message closely).
fn read_items<'a>(
    messages: Option<&'a [u8]>,
    input: Option<&'a [u8]>,
    mut lead: impl FnMut(&'a [u8]),
) -> bool {
    let items = match (messages, input) {
        (Some(m), _) => json_walk::elements(m),
        (None, Some(input)) => match json_walk::elements(input) {
            Some(items) => Some(items),
            None => {
                lead(input);
                return Item::of(input).answers();
            }
        },
        (None, None) => None,
    };
    let Some(mut items) = items else {
        return false;
    };
    let (mut leading, mut later) = (true, false);
    loop {
        let mut item = Item::default();
        let text = match plain_message(items.rest()) {
            Some((len, plain)) => {
                item = plain;
                items.read(len)
            }
            None => match items.next_object(|key, value| item.member(key, value)) {
                Some(text) => text,
                None => return later,
            },
        };
        if leading {
            lead(text);
            leading = item.role.as_deref() != Some(b"user");
        }
        later = later || item.answers();
        if later && !leading {
            return true;
        }
    }
}

/// A chat message as most clients write one, `{"role":"…","content":"…"}`: these two members
/// in this order, no whitespace, a role without escapes, string content. Its text's length
/// and the item it reads as (what [`Item::member`] reads of it); `None` for any other text,
/// which the walk reads. Under callgrind (`benches/load/instructions.sh`, a chat of two such
/// messages) the conversation cost some 2,200 instructions walked, 1,300 read here.
fn plain_message(text: &[u8]) -> Option<(usize, Item<'_>)> {
    let rest = text.strip_prefix(br#"{"role":""#)?;
    let q = json_walk::quote_or_escape(rest)?;
    let role = rest.get(..q).filter(|_| rest[q] == b'"')?;
    let after = rest[q + 1..].strip_prefix(br#","content":"#)?;
    let start = text.len() - after.len();
    if after.first() != Some(&b'"') {
        return None;
    }
    let end = json_walk::string_end(text, start);
    (text.get(end) == Some(&b'}')).then(|| {
        let item = Item {
            role: Some(Cow::Borrowed(role)),
            kind: None,
            content: Some(&text[start..end]),
        };
        (end + 1, item)
    })
}

/// One message or input item, as much as tells whose it is: the client's, the model's or a
/// tool's (a member that is not of its type, or an item that is no object, reads as unset;
/// the last of a name given twice counts, as in a full parse).
#[derive(Default)]
struct Item<'a> {
    role: Option<Cow<'a, [u8]>>,
    kind: Option<Cow<'a, [u8]>>,
    content: Option<&'a [u8]>,
}

impl<'a> Item<'a> {
    fn of(text: &'a [u8]) -> Item<'a> {
        let mut item = Item::default();
        for (key, value) in json_walk::members(text).into_iter().flatten() {
            item.member(key, value);
        }
        item
    }

    /// A member of the item, its key as written (with its quotes).
    fn member(&mut self, key: &'a [u8], value: &'a [u8]) {
        let unescaped;
        let name = match key {
            br#""role""# | br#""type""# | br#""content""# => &key[1..key.len() - 1],
            _ if key.contains(&b'\\') => match json_walk::string(key) {
                Some(k) => {
                    unescaped = k;
                    &*unescaped
                }
                None => return,
            },
            _ => return,
        };
        match name {
            b"role" => self.role = json_walk::string(value),
            b"type" => self.kind = json_walk::string(value),
            b"content" => self.content = Some(value).filter(|v| *v != b"null"),
            _ => {}
        }
    }

    /// Whether it is an answer of the model or a tool's result, what makes a later turn: a
    /// chat message of role `assistant`, `tool` (or the old `function`); an Anthropic
    /// `assistant` message or a `tool_result` block; a Responses item of role `assistant`, a
    /// `reasoning` item, or a call or its output (`function_call`, `function_call_output`,
    /// any `*_call` and `*_call_output`).
    fn answers(&self) -> bool {
        let kind = self.kind.as_deref().unwrap_or_default();
        matches!(
            self.role.as_deref(),
            Some(b"assistant" | b"tool" | b"function")
        ) || kind == b"reasoning"
            || kind.ends_with(b"_call")
            || kind.ends_with(b"_call_output")
            || self.content.is_some_and(holds_tool_result)
    }
}

/// Whether message content is a list of blocks with a `tool_result` among them.
fn holds_tool_result(content: &[u8]) -> bool {
    json_walk::elements(content).is_some_and(|mut blocks| {
        blocks.any(|b| {
            json_walk::member(b, "type")
                .and_then(json_walk::string)
                .as_deref()
                == Some(&b"tool_result"[..])
        })
    })
}

/// Length-prefixed pieces, hashed at once: the one-shot XXH3 of a few hundred bytes costs
/// less than a streaming hash fed piece by piece, and is the same hash.
struct Pieces(Vec<u8>);

impl Pieces {
    /// Room for the key of a short conversation's pieces without growing.
    fn new() -> Pieces {
        Pieces(Vec::with_capacity(256))
    }

    fn piece(&mut self, bytes: &[u8]) {
        self.0
            .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }

    fn digest(&self) -> u64 {
        xxh3_64(&self.0)
    }
}

/// [`conversation_key`] of a body read for it alone (the pipeline reads the body's history
/// in its one parse of the body).
pub fn conversation_of(alias: &str, headers: &HeaderMap, body: &[u8]) -> Option<Conversation> {
    conversation_key(alias, headers, body, &History::of(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(header: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(header.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        h
    }

    /// The conversation of `alias` keyed by the `id` the request carries (with its label),
    /// else by its `system` prompt and `leading` items, as the key's specification says;
    /// `None` when it has neither.
    fn keyed(
        alias: &str,
        id: Option<(&str, &[u8])>,
        system: Option<&str>,
        leading: Option<&[&str]>,
        later: bool,
    ) -> Option<Conversation> {
        let mut h = Pieces::new();
        h.piece(alias.as_bytes());
        if let Some((label, id)) = id {
            h.piece(label.as_bytes());
            h.piece(id);
        } else {
            let leading = leading.filter(|l| !l.is_empty())?;
            if let Some(system) = system {
                h.piece(system.as_bytes());
            }
            for item in leading {
                h.piece(item.as_bytes());
            }
        }
        Some(Conversation {
            key: h.digest(),
            later,
        })
    }

    #[test]
    fn each_harness_header_keys_its_conversation_whatever_the_body() {
        let names: Vec<&str> = HARNESS_HEADERS.iter().map(HeaderName::as_str).collect();
        assert_eq!(
            names,
            ["x-claude-code-session-id", "thread-id", "session-id"]
        );
        let a = br#"{"messages":[{"role":"user","content":"one"}]}"#;
        let b = br#"{"messages":[{"role":"user","content":"two"}]}"#;
        let bare = conversation_of("m", &HeaderMap::new(), a).unwrap().key;
        let mut keys = Vec::new();
        for name in names {
            let h = with(name, "3f1c");
            let key = conversation_of("m", &h, a).unwrap().key;
            assert_eq!(key, conversation_of("m", &h, b).unwrap().key, "{name}");
            assert_ne!(key, bare, "{name}");
            keys.push(key);
        }
        keys.dedup();
        assert_eq!(
            keys.len(),
            3,
            "the same id under two headers is two conversations"
        );
    }

    #[test]
    fn a_harness_id_goes_before_the_cache_key_and_that_before_the_session_header() {
        let body = br#"{"prompt_cache_key":"k1","input":"hello"}"#;
        let mut h = with("x-switchboard-session", "s1");
        let session = conversation_id(&h, None).unwrap();
        assert_eq!(session, ("session", &b"s1"[..]));
        assert_eq!(
            conversation_id(&h, Some(b"k1")),
            Some(("prompt_cache_key", &b"k1"[..]))
        );
        h.insert("thread-id", "t1".parse().unwrap());
        h.insert("session-id", "c1".parse().unwrap());
        assert_eq!(
            conversation_id(&h, Some(b"k1")),
            Some(("thread-id", &b"t1"[..]))
        );
        h.insert("x-claude-code-session-id", "".parse().unwrap());
        // An empty id is no id.
        assert_eq!(conversation_id(&h, Some(b"k1")).unwrap().0, "thread-id");
        let by_key = conversation_of("m", &HeaderMap::new(), body).unwrap();
        let other = br#"{"prompt_cache_key":"k1","input":"bye"}"#;
        assert_eq!(
            by_key,
            conversation_of("m", &HeaderMap::new(), other).unwrap()
        );
        let chat = br#"{"prompt_cache_key":"k1","messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(
            by_key.key,
            conversation_of("m", &HeaderMap::new(), chat).unwrap().key
        );
    }

    #[test]
    fn a_conversation_keeps_its_key_as_it_grows() {
        let h = HeaderMap::new();
        let turn1 = br#"{"model":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"one"}]}"#;
        let turn2 = br#"{"model":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"one"},{"role":"assistant","content":"x"},{"role":"user","content":"two"}]}"#;
        let other = br#"{"model":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"uno"}]}"#;
        let key = |h: &HeaderMap, body: &[u8]| conversation_of("a", h, body).map(|c| c.key);
        let k1 = key(&h, turn1).unwrap();
        assert_eq!(key(&h, turn2), Some(k1));
        assert_ne!(key(&h, other), Some(k1));
        assert_ne!(conversation_of("b", &h, turn1).map(|c| c.key), Some(k1));
        let mut with = HeaderMap::new();
        with.insert(SESSION_HEADER, http::HeaderValue::from_static("s1"));
        let s = key(&with, turn1).unwrap();
        assert_eq!(key(&with, other), Some(s));
        assert_eq!(key(&h, br#"{"model":"a"}"#), None);
        let input = br#"{"model":"a","input":"hello"}"#;
        assert!(key(&h, input).is_some());
    }

    #[test]
    fn a_turn_after_the_first_user_message_is_a_later_turn() {
        let h = HeaderMap::new();
        let later = |h: &HeaderMap, body: &[u8]| conversation_of("a", h, body).unwrap().later;
        let first =
            br#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"one"}]}"#;
        let second = br#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"one"},{"role":"assistant","content":"x"},{"role":"user","content":"two"}]}"#;
        assert!(!later(&h, first));
        assert!(later(&h, second));
        // Anthropic Messages: the system prompt apart; Responses: input items or a string.
        let messages = br#"{"system":"S","messages":[{"role":"user","content":"one"},{"role":"assistant","content":"x"},{"role":"user","content":"two"}]}"#;
        assert!(later(&h, messages));
        let items = br#"{"input":[{"role":"user","content":"one"},{"type":"function_call_output","call_id":"c","output":"ok"}]}"#;
        assert!(later(&h, items));
        assert!(!later(&h, br#"{"input":"hello"}"#));
        // A session header keys the conversation; its body still tells the turn.
        let mut with = HeaderMap::new();
        with.insert(SESSION_HEADER, http::HeaderValue::from_static("s1"));
        assert!(!later(&with, first));
        assert!(later(&with, second));
        assert!(!later(&with, b"{}"));
    }

    #[test]
    fn only_an_answer_of_the_model_or_a_tool_result_makes_a_later_turn() {
        let h = HeaderMap::new();
        let later = |body: &str| conversation_of("a", &h, body.as_bytes()).unwrap().later;
        let user = r#"{"role":"user","content":"u"}"#;
        let chat = |rest: &str| format!(r#"{{"messages":[{user}{rest}]}}"#);
        // More user messages, or a system one, are no answer.
        assert!(!later(&chat(&format!(",{user}"))));
        assert!(!later(&chat(&format!(",{user},{user}"))));
        assert!(!later(&chat(r#",{"role":"system","content":"s"}"#)));
        assert!(!later(&chat(
            r#",{"role":"user","content":[{"type":"text","text":"t"}]}"#
        )));
        // Chat: the model's answer, a tool's.
        assert!(later(&chat(
            r#",{"role":"assistant","content":"a"},{"role":"user","content":"v"}"#
        )));
        assert!(later(&chat(
            r#",{"role":"tool","tool_call_id":"c","content":"ok"}"#
        )));
        // Messages: a tool_result block in a user message.
        let result = r#",{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}"#;
        assert!(later(&chat(result)));
        // Responses items.
        let input = |rest: &str| format!(r#"{{"input":[{user}{rest}]}}"#);
        assert!(!later(&input(&format!(",{user}"))));
        assert!(!later(&input(
            r#",{"type":"message","role":"user","content":"v"}"#
        )));
        for item in [
            r#"{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}]}"#,
            r#"{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}"#,
            r#"{"type":"function_call_output","call_id":"c","output":"ok"}"#,
            r#"{"type":"reasoning","summary":[]}"#,
        ] {
            assert!(later(&input(&format!(",{item}"))), "{item}");
        }
        // With a session header the same.
        let mut with = HeaderMap::new();
        with.insert(SESSION_HEADER, http::HeaderValue::from_static("s1"));
        let two_users = chat(&format!(",{user}"));
        assert!(
            !conversation_of("a", &with, two_users.as_bytes())
                .unwrap()
                .later
        );
    }

    #[test]
    fn a_plain_message_is_read_whole_and_any_other_left_to_the_walk() {
        let text = br#"{"role":"user","content":"a\"}\\"},{"role":"tool"}"#;
        let (len, item) = plain_message(text).unwrap();
        assert_eq!(&text[..len], br#"{"role":"user","content":"a\"}\\"}"#);
        assert_eq!(item.role.as_deref(), Some(&b"user"[..]));
        assert_eq!(item.content, Some(&br#""a\"}\\""#[..]));
        for other in [
            r#"{"role":"us\u0065r","content":"a"}"#,
            r#"{"role":"user","content":"a" }"#,
            r#"{"role":"user","content":"a","role":"tool"}"#,
            r#"{"role":"user","content":["a"]}"#,
            r#"{"role":"user","content":null}"#,
            r#"{"content":"a","role":"user"}"#,
            r#"{ "role":"user","content":"a"}"#,
            r#"{"role":"user","content":"a"#,
        ] {
            assert!(plain_message(other.as_bytes()).is_none(), "{other}");
        }
    }

    /// The conversation of `body` as a full parse reads it: its members, messages and items
    /// parsed by serde_json (the last of a name given twice; a member not of its type unset).
    fn parsed(alias: &str, headers: &HeaderMap, body: &[u8]) -> Option<Conversation> {
        use serde_json::value::RawValue;
        use serde_json::Value;
        use std::collections::BTreeMap;
        let top: BTreeMap<String, &RawValue> = serde_json::from_slice(body).unwrap_or_default();
        let cache_key = top
            .get("prompt_cache_key")
            .and_then(|k| serde_json::from_str::<String>(k.get()).ok());
        let items: Option<Vec<&RawValue>> = match (top.get("messages"), top.get("input")) {
            (Some(m), _) => serde_json::from_str(m.get()).ok(),
            (None, Some(i)) => Some(serde_json::from_str(i.get()).unwrap_or_else(|_| vec![*i])),
            (None, None) => None,
        };
        let value = |r: &RawValue| serde_json::from_str::<Value>(r.get()).unwrap();
        let field = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let answers = |item: &Value| {
            let kind = field(item, "type").unwrap_or_default();
            let blocks = item.get("content").and_then(Value::as_array);
            matches!(
                field(item, "role").as_deref(),
                Some("assistant" | "tool" | "function")
            ) || kind == "reasoning"
                || kind.ends_with("_call")
                || kind.ends_with("_call_output")
                || blocks.is_some_and(|b| {
                    b.iter()
                        .any(|b| field(b, "type").as_deref() == Some("tool_result"))
                })
        };
        let later = items
            .as_ref()
            .is_some_and(|i| i.iter().any(|r| answers(&value(r))));
        let lead = items.as_ref().map(|items| {
            let first_user = items
                .iter()
                .position(|r| field(&value(r), "role").as_deref() == Some("user"));
            &items[..first_user.map_or(items.len(), |u| u + 1)]
        });
        let lead: Option<Vec<&str>> = lead.map(|l| l.iter().map(|r| r.get()).collect());
        let id = conversation_id(headers, cache_key.as_deref().map(str::as_bytes));
        let system = top.get("system").map(|s| s.get());
        keyed(alias, id, system, lead.as_deref(), later)
    }

    /// A request body with any members, messages and items, spelled any way JSON allows.
    fn body() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let ws = prop::sample::select(vec!["", " ", "\n\t"]);
        let word = prop::sample::select(vec![
            r#""user""#,
            r#""assistant""#,
            r#""tool""#,
            r#""system""#,
            r#""us\u0065r""#,
            r#""function_call""#,
            r#""reasoning""#,
            r#""message""#,
            r#""tool_result""#,
            r#""text""#,
            "7",
            "null",
            r#""a\"]}""#,
        ]);
        let key = prop::sample::select(vec![
            r#""role""#,
            r#""type""#,
            r#""content""#,
            r#""r\u006fle""#,
            r#""name""#,
        ]);
        let block = (word.clone(), ws.clone())
            .prop_map(|(w, s)| format!(r#"{{{s}"type"{s}:{s}{w}{s},"text":"x"}}"#));
        let blocks = prop::collection::vec(block, 0..3).prop_map(|b| format!("[{}]", b.join(",")));
        let value = prop_oneof![word.clone().prop_map(String::from), blocks];
        let member = (key, ws.clone(), value).prop_map(|(k, s, v)| format!("{s}{k}{s}:{s}{v}"));
        // As most clients write a message (read by `plain_message`), or near it.
        let plain = (
            word.clone(),
            word.clone(),
            prop::sample::select(vec!["", " ", r#","role":"tool""#]),
        )
            .prop_map(|(r, c, end)| format!(r#"{{"role":{r},"content":{c}{end}}}"#));
        let item = prop_oneof![
            4 => prop::collection::vec(member, 0..4).prop_map(|m| format!("{{{}}}", m.join(","))),
            1 => word.clone().prop_map(String::from),
            3 => plain,
        ];
        let items = (prop::collection::vec(item, 0..5), ws.clone())
            .prop_map(|(i, s)| format!("[{s}{}{s}]", i.join(&format!("{s},{s}"))));
        let top = prop::sample::select(vec![
            "messages",
            "input",
            "system",
            "prompt_cache_key",
            "model",
            "m\\u0065ssages",
        ]);
        let top_value = prop_oneof![items, word.prop_map(String::from)];
        let top_member = (top, ws, top_value).prop_map(|(k, s, v)| format!(r#"{s}"{k}"{s}:{v}"#));
        prop::collection::vec(top_member, 0..4).prop_map(|m| format!("{{{}}}", m.join(",")))
    }

    proptest::proptest! {
        #[test]
        fn a_conversation_reads_as_a_full_parse_of_its_body_reads_it(body in body()) {
            let h = HeaderMap::new();
            proptest::prop_assert_eq!(
                conversation_of("a", &h, body.as_bytes()),
                parsed("a", &h, body.as_bytes()),
                "{}", body
            );
        }
    }
}
