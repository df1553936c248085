//! How deep a JSON text nests, read from its bytes: arrays and objects open and close outside
//! strings, strings skipped by a search for their closing quote. The proxy forwards parts of a
//! body it never parses (`tools`, `messages` in a passthrough), and a backend's own parser
//! may fail on nesting thousands deep. Strings are skipped as `walk` skips them. Most bodies
//! have fewer opening brackets than the limit, which bounds their depth: those are counted,
//! not scanned.
//!
//! A scan, not a serde_json walk, for its stack rather than its speed: a walk recurses once
//! a level (past serde_json's limit of 128 only with `disable_recursion_limit`) and at a
//! limit of 5,000 overflowed a test thread's 2 MiB stack. Their CPU per request did not
//! differ measurably (`benches/load/run.sh` with the walk as `BASELINE_BIN`,
//! docs/PERFORMANCE.md "Where the time goes").
//!
//! For valid JSON the answer is the nesting depth a parse finds (property test below); for
//! text that is not JSON it is some number, and the parse that follows refuses the text.

use crate::walk::string_end;

/// Whether `json` nests arrays and objects more than `limit` deep.
pub fn deeper_than(json: &[u8], limit: usize) -> bool {
    // It nests no deeper than it has brackets that open, in strings or not: most bodies have
    // fewer than the limit, counted by a vector search at a fraction of the scan's cost.
    if memchr::memchr2_iter(b'[', b'{', json).nth(limit).is_none() {
        return false;
    }
    let mut depth = 0usize;
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                i = string_end(json, i);
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::deeper_than;

    /// The nesting depth of a parsed value.
    fn depth(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// The depth by the scan: the least limit it does not exceed.
    fn scanned(text: &[u8]) -> usize {
        (0..).find(|&l| !deeper_than(text, l)).unwrap_or(0)
    }

    /// Strings full of what the scan must not take for structure.
    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just("[".to_string()),
                Just("{".to_string()),
                Just("]".to_string()),
                Just("\"".to_string()),
                Just("\\".to_string()),
                Just("\\\"[".to_string()),
                Just("é".to_string()),
                "[a-z ]{0,4}",
            ],
            0..6,
        )
        .prop_map(|parts| parts.concat())
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(12, 64, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((text(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Whitespace between two tokens, chosen by `ws`.
    fn pad(ws: &[u8], n: &mut usize) -> &'static str {
        *n += 1;
        [" ", "\n", "\t", "", "\r\n  "][usize::from(ws[*n % ws.len()] % 5)]
    }

    /// `v` as text with any whitespace between tokens, and `\u` escapes where JSON allows.
    fn spelled(v: &Value, ws: &[u8], n: &mut usize) -> String {
        match v {
            Value::Array(a) => {
                let mut out = format!("[{}", pad(ws, n));
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        out.push_str(pad(ws, n));
                    }
                    out.push_str(&spelled(x, ws, n));
                }
                out.push_str(pad(ws, n));
                out.push(']');
                out
            }
            Value::Object(o) => {
                let mut out = format!("{{{}", pad(ws, n));
                for (i, (k, x)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&escaped(k, ws, n));
                    out.push_str(pad(ws, n));
                    out.push(':');
                    out.push_str(pad(ws, n));
                    out.push_str(&spelled(x, ws, n));
                }
                out.push_str(pad(ws, n));
                out.push('}');
                out
            }
            Value::String(s) => escaped(s, ws, n),
            other => other.to_string(),
        }
    }

    fn escaped(s: &str, ws: &[u8], n: &mut usize) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            *n += 1;
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if ws[*n % ws.len()] % 3 == 0 => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    proptest! {
        #[test]
        fn the_scan_finds_the_depth_a_parse_finds_in_any_spelling(
            v in value(),
            ws in proptest::collection::vec(any::<u8>(), 1..32),
        ) {
            let text = spelled(&v, &ws, &mut 0);
            let parsed: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(&parsed, &v);
            prop_assert_eq!(scanned(text.as_bytes()), depth(&v), "{}", text);
        }
    }

    #[test]
    fn nesting_thousands_deep_is_found_at_the_limit() {
        let deep = format!(
            "{{\"model\":\"m\",\"tools\":{}{}}}",
            "[".repeat(5000),
            "]".repeat(5000)
        );
        assert!(deeper_than(deep.as_bytes(), 64));
        assert!(!deeper_than(deep.as_bytes(), 5001));
        assert!(deeper_than(deep.as_bytes(), 5000));
        // Brackets in strings are text.
        let flat = format!("{{\"content\":\"{}\"}}", "[".repeat(5000));
        assert!(!deeper_than(flat.as_bytes(), 1));
        assert!(!deeper_than(br#"{"a":"\\"}"#, 1));
        assert!(deeper_than(br#"{"a":"\\","b":[]}"#, 1));
    }
}
