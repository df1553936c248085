//! Numbers read by hand, held to serde_json's reading of the same text.

use super::*;
use proptest::prelude::*;

/// serde_json's reading of the number that ends `text` at `end` (as a struct's field reads
/// it), where the reader left off.
fn serde<T: serde::de::DeserializeOwned>(text: &[u8], end: usize) -> Option<T> {
    serde_json::from_slice(&text[..end]).ok()
}

#[test]
fn backends_numbers_are_read_as_serde_json_reads_them() {
    for text in ["0", "17", "1796026244", "18446744073709551615"] {
        let (n, end) = u64_at(text.as_bytes(), 0).unwrap();
        assert_eq!((Some(n), end), (serde(text.as_bytes(), end), text.len()));
    }
    for text in [
        "3.426",
        "6713.368359603036",
        "696.6434452184927",
        "0.000361",
        "17000000.0",
        "0",
        "-0",
        "-2.5",
        "0.0000000000000000001",
        "0.14895652173913043",
        "0.00017999999999999998",
        "9007199254740993",
    ] {
        let (f, end) = f64_at(text.as_bytes(), 0).unwrap();
        let read: f64 = serde(text.as_bytes(), end).unwrap();
        assert_eq!((f.to_bits(), end), (read.to_bits(), text.len()), "{text}");
    }
    // What they cannot read exactly is left to serde_json.
    for text in [
        "",
        "-1",
        "1.0",
        "1e3",
        "01",
        "18446744073709551616",
        "x",
        "null",
    ] {
        assert_eq!(u64_at(text.as_bytes(), 0), None, "{text}");
    }
    for text in [
        "1e3",
        "2.5E-1",
        "00.5",
        "1.",
        ".5",
        "-",
        "18446744073709551616",
        "1844674407370955161.6",
        "0.00000000000000000000001",
        "null",
    ] {
        assert_eq!(f64_at(text.as_bytes(), 0), None, "{text}");
    }
}

#[test]
fn a_number_ends_where_its_digits_do() {
    let text = br#"{"prompt_n":23,"prompt_ms":3.426}"#;
    assert_eq!(u64_at(text, 12), Some((23, 14)));
    assert_eq!(f64_at(text, 27), Some((3.426, 32)));
}

proptest! {
    /// Whatever follows it, a number the readers read is what serde_json reads, to the bit,
    /// and it ends where serde_json's reading of it does.
    #[test]
    fn a_number_read_by_hand_is_serde_jsons(
        number in crate::respell::number(),
        after in prop::sample::select(vec!["", ",", "}", " ", "]", "\n"]),
        before in prop::sample::select(vec!["", ":", ": "]),
    ) {
        let text = format!("{before}{number}{after}");
        let b = text.as_bytes();
        let at = before.len();
        if let Some((n, end)) = u64_at(b, at) {
            prop_assert_eq!(end, at + number.len());
            prop_assert_eq!(Some(n), serde::<u64>(&b[at..], number.len()));
        }
        if let Some((f, end)) = f64_at(b, at) {
            prop_assert_eq!(end, at + number.len());
            let read = serde::<f64>(&b[at..], number.len()).map(f64::to_bits);
            prop_assert_eq!(Some(f.to_bits()), read, "{}", number);
        }
        // Plain digits that fit are always read.
        let plain = !number.is_empty() && number.bytes().all(|c| c.is_ascii_digit())
            && (number == "0" || !number.starts_with('0')) && number.parse::<u64>().is_ok();
        prop_assert_eq!(u64_at(b, at).is_some(), plain, "{}", number);
    }
}
