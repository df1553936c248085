//! Usage and timings read from answers and events, held to a full parse.

use super::*;
use proptest::prelude::*;

/// A real llama-server's non-streamed answer (tiny Qwen3 model), verbatim.
const LLAMACPP: &str = r#"{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"fontStyle Bamboocome zoningفرنس.lists estaba guid㎧职业生涯mir隍"}}],"created":1796026244,"model":"tiny-qwen3","system_fingerprint":"b0-unknown","object":"chat.completion","usage":{"completion_tokens":12,"prompt_tokens":23,"total_tokens":35,"prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-ZVIsHc0s4nZ04oU9pEI0kGJxIRFA37lJ","timings":{"cache_n":0,"prompt_n":23,"prompt_ms":3.426,"prompt_per_token_ms":0.14895652173913043,"prompt_per_second":6713.368359603036,"predicted_n":12,"predicted_ms":15.79,"predicted_per_token_ms":1.4354545454545453,"predicted_per_second":696.6434452184927}}"#;

#[test]
fn parses_usage_chunk() {
    let (u, only) = of_event(br#"{"choices":[],"usage":{"completion_tokens":6,"prompt_tokens":23,"total_tokens":29},"timings":{"prompt_per_second":428.4,"predicted_per_second":678.3}}"#).unwrap();
    assert!(only);
    assert_eq!((u.prompt, u.completion), (23, 6));
    assert_eq!(u.decode_tps, Some(678.3));
    let (_, only) =
        of_event(br#"{"choices":[{"index":0}],"usage":{"completion_tokens":1,"prompt_tokens":2}}"#)
            .unwrap();
    assert!(!only);
    assert!(of_event(br#"{"choices":[{"index":0}]}"#).is_none());
}

#[test]
fn a_body_reads_as_its_full_parse_does() {
    let u = of_body(LLAMACPP.as_bytes()).unwrap();
    assert_eq!((u.prompt, u.completion, u.reasoning), (23, 12, None));
    assert_eq!(
        (u.prefill_tps, u.decode_tps),
        (Some(6713.368359603036), Some(696.6434452184927))
    );
    assert_eq!(Some(u), of_event(LLAMACPP.as_bytes()).map(|(u, _)| u));

    // vLLM: spaces around the colon, reasoning tokens, no timings.
    let vllm = br#"{"id":"x","choices":[{"message":{"content":"ok"}}], "usage" : {"prompt_tokens":5,"completion_tokens":7,"completion_tokens_details":{"reasoning_tokens":3}}}"#;
    let u = of_body(vllm).unwrap();
    assert_eq!((u.prompt, u.completion, u.reasoning), (5, 7, Some(3)));
    assert_eq!((u.prefill_tps, u.decode_tps), (None, None));

    assert!(of_body(br#"{"choices":[{"message":{"content":"ok"}}]}"#).is_none());
    assert!(of_body(br#"{"usage":null}"#).is_none());
    // The last usage object is the answer's; keys outside it are not read.
    let body = br#"{"choices":[{"message":{"usage":{"prompt_tokens":99}}}],"usage":{"completion_tokens":2},"extra":{"prompt_tokens":98}}"#;
    let u = of_body(body).unwrap();
    assert_eq!((u.prompt, u.completion), (0, 2));
    assert_eq!(Some(u), of_event(body).map(|(u, _)| u));
    assert!(of_body(b"").is_none());
    // llama.cpp answers several prompts with an array, a usage each: not one answer's.
    let several = br#"[{"content":"a","usage":{"prompt_tokens":3}},{"content":"b","usage":{"prompt_tokens":4}}]"#;
    assert!(of_body(several).is_none());
    assert!(of_event(several).is_none());
    // A speed that is not a number is none (llama.cpp writes an infinite one as null).
    let body = br#"{"usage":{"prompt_tokens":1},"timings":{"prompt_per_second":null,"predicted_per_second":2.5}}"#;
    let u = of_body(body).unwrap();
    assert_eq!((u.prefill_tps, u.decode_tps), (None, Some(2.5)));
    assert_eq!(Some(u), of_event(body).map(|(u, _)| u));
}

#[test]
fn usage_written_as_text_is_not_read() {
    // Text is written with its quotes escaped, so `"usage"` never matches in it: a usage
    // object the model wrote into its answer before the real one,
    let body = br#"{"choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":99}}"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
    let u = of_body(body).unwrap();
    assert_eq!((u.prompt, u.completion), (1, 2));
    // or as the only one.
    let body = br#"{"choices":[{"message":{"content":"\"usage\": {\"prompt_tokens\":99}"}}]}"#;
    assert!(of_body(body).is_none());
    // A key that ends in `\"usage` is not the usage key.
    let body = br#"{"usage":{"prompt_tokens":1,"completion_tokens":2},"note \"usage":{"prompt_tokens":99}}"#;
    assert_eq!(of_body(body).map(|u| u.prompt), Some(1));
}

proptest! {
    /// Whatever the model wrote and however the backend laid the answer out, the key
    /// search reads what a full parse reads. The model's text also appears as a key after
    /// `usage` (a key's quotes are escaped as a string's are): only a key that is exactly
    /// `usage` or `timings` there would be read, which no backend's layout has.
    #[test]
    fn of_body_agrees_with_the_full_parse(
        content in r#"[a-z "\\{}\[\]:,]{0,40}|.*"usage":\{"prompt_tokens":[0-9]\}.*|[a-z ]*"(usage|timings)"#,
        prompt in 0u64..1_000_000,
        completion in 0u64..1_000_000,
        reasoning in proptest::option::of(0u64..1000),
        timings in proptest::option::of((0.0f64..1e7, 0.0f64..1e7)),
        details_first: bool,
        pretty: bool,
    ) {
        let message = serde_json::json!({"role": "assistant", "content": content});
        let mut usage = serde_json::Map::new();
        if details_first {
            usage.insert("prompt_tokens_details".into(), serde_json::json!({"cached_tokens": 3}));
        }
        if let Some(r) = reasoning {
            usage.insert("completion_tokens_details".into(), serde_json::json!({"reasoning_tokens": r}));
        }
        usage.insert("completion_tokens".into(), completion.into());
        usage.insert("prompt_tokens".into(), prompt.into());
        usage.insert("total_tokens".into(), (prompt + completion).into());
        let mut body = serde_json::json!({
            "choices": [{"index": 0, "message": message}],
            "usage": usage,
            "id": "chatcmpl-1",
        });
        if let Some((prefill, decode)) = timings {
            body["timings"] = serde_json::json!({
                "prompt_n": 17, "prompt_per_token_ms": 4.9e-6, "prompt_per_second": prefill,
                "predicted_n": 16, "predicted_per_second": decode,
            });
        }
        prop_assume!(content != "usage" && content != "timings");
        body["metadata"] = serde_json::json!({ content.clone(): {"prompt_tokens": 99, "prompt_per_second": 9.5} });
        let bytes = if pretty {
            serde_json::to_vec_pretty(&body).unwrap()
        } else {
            serde_json::to_vec(&body).unwrap()
        };
        let read = of_body(&bytes);
        prop_assert_eq!(read, of_event(&bytes).map(|(u, _)| u));
        let read = read.unwrap();
        prop_assert_eq!((read.prompt, read.completion, read.reasoning), (prompt, completion, reasoning));
        // serde_json reads floats to within an ulp or so.
        let decode_error = read.decode_tps.zip(timings).map(|(r, t)| (r - t.1).abs() / t.1.max(1.0));
        prop_assert!(decode_error.is_none_or(|e| e < 1e-12), "decode_tps {:?}", read.decode_tps);
        prop_assert_eq!(read.decode_tps.is_some(), timings.is_some());
    }

    /// The same answer in any spelling (whitespace anywhere, members in any
    /// order, escapes in keys and strings) reads as its full parse does.
    #[test]
    fn of_body_agrees_with_the_full_parse_in_any_spelling(
        content in r#"[a-z "\\{}\[\]:,]{0,40}|"usage":\{"prompt_tokens":[0-9]\}"#,
        prompt in 0u64..1_000_000,
        completion in 0u64..1_000_000,
        reasoning in proptest::option::of(0u64..1000),
        timings in proptest::option::of((0.0f64..1e7, 0.0f64..1e7)),
        seed: u64,
    ) {
        let mut usage = serde_json::json!({"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": 3}});
        if let Some(r) = reasoning {
            usage["completion_tokens_details"] = serde_json::json!({"reasoning_tokens": r});
        }
        let mut body = serde_json::json!({
            "id": "chatcmpl-1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
            "usage": usage,
        });
        if let Some((prefill, decode)) = timings {
            body["timings"] = serde_json::json!({"prompt_n": 17, "prompt_per_second": prefill,
                "predicted_n": 16, "predicted_per_second": decode});
        }
        let text = switchboard_json::respell::respell(&body, switchboard_json::respell::Style::body(seed));
        let read = of_body(text.as_bytes());
        prop_assert_eq!(read, of_event(text.as_bytes()).map(|(u, _)| u));
        let read = read.unwrap();
        prop_assert_eq!((read.prompt, read.completion, read.reasoning), (prompt, completion, reasoning));
    }
}

/// A key of the usage object or its details, or any other (`extra` adds the keys a
/// whole answer is searched by).
fn name(extra: bool) -> impl Strategy<Value = String> {
    let mut names = vec![
        "prompt_tokens",
        "completion_tokens",
        "completion_tokens_details",
        "reasoning_tokens",
        "prompt_tokens_details",
        "cached_tokens",
    ];
    if extra {
        names.extend(["usage", "timings", "prompt_per_second", "choices"]);
    }
    prop_oneof![
        2 => prop::sample::select(names).prop_map(String::from),
        3 => "[a-z_]{0,8}",
        1 => "[a-z_\"\\\\]{0,8}",
    ]
}

/// A few members of any value a few levels deep, under any of those names.
fn members(extra: bool) -> impl Strategy<Value = Vec<(String, serde_json::Value)>> {
    let value = switchboard_json::respell::json_value().prop_recursive(2, 12, 3, move |inner| {
        proptest::collection::vec((name(extra), inner), 0..3)
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    });
    proptest::collection::vec((name(extra), value), 0..3)
}

fn with(
    mut m: serde_json::Map<String, serde_json::Value>,
    extra: &[(String, serde_json::Value)],
) -> serde_json::Value {
    for (k, v) in extra {
        m.insert(k.clone(), v.clone());
    }
    serde_json::Value::Object(m)
}

/// A usage object with the counts given (`details`: absent, `null`, or an object whose
/// `reasoning_tokens` is `null` or a count, beside the members `in_details`).
fn usage_object(
    prompt: Option<u64>,
    completion: Option<u64>,
    details: Option<Option<Option<u64>>>,
    in_details: &[(String, serde_json::Value)],
) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::{Map, Value};
    let mut usage = Map::new();
    if let Some(p) = prompt {
        usage.insert("prompt_tokens".into(), p.into());
    }
    if let Some(c) = completion {
        usage.insert("completion_tokens".into(), c.into());
    }
    if let Some(d) = details {
        let d = d.map_or(Value::Null, |r| {
            let reasoning = (
                "reasoning_tokens".to_string(),
                r.map_or(Value::Null, Value::from),
            );
            with(Map::from_iter([reasoning]), in_details)
        });
        usage.insert("completion_tokens_details".into(), d);
    }
    usage
}

/// Any spelling, escapes now and then.
fn spelled(v: &serde_json::Value, seed: u64) -> String {
    let style = switchboard_json::respell::Style {
        escapes: seed % 8 == 0,
        ..switchboard_json::respell::Style::body(seed)
    };
    switchboard_json::respell::respell(v, style)
}

/// Where each object of `text` opens (outside strings).
fn objects(text: &str) -> Vec<usize> {
    let (mut at, mut in_string, mut escaped) = (Vec::new(), false, false);
    for (i, b) in text.bytes().enumerate() {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (false, _, b'"') => in_string = true,
            (false, _, b'{') => at.push(i),
            _ => {}
        }
    }
    at
}

/// `text` with `"key":value` added as the first member of one of its objects.
fn with_member(text: &str, which: prop::sample::Index, key: &str, value: &str) -> String {
    let at = objects(text);
    let open = at[which.index(at.len())];
    let empty = text[open + 1..].trim_start().starts_with('}');
    let key = serde_json::to_string(key).unwrap_or_default();
    let mut text = text.to_string();
    text.insert_str(
        open + 1,
        &format!("{key}:{value}{}", if empty { "" } else { "," }),
    );
    text
}

/// A value for a member given twice.
fn twice() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "null",
        "3",
        "2.5",
        "-1",
        "{\"prompt_tokens\":1}",
        "[]",
        "\"x\"",
    ])
}

proptest! {
    /// Any answer in the backends' layout (`usage` and `timings` the last objects under
    /// their keys) reads as its full parse reads it: members under the names of the usage
    /// object nested anywhere, given twice, of the wrong type, `null`s, speeds in any
    /// spelling of a number, in any whitespace, order and escapes.
    #[test]
    fn of_body_agrees_with_the_full_parse_whatever_the_answer_holds(
        content in r#"[a-z "\\{}:,]{0,20}"#,
        prompt in proptest::option::of(0u64..1_000_000),
        completion in proptest::option::of(0u64..1_000_000),
        details in proptest::option::of(proptest::option::of(proptest::option::of(0u64..1000))),
        timings in proptest::option::of(proptest::option::of((any::<bool>(), any::<bool>()))),
        prefill in json_number(),
        decode in prop_oneof![json_number(), Just("null".to_string())],
        (top, in_choice, in_usage, in_details, in_timings) in (members(false), members(false), members(false), members(false), members(false)),
        twice in proptest::option::of((any::<prop::sample::Index>(), name(false), twice())),
        seed: u64,
    ) {
        use serde_json::{json, Map, Value};
        let mut body = Map::new();
        let choice = with(Map::from_iter([("message".to_string(), json!({"content": content}))]), &in_choice);
        body.insert("choices".into(), json!([choice]));
        let usage = usage_object(prompt, completion, details, &in_details);
        body.insert("usage".into(), with(usage, &in_usage));
        if let Some(t) = timings {
            let t = t.map_or(Value::Null, |(p, d)| {
                let mut m = Map::new();
                m.insert("prompt_n".into(), 17.into());
                if p {
                    m.insert("prompt_per_second".into(), PREFILL_AT.into());
                }
                if d {
                    m.insert("predicted_per_second".into(), DECODE_AT.into());
                }
                with(m, &in_timings)
            });
            body.insert("timings".into(), t);
        }
        let mut text = spelled(&with(body, &top), seed)
            .replace(&PREFILL_AT.to_string(), &prefill)
            .replace(&DECODE_AT.to_string(), &decode);
        if let Some((which, key, value)) = twice {
            text = with_member(&text, which, &key, value);
        }
        prop_assert!(serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok(), "{}", text);
        prop_assert_eq!(of_body(text.as_bytes()), of_event(text.as_bytes()).map(|(u, _)| u), "{}", text);
    }
}

/// A number in any spelling JSON allows, within an `f64`'s range.
fn json_number() -> impl Strategy<Value = String> {
    switchboard_json::respell::number()
        .prop_filter("a number", |t| serde_json::from_str::<f64>(t).is_ok())
}

/// Where the speeds go in the text, to be replaced by their tokens after respelling
/// (integers are written as they are, never escaped).
const PREFILL_AT: u64 = 9_876_543_210_123;
const DECODE_AT: u64 = 9_876_543_210_457;

#[test]
fn an_escaped_usage_key_is_read() {
    let body = br#"{"choices":[],"\u0075sage":{"prompt_tokens":4,"completion_tokens":5}}"#;
    let u = of_body(body).unwrap();
    assert_eq!((u.prompt, u.completion), (4, 5));
    let spaced =
        b"{\"choices\": [], \"usage\" :\n {\"prompt_tokens\": 4, \"completion_tokens\": 5}}";
    assert_eq!(of_body(spaced), Some(u));
}

/// A member of a `timings` object: a name of its fields, one of llama.cpp's others or any,
/// spelled as written or with its first letter escaped; a number in any spelling, `null`, or
/// a value of another type.
fn timings_member() -> impl Strategy<Value = String> {
    let known = prop::sample::select(
        [
            "cache_n",
            "prompt_n",
            "prompt_ms",
            "prompt_per_second",
            "predicted_n",
            "predicted_ms",
            "predicted_per_second",
            "prompt_per_token_ms",
            "draft_n",
        ]
        .map(String::from)
        .to_vec(),
    );
    let name = prop_oneof![4 => known, 1 => "[a-z_]{1,8}"];
    let key = (name, prop::bool::weighted(0.1)).prop_map(|(n, escaped)| {
        if escaped {
            format!("\"\\u{:04x}{}\"", n.as_bytes()[0], &n[1..])
        } else {
            format!("\"{n}\"")
        }
    });
    let value = prop_oneof![
        8 => json_number(),
        1 => Just("null".to_string()),
        1 => prop::sample::select(vec!["true", "\"3\"", "{}", "[1]", "{\"a\":[]}"]).prop_map(String::from),
    ];
    let ws = prop::sample::select(vec!["", " ", "\n", "\t ", "\r\n"]);
    (ws.clone(), key, ws.clone(), ws, value).prop_map(|(a, k, b, c, v)| format!("{a}{k}{b}:{c}{v}"))
}

proptest! {
    /// The walk of a `timings` object reads what its full parse reads, for any members in any
    /// order, spelling and whitespace, a name given twice, values of the wrong type; and when
    /// it cannot tell, it says so (then the object is parsed whole).
    #[test]
    fn a_walked_timings_object_reads_as_its_full_parse(
        members in proptest::collection::vec(timings_member(), 0..12),
        inner in prop::sample::select(vec!["", " ", "\n  "]),
        after in prop::sample::select(vec!["", "}", ",\"x\":1}", " ]"]),
    ) {
        let text = format!("{{{}{inner}}}{after}", members.join(","));
        let full = Timings::deserialize(&mut serde_json::Deserializer::from_str(&text)).ok();
        prop_assert!(serde_json::from_str::<serde::de::IgnoredAny>(&text[..text.len() - after.len()]).is_ok(), "{}", text);
        if let Some(walked) = walked(text.as_bytes()) {
            prop_assert_eq!(walked, full, "{}", text);
        }
        prop_assert_eq!(read(walk::timings(text.as_bytes()), text.as_bytes()), full, "{}", text);
    }
}

/// A walk of a `timings` object as an answer: `Some` what it read (`None` when the object's
/// parse fails too), `None` when it cannot tell.
fn walked(b: &[u8]) -> Option<Option<Timings>> {
    match walk::timings(b) {
        Ok(t) => Some(Some(t)),
        Err(walk::Stop::Fails) => Some(None),
        Err(walk::Stop::Unsure) => None,
    }
}

#[test]
fn a_flat_timings_object_is_walked_whatever_its_numbers() {
    let at = LLAMACPP.find("\"timings\":").unwrap() + "\"timings\":".len();
    let t = &LLAMACPP[at..];
    let full = Timings::deserialize(&mut serde_json::Deserializer::from_str(t)).ok();
    assert_eq!(walked(t.as_bytes()), Some(full));
    assert_eq!(full.unwrap().prompt_ms, Some(3.426));
    // A name given twice, or a count that is not one, fails the object as its parse does.
    for bad in [
        r#"{"prompt_n":1,"prompt_n":2}"#,
        r#"{"prompt_n":1.5}"#,
        r#"{"cache_n":-1}"#,
        r#"{"prompt_ms":true}"#,
    ] {
        assert_eq!(walked(bad.as_bytes()), Some(None), "{bad}");
        assert!(serde_json::from_str::<Timings>(bad).is_err(), "{bad}");
    }
    // Members it does not read are skipped whatever they hold.
    let other = r#"{"x":[1,{"}":"]"}],"y":{"a":"\"}"},"prompt_n":2,"z":"\u0041"}"#;
    let full = serde_json::from_str::<Timings>(other).ok();
    assert_eq!(full.and_then(|t| t.prompt_n), Some(2));
    assert_eq!(walked(other.as_bytes()), Some(full));
    // What the walk cannot tell is left to the parse.
    for whole in [r#"{"prompt_n":"1"}"#, r#"{"\u0070rompt_n":1}"#, "[]"] {
        assert_eq!(walked(whole.as_bytes()), None, "{whole}");
    }
}

/// A key, spelled as written or with its first letter escaped.
fn key(name: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (name, prop::bool::weighted(0.1)).prop_map(|(n, escaped)| match n.as_bytes().first() {
        Some(first) if escaped => format!("\"\\u{first:04x}{}\"", &n[1..]),
        _ => format!("\"{n}\""),
    })
}

/// Members `{…}` of `member`s, in any whitespace, now and then one of them given twice.
fn object_of(member: impl Strategy<Value = String>, most: usize) -> impl Strategy<Value = String> {
    let ws = prop::sample::select(vec!["", " ", "\n  "]);
    let twice = proptest::option::weighted(0.3, any::<prop::sample::Index>());
    (proptest::collection::vec(member, 0..most), twice, ws).prop_map(|(mut m, twice, ws)| {
        if let Some(i) = twice.filter(|_| !m.is_empty()) {
            m.push(i.get(&m).clone());
        }
        format!("{{{ws}{}{ws}}}", m.join(","))
    })
}

/// A value a count may be given: a number in any spelling, `null`, another type.
fn count_value() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => (0u64..100_000).prop_map(|n| n.to_string()),
        2 => json_number(),
        1 => Just("null".to_string()),
        1 => prop::sample::select(vec!["true", "\"3\"", "[]", "[1]", "{}", "\"a\\\"}\""]).prop_map(String::from),
    ]
}

/// A member of a usage object: its names and those of its details, given any value.
fn usage_member() -> impl Strategy<Value = String> {
    let names =
        |n: &[&str]| prop::sample::select(n.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    let in_details = key(prop_oneof![
        4 => names(&["reasoning_tokens", "cached_tokens", "audio_tokens"]),
        1 => "[a-z_]{1,6}",
    ]);
    let details = object_of(
        (in_details, count_value()).prop_map(|(k, v)| format!("{k}:{v}")),
        3,
    );
    let name = key(prop_oneof![
        6 => names(&["prompt_tokens", "completion_tokens", "total_tokens",
            "completion_tokens_details", "prompt_tokens_details"]),
        1 => "[a-z_]{1,8}",
    ]);
    let value = prop_oneof![3 => count_value(), 2 => details];
    let ws = prop::sample::select(vec!["", " ", "\n"]);
    (name, ws.clone(), ws, value).prop_map(|(k, a, b, v)| format!("{k}{a}:{b}{v}"))
}

proptest! {
    /// The walk of a `usage` object reads what its parse reads, for any members in any order,
    /// spelling and whitespace, a name given twice, values of the wrong type, details objects
    /// of any members; and when it cannot tell, it says so (then the object is parsed).
    #[test]
    fn a_walked_usage_object_reads_as_its_parse(
        text in object_of(usage_member(), 6),
        after in prop::sample::select(vec!["", "}", ",\"timings\":{}}"]),
    ) {
        prop_assert!(serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok(), "{}", text);
        let full = serde_json::from_str::<WireUsage>(&text).ok().map(|u| usage_with(u, None));
        let text = format!("{text}{after}");
        let walked = walk::usage(text.as_bytes());
        if matches!(walked, Ok(_) | Err(walk::Stop::Fails)) {
            prop_assert_eq!(walked.ok().map(|u| usage_with(u, None)), full, "{}", text);
        }
        let read = read(walk::usage(text.as_bytes()), text.as_bytes());
        prop_assert_eq!(read.map(|u| usage_with(u, None)), full, "{}", text);
    }
}

mod layouts;
