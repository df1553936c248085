//! The layouts held to serde_json's parse: the backends' own objects, and objects in a
//! layout with any numbers, changed a little.

use proptest::prelude::*;
use serde::Deserialize;

use super::super::layout::{self, Step, TIMINGS, USAGE};
use super::super::{read, usage_with, walk, Timings, WireUsage};
use super::{json_number, LLAMACPP};

/// The `usage` and `timings` objects of [`LLAMACPP`], and a vLLM answer's `usage`.
fn backend_objects() -> [(&'static str, &'static [Step]); 4] {
    let object = |key: &str| {
        let at = LLAMACPP.find(key).unwrap() + key.len();
        &LLAMACPP[at..]
    };
    [
        (object(r#""usage":"#), USAGE[0]),
        (object(r#""timings":"#), TIMINGS),
        (
            r#"{"prompt_tokens":23,"total_tokens":35,"completion_tokens":12,"prompt_tokens_details":null}"#,
            USAGE[1],
        ),
        (
            r#"{"prompt_tokens":23,"total_tokens":35,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":22}}"#,
            USAGE[1],
        ),
    ]
}

#[test]
fn the_backends_objects_are_read_by_their_layouts() {
    for (text, layout) in backend_objects() {
        assert!(layout::read(text.as_bytes(), layout).is_some(), "{text}");
    }
    let timings = backend_objects()[1].0.as_bytes();
    let full = Timings::deserialize(&mut serde_json::Deserializer::from_slice(timings)).ok();
    assert_eq!(walk::timings(timings).ok(), full);
    assert_eq!(full.unwrap().predicted_per_second, Some(696.6434452184927));
    for (text, _) in [0, 2, 3].map(|i| backend_objects()[i]) {
        let full = WireUsage::deserialize(&mut serde_json::Deserializer::from_str(text))
            .map(|u| usage_with(u, None));
        assert_eq!(
            walk::usage(text.as_bytes())
                .map(|u| usage_with(u, None))
                .ok(),
            full.ok()
        );
    }
}

/// `layout` written out, its numbers taken from `values`, `null` where it may be when `null`.
fn write(
    layout: &[Step],
    values: &mut impl Iterator<Item = String>,
    null: bool,
    text: &mut String,
) {
    for step in layout {
        match step {
            Step::Text(t) => text.push_str(std::str::from_utf8(t).unwrap()),
            Step::NullOr(_) if null => text.push_str("null"),
            Step::NullOr(inner) => write(inner, values, null, text),
            _ => text.push_str(&values.next().unwrap()),
        }
    }
}

/// An object written in `layout` with any numbers in any spelling (or `null`, or a negative
/// count), now and then changed a little where the change keeps it JSON: whitespace or a
/// member put in somewhere, a byte of it dropped.
fn in_layout(layout: &'static [Step]) -> impl Strategy<Value = String> {
    let value = prop_oneof![
        8 => (0u64..1 << 40).prop_map(|n| n.to_string()),
        4 => json_number(),
        1 => Just("null".to_string()),
        1 => Just("-3".to_string()),
    ];
    let change = prop_oneof![
        2 => prop::sample::select(vec![" ", "\n", ",\"x\":1", "\"x\":1,", ",\"prompt_n\":2", "0"])
            .prop_map(|s| Some(s.to_string())),
        1 => Just(None),
    ];
    let changed = proptest::option::weighted(0.5, (any::<prop::sample::Index>(), change));
    let null = prop::bool::weighted(0.3);
    (proptest::collection::vec(value, 9), null, changed).prop_map(move |(values, null, changed)| {
        let mut text = String::new();
        write(layout, &mut values.into_iter(), null, &mut text);
        let Some((at, change)) = changed else {
            return text;
        };
        let mut changed = text.clone();
        let at = at.index(text.len());
        match change {
            Some(put) => changed.insert_str(at, &put),
            None => drop(changed.remove(at)),
        }
        let json = serde_json::from_str::<serde::de::IgnoredAny>(&changed).is_ok();
        if json {
            changed
        } else {
            text
        }
    })
}

proptest! {
    /// An object laid out as a backend writes it reads as its parse, whatever its numbers, and
    /// so does one changed so that it is laid out otherwise.
    #[test]
    fn an_object_in_a_backends_layout_reads_as_its_parse(
        text in prop::sample::select(vec![0, 1, 2, 3]).prop_flat_map(|i| in_layout(backend_objects()[i].1)),
    ) {
        let b = text.as_bytes();
        let usage = serde_json::from_str::<WireUsage>(&text).ok().map(|u| usage_with(u, None));
        prop_assert_eq!(read(walk::usage(b), b).map(|u| usage_with(u, None)), usage, "{}", text);
        let timings = serde_json::from_str::<Timings>(&text).ok();
        prop_assert_eq!(read(walk::timings(b), b), timings, "{}", text);
    }
}
