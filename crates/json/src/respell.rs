//! Test support: the same JSON document written in other valid ways (whitespace, key order,
//! escapes), for the property tests that hold a byte-level reading to a full parse.

use serde_json::Value;

/// How a document may be re-spelled.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    /// Drives every choice (whitespace, order, escapes).
    pub seed: u64,
    /// Whitespace may include line breaks (not for an SSE `data:` line).
    pub newlines: bool,
    /// Object members in a shuffled order.
    pub reorder: bool,
    /// Characters of keys and strings written as `\u` escapes now and then.
    pub escapes: bool,
}

impl Style {
    /// Spaces and tabs, any order, escapes or none (the seed's lowest bits pick):
    /// what fits on one SSE line.
    pub fn line(seed: u64) -> Style {
        Style {
            seed,
            newlines: false,
            reorder: seed & 1 == 0,
            escapes: seed & 2 == 0,
        }
    }

    /// Like [`Style::line`], and line breaks too.
    pub fn body(seed: u64) -> Style {
        Style {
            newlines: true,
            ..Style::line(seed)
        }
    }
}

/// Any JSON value a few levels deep.
pub fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        "[ -~]{0,8}".prop_map(Value::from),
        "\\PC{0,4}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(("[a-z\"\\\\ ]{0,6}", inner), 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

struct Rng(u64);

impl Rng {
    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `v` written with the whitespace, member order and escapes `style` picks.
pub fn respell(v: &Value, style: Style) -> String {
    let mut out = String::new();
    let mut rng = Rng(style.seed);
    ws(&mut out, &mut rng, style);
    value(&mut out, v, &mut rng, style);
    ws(&mut out, &mut rng, style);
    out
}

fn ws(out: &mut String, rng: &mut Rng, style: Style) {
    let kinds: &[char] = if style.newlines {
        &[' ', '\t', '\n', '\r']
    } else {
        &[' ', '\t']
    };
    if rng.below(2) == 0 {
        return;
    }
    for _ in 0..=rng.below(3) {
        out.push(kinds[rng.below(kinds.len() as u64) as usize]);
    }
}

fn value(out: &mut String, v: &Value, rng: &mut Rng, style: Style) {
    match v {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            if style.reorder {
                for i in (1..members.len()).rev() {
                    members.swap(i, rng.below(i as u64 + 1) as usize);
                }
            }
            out.push('{');
            ws(out, rng, style);
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    ws(out, rng, style);
                }
                string(out, k, rng, style);
                ws(out, rng, style);
                out.push(':');
                ws(out, rng, style);
                value(out, v, rng, style);
                ws(out, rng, style);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            ws(out, rng, style);
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    ws(out, rng, style);
                }
                value(out, v, rng, style);
                ws(out, rng, style);
            }
            out.push(']');
        }
        Value::String(s) => string(out, s, rng, style),
        other => out.push_str(&other.to_string()),
    }
}

fn string(out: &mut String, s: &str, rng: &mut Rng, style: Style) {
    out.push('"');
    for c in s.chars() {
        let short = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '/' if style.escapes && rng.below(2) == 0 => Some("\\/"),
            _ => None,
        };
        let must = c < ' ' || c == '"' || c == '\\';
        if (must || style.escapes) && rng.below(4) == 0 || (must && short.is_none()) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                if rng.below(2) == 0 {
                    out.push_str(&format!("\\u{unit:04x}"));
                } else {
                    out.push_str(&format!("\\u{unit:04X}"));
                }
            }
        } else if let Some(escape) = short {
            out.push_str(escape);
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

#[test]
fn respelled_documents_parse_to_the_same_value() {
    let v = serde_json::json!({"usage": {"prompt_tokens": 3}, "a\"b": ["x/\\y\n\u{1}", 1.5, null, true],
        "e": "caf\u{e9} \u{1F600}", "n": -2});
    for seed in 0..200 {
        for style in [Style::line(seed), Style::body(seed)] {
            let text = respell(&v, style);
            let back: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(back, v, "{text}");
            if !style.newlines {
                assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
            }
        }
    }
}

/// A number in any spelling JSON allows, or a spelling near one: serializers' (ryu, `{}`,
/// `{:e}`), any digits with or without a fraction and exponent, integers.
pub fn number() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let finite = any::<f64>().prop_filter("finite", |f| f.is_finite());
    prop_oneof![
        finite
            .clone()
            .prop_map(|f| serde_json::to_string(&f).unwrap_or_default()),
        finite.clone().prop_map(|f| format!("{f}")),
        finite.prop_map(|f| format!("{f:e}")),
        (0.0f64..1e7).prop_map(|f| serde_json::to_string(&f).unwrap_or_default()),
        (any::<u64>(), 0u32..24).prop_map(|(n, p)| {
            let s = format!("{n:0>width$}", width = p as usize + 1);
            let (w, f) = s.split_at(s.len() - p as usize);
            if p == 0 {
                w.to_string()
            } else {
                format!("{w}.{f}")
            }
        }),
        "-?[0-9]{0,22}(\\.[0-9]{0,24})?([eE][+-]?[0-9]{1,3})?",
        "[0-9]{1,4}\\.[0-9]{10,22}",
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
    ]
}
