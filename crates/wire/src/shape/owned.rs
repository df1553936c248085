//! Members the proxy owns and a client may not send: the choice of a backend's slot and of
//! whose prompt cache a request may meet.
//!
//! llama-server takes the last of a repeated member, so a client's own `id_slot` after the
//! proxy's would pick the slot (and so whose cache it lands on); its `cache_prompt` would reuse
//! what another client left there. vLLM's and SGLang's `cache_salt` (SGLang's `extra_key`)
//! name a prefix cache's namespace: a client naming another's reads its prefixes. Each is
//! removed at the top level of a request body, however its key is spelled (escapes
//! included); the proxy writes its own where it decides one.

/// The members removed from every request body.
pub(crate) const OWNED: [&str; 4] = ["id_slot", "cache_prompt", "cache_salt", "extra_key"];

/// Whether `body` may hold a member of [`OWNED`] at its top level: a key written as it is
/// (`id_slot`, `cache_…`, `extra_key`), or an escape of a printable ASCII character
/// (`\u0020` to `\u007f`: the only escape that can spell a letter or `_`; the escapes of
/// other text, `\u00e9` or `\u4e2d`, cannot). `false` proves it holds none; `true` asks for
/// a full read of its members.
pub(crate) fn may_hold(body: &[u8]) -> bool {
    let ascii_escape = memchr::memmem::find_iter(body, br"\u00")
        .any(|at| matches!(body.get(at + 4), Some(b'2'..=b'7')));
    ascii_escape
        || [&b"id_slot"[..], b"cache_", b"extra_key"]
            .iter()
            .any(|key| memchr::memmem::find(body, key).is_some())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    /// `key` with its characters at `escaped` (a bit each) written as `\u00XX`.
    fn spelled(key: &str, escaped: u32) -> String {
        key.chars()
            .enumerate()
            .map(|(i, c)| {
                if escaped & (1 << (i % 32)) != 0 && i % 2 == 0 {
                    format!("\\u{:04x}", c as u32)
                } else if escaped & (1 << (i % 32)) != 0 {
                    format!("\\u{:04X}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect()
    }

    proptest! {
        /// The precheck never says "none" for a body a full parse finds an owned member in.
        #[test]
        fn a_body_the_parse_finds_an_owned_member_in_is_never_passed_over(
            owned in 0usize..4,
            escaped in any::<u32>(),
            others in proptest::collection::vec(("[a-z_]{1,12}", any::<u8>()), 0..6),
            at in any::<prop::sample::Index>(),
            space in "[ \t\n\r]{0,2}",
        ) {
            let mut members: Vec<String> = others
                .iter()
                .map(|(k, v)| format!("\"{k}\"{space}:{space}{v}"))
                .collect();
            let key = spelled(OWNED[owned], escaped);
            members.insert(at.index(members.len() + 1), format!("\"{key}\":{space}1"));
            let body = format!("{{{space}{}{space}}}", members.join(","));
            let parsed: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&body).unwrap();
            prop_assert!(parsed.contains_key(OWNED[owned]));
            prop_assert!(may_hold(body.as_bytes()), "{}", body);
        }

        /// A body the precheck passes over holds no owned member for the parse either.
        #[test]
        fn a_body_passed_over_holds_no_owned_member(
            others in proptest::collection::vec(("[a-z_\\\\]{1,12}", "[a-z0-9 ]{0,8}"), 0..8),
        ) {
            let members: Vec<String> = others
                .iter()
                .map(|(k, v)| format!("{}:{}", serde_json::json!(k), serde_json::json!(v)))
                .collect();
            let body = format!("{{{}}}", members.join(","));
            if !may_hold(body.as_bytes()) {
                let parsed: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(&body).unwrap();
                prop_assert!(OWNED.iter().all(|k| !parsed.contains_key(*k)), "{}", body);
            }
        }
    }

    #[test]
    fn plain_bodies_are_passed_over() {
        assert!(!may_hold(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#
        ));
        assert!(may_hold(br#"{"model":"m","id_slot":1}"#));
        assert!(may_hold(br#"{"model":"m","id\u005fslot":1}"#));
    }
}
