//! The request view, its parse and its splice, held to a full parse.

use super::*;

fn json(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).unwrap()
}

#[test]
fn a_body_that_is_not_utf8_is_refused_wherever_the_bytes_are() {
    for body in [
        &b"{\"model\":\"m\",\"note\":\"\xff\"}"[..],
        b"{\"model\":\"m\xc3\"}",
        b"{\"model\":\"m\",\n\"messages\":[{\"content\":\"\xed\xa0\x80\"}]}",
    ] {
        let Err(ProxyError::InvalidJson(message)) = ParsedRequest::parse(body) else {
            panic!("{}", String::from_utf8_lossy(body));
        };
        assert!(
            message.starts_with("the request body is not UTF-8 at line"),
            "{message}"
        );
    }
    let Err(ProxyError::InvalidJson(message)) =
        ParsedRequest::parse(b"{\"model\":\"m\",\n \"x\":\"\xff\"}")
    else {
        panic!("refused");
    };
    assert!(message.ends_with("line 2 column 7"), "{message}");
}

#[test]
fn rewrites_model_and_keeps_other_bytes() {
    let body = br#"{"messages":[{"role":"user","content":"hi \"there\""}], "model" : "alias",  "temperature":0.5}"#;
    let p = ParsedRequest::parse(body).unwrap();
    assert_eq!(p.model, "alias");
    assert!(!p.stream);
    let out = p.upstream_body(body, "upstream/m\"x", true);
    let expected = br#"{"messages":[{"role":"user","content":"hi \"there\""}], "model" : "upstream/m\"x",  "temperature":0.5}"#;
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(expected)
    );
}

#[test]
fn injects_usage_for_streams_only_when_not_asked() {
    let body = br#"{"model":"a","stream":true,"messages":[]}"#;
    let p = ParsedRequest::parse(body).unwrap();
    let out = json(&p.upstream_body(body, "u", true));
    assert_eq!(out["stream_options"]["include_usage"], true);
    assert_eq!(out["model"], "u");

    let body = br#"{"model":"a","stream":true,"stream_options":{"include_usage":false,"x":1}}"#;
    let p = ParsedRequest::parse(body).unwrap();
    assert!(!p.client_wants_usage());
    let out = json(&p.upstream_body(body, "u", true));
    assert_eq!(out["stream_options"]["include_usage"], true);
    assert_eq!(out["stream_options"]["x"], 1);

    let body = br#"{"model":"a","stream":true,"stream_options":{"include_usage":true}}"#;
    let p = ParsedRequest::parse(body).unwrap();
    assert!(p.client_wants_usage());
    assert_eq!(p.upstream_body(body, "a", true), body.to_vec());
}

/// A `stream_options` of `null` is replaced, never given a twin key (a backend
/// reading the last of two would see `null` and send no usage).
#[test]
fn null_stream_options_is_replaced_not_duplicated() {
    let body = br#"{"model":"a","stream":true,"stream_options":null}"#;
    let p = ParsedRequest::parse(body).unwrap();
    assert!(!p.client_wants_usage());
    let out = p.upstream_body(body, "u", true);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"model":"u","stream":true,"stream_options":{"include_usage":true}}"#
    );
}

proptest::proptest! {
    /// The model splice and the usage injection give, for any spelling of a
    /// request (whitespace, member order, escapes), the request a parse and an edit of
    /// the parsed value give.
    #[test]
    fn splice_agrees_with_the_parse_in_any_spelling(
        model in "[a-z0-9/._-]{1,12}",
        stream: bool,
        options in 0u8..4,
        seed: u64,
    ) {
        use switchboard_json::respell::{respell, Style};
        let mut v = serde_json::json!({"model": model, "stream": stream,
            "messages": [{"role": "user", "content": "\"model\": \"x\""}], "max_tokens": 5});
        match options {
            0 => {}
            1 => v["stream_options"] = serde_json::Value::Null,
            2 => v["stream_options"] = serde_json::json!({"include_usage": false, "x": 1}),
            _ => v["stream_options"] = serde_json::json!({"include_usage": true}),
        }
        let text = respell(&v, Style::body(seed));
        let p = ParsedRequest::parse(text.as_bytes()).unwrap();
        proptest::prop_assert_eq!(&p.model, &model);
        proptest::prop_assert_eq!(p.stream, stream);
        proptest::prop_assert_eq!(p.client_wants_usage(), options == 3);
        let whole = p.upstream_body(text.as_bytes(), "up/\"m\"", true);
        let shared = p.upstream_payload(&bytes::Bytes::from(text.clone()), "up/\"m\"", true);
        proptest::prop_assert_eq!(&shared.to_vec(), &whole, "the payload is the body spliced");
        let out: serde_json::Value = serde_json::from_slice(&whole).unwrap();
        let mut want = v.clone();
        want["model"] = "up/\"m\"".into();
        if stream && options != 3 {
            let opts = want["stream_options"].as_object().cloned().unwrap_or_default();
            want["stream_options"] = serde_json::Value::Object(opts);
            want["stream_options"]["include_usage"] = true.into();
        }
        proptest::prop_assert_eq!(out, want, "{}", text);
    }
}

proptest::proptest! {
    /// The model is spliced exactly when serde_json's spelling of the upstream model is
    /// not what the body holds: the quick comparison never says "the same" wrongly.
    #[test]
    fn a_model_spelled_as_serde_writes_it_is_left_alone(
        text in "\\PC{0,8}|[a-z\"\\\\\u{0}-\u{1f}\u{7f}/é]{0,8}",
        spelling in 0u8..3,
    ) {
        let json = serde_json::to_vec(&text).unwrap();
        let raw = match spelling {
            0 => json.clone(),
            1 => format!("\"{text}\"").into_bytes(),
            _ => serde_json::to_vec(&serde_json::Value::String(text.clone())).unwrap()
                .iter().flat_map(|&b| if b == b'/' { b"\\/".to_vec() } else { vec![b] }).collect(),
        };
        if is_json_string_of(&raw, &text) {
            proptest::prop_assert_eq!(&raw, &json);
        }
        let body = [br#"{"model":"#.as_slice(), &raw, b"}"].concat();
        let p = ParsedRequest::parse(&body);
        if let Ok(p) = p {
            let edited = p.upstream_body(&body, &text, false) != body;
            proptest::prop_assert_eq!(edited, raw != json);
        }
    }
}

proptest::proptest! {
    /// The members read without a map are those a map of the whole object gives (the
    /// last of a name given twice), whatever the whitespace, order, escapes and nesting;
    /// what is no object is refused as the map refuses it.
    #[test]
    fn top_level_members_are_those_of_a_map_of_the_body(
        members in proptest::collection::vec((0usize..6, 0usize..7), 0..8),
        ws in proptest::collection::vec(r"[ \t\r\n]{0,2}", 40),
        trailing in proptest::option::of(r"[ \n]{0,2}|,|x|\{\}"),
    ) {
        const NAMES: [&str; 6] = ["max_tokens", r"max_t\u006fkens", "model", "max_output_tokens", "n", "max_completion_tokens"];
        const VALUES: [&str; 7] = ["12", "null", r#""x""#, r#"{"max_tokens":3}"#, r#"[1, {"a":[]}]"#, "-1.5e3", "4e2"];
        let mut w = ws.iter().cycle();
        let mut text = format!("{}{{", w.next().unwrap());
        for (i, (k, v)) in members.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text += &format!(r#"{}"{}"{}:{}{}{}"#, w.next().unwrap(), NAMES[*k], w.next().unwrap(),
                w.next().unwrap(), VALUES[*v], w.next().unwrap());
        }
        text.push('}');
        text += trailing.as_deref().unwrap_or("");
        let keys = ["max_tokens", "max_output_tokens", "n"];
        let map: Result<std::collections::HashMap<String, &RawValue>, _> =
            serde_json::from_str(&text);
        let got = top_level(text.as_bytes(), &keys);
        match map {
            Ok(map) => {
                let want: Vec<Option<&str>> = keys.iter().map(|k| map.get(*k).map(|r| r.get())).collect();
                let got: Vec<Option<&str>> = got.unwrap().iter().map(|r| r.map(|r| r.get())).collect();
                proptest::prop_assert_eq!(got, want, "{}", text);
            }
            Err(_) => proptest::prop_assert!(got.is_err(), "{}", text),
        }
        // The view's limits are those read on their own, for each API's keys.
        if let Ok(view) = ParsedRequest::parse(text.as_bytes()) {
            let read = |r: Result<Option<u32>, ProxyError>| r.map_err(|e| format!("{e:?}"));
            for keys in [&["max_completion_tokens", "max_tokens"][..], &["max_tokens"], &["max_output_tokens"]] {
                proptest::prop_assert_eq!(
                    read(view.output_limit(keys)),
                    read(output_limit(text.as_bytes(), keys)),
                    "{}", text
                );
            }
        }
    }
}

#[test]
fn the_view_holds_every_apis_output_limits() {
    for api in crate::APIS {
        for key in api.spec().output_limit() {
            assert!(LIMITS.contains(key), "{key}");
        }
    }
}

#[test]
fn reads_and_clamps_the_limits_of_each_api() {
    let body = br#"{"model":"m","max_output_tokens": 900,"input":"max_output_tokens"}"#;
    assert_eq!(
        output_limit(body, &["max_output_tokens"]).unwrap(),
        Some(900)
    );
    assert_eq!(output_limit(body, &["max_tokens"]).unwrap(), None);
    let out = clamp_limits(body, &["max_output_tokens"], 12).unwrap();
    assert_eq!(
        out,
        br#"{"model":"m","max_output_tokens": 12,"input":"max_output_tokens"}"#.to_vec()
    );
    assert!(matches!(
        output_limit(br#"{"max_tokens":-1}"#, &["max_tokens"]),
        Err(ProxyError::InvalidParam {
            param: "max_tokens",
            ..
        })
    ));
}

#[test]
fn the_view_reads_the_choices_as_output_ask_does() {
    for (n, want) in [
        ("", 1),
        (r#","n":3"#, 3),
        (r#","n":0"#, 1),
        (r#","n":"2""#, 1),
    ] {
        let body = format!(r#"{{"model":"m","max_tokens":5{n}}}"#);
        let view = ParsedRequest::parse(body.as_bytes()).unwrap();
        let asked = output_ask(body.as_bytes(), &["max_tokens"], true).unwrap();
        assert_eq!((view.choices(), asked), (want, (Some(5), want)), "{body}");
    }
}

#[test]
fn rejects_bad_bodies() {
    assert!(matches!(
        ParsedRequest::parse(b"[1]"),
        Err(ProxyError::InvalidJson(_))
    ));
    assert!(matches!(
        ParsedRequest::parse(b"{\"model\":"),
        Err(ProxyError::InvalidJson(_))
    ));
    assert!(matches!(
        ParsedRequest::parse(b"{}"),
        Err(ProxyError::MissingModel)
    ));
    assert!(matches!(
        ParsedRequest::parse(b"{\"model\":\"\"}"),
        Err(ProxyError::MissingModel)
    ));
    assert!(matches!(
        ParsedRequest::parse(b"{\"model\":3}"),
        Err(ProxyError::InvalidParam { param: "model", .. })
    ));
}
