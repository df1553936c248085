//! Tests of the conversation key: the harness headers, the leading messages, the fast reads.

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
    h.piece(&0u64.to_le_bytes());
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
fn a_conversation_key_includes_its_client() {
    let body = br#"{"messages":[{"role":"user","content":"one"}]}"#;
    let session = with("x-switchboard-session", "s1");
    for headers in [HeaderMap::new(), session] {
        let of = |client| {
            let history = History::of(body);
            let id = ConversationId::read(&headers, body, &history);
            let key = conversation_key("m", client, id.as_ref(), body, &history);
            key.unwrap().key
        };
        assert_ne!(of(1), of(2), "two clients, one conversation: {headers:?}");
        assert_eq!(of(1), of(1));
        assert_eq!(of(0), conversation_of("m", &headers, body).unwrap().key);
    }
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
    let result =
        r#",{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}"#;
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
