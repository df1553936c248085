//! Keys in the config's environment variables: the client keys a variable holds, a backend's
//! key as the header it is sent in, the owner a key of `server.api_keys_env` is; none is ever
//! shown in an error.

use http::HeaderValue;

use super::error::ConfigError;

/// Why a key cannot be sent as a header value as it is; never quotes the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UnsendableKey {
    #[error("is empty")]
    Empty,
    #[error("holds {what} at byte {at}, which cannot be sent in a header (the key is not shown)")]
    Holds { what: &'static str, at: usize },
    #[error("is not a header value")]
    NotHeaderValue,
}

/// Why `key` cannot be sent as a header value as it is (nothing if it can): an API key is
/// visible ASCII with no space.
fn sendable(key: &str) -> Result<(), UnsendableKey> {
    if key.is_empty() {
        return Err(UnsendableKey::Empty);
    }
    let Some(at) = key.bytes().position(|b| !b.is_ascii_graphic()) else {
        return Ok(());
    };
    let what = match key.as_bytes()[at] {
        b'\r' | b'\n' => "a line break (CR or LF)",
        b' ' | b'\t' => "a space or tab",
        b if b.is_ascii_control() => "a control character",
        _ => "a character that is not ASCII",
    };
    Err(UnsendableKey::Holds { what, at })
}

/// Who owns the files, batches and usage of a key of `server.api_keys_env`: `key-` and the
/// first 16 hex digits of the key's SHA-256, never the key itself; the same in every process
/// and across restarts.
pub(crate) fn key_owner(key: &str) -> String {
    use sha2::Digest;
    use std::fmt::Write;
    let digest = sha2::Sha256::digest(key.as_bytes());
    digest[..8].iter().fold(String::from("key-"), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// Whether `name` has the form of a key's owner ([`key_owner`]), which no client may be named.
pub(crate) fn is_key_owner(name: &str) -> bool {
    name.strip_prefix("key-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A backend key as the sensitive `Authorization: Bearer …` value it is sent in, or why it
/// cannot be one.
pub(crate) fn bearer(key: &str) -> Result<HeaderValue, UnsendableKey> {
    sendable(key)?;
    let mut v = HeaderValue::try_from(format!("Bearer {key}"))
        .map_err(|_| UnsendableKey::NotHeaderValue)?;
    v.set_sensitive(true);
    Ok(v)
}

/// The comma-separated keys in the environment variable `var` (`key` names the setting);
/// each must be sendable: a key no header can carry would never match what a client sends.
pub(super) fn keys_of(key: &str, var: &str, errs: &mut Vec<ConfigError>) -> Vec<String> {
    let Ok(v) = std::env::var(var) else {
        errs.push(ConfigError::BadValue {
            key: key.into(),
            value: var.into(),
            reason: "is not set in the environment".into(),
        });
        return Vec::new();
    };
    let keys: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    if keys.is_empty() {
        errs.push(ConfigError::BadValue {
            key: key.into(),
            value: var.into(),
            reason: "holds no keys".into(),
        });
    }
    for (i, k) in keys.iter().enumerate() {
        if let Err(reason) = sendable(k) {
            errs.push(ConfigError::BadValue {
                key: key.into(),
                value: var.into(),
                reason: format!("key {} of {}: {reason}", i + 1, keys.len()),
            });
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_owner_is_a_hash_of_it_in_the_form_no_client_may_take() {
        // The first 8 bytes of SHA-256("sk-1"), as `sha256sum` prints them.
        assert_eq!(key_owner("sk-1"), "key-0f2c10bf3d128c71");
        assert_ne!(key_owner("sk-2"), key_owner("sk-1"));
        assert!(is_key_owner(&key_owner("sk-1")));
        for name in [
            "key-0f2c10bf3d128c7",
            "key-0f2c10bf3d128c71a",
            "key-0f2c10bf3d128c7g",
            "ann",
        ] {
            assert!(!is_key_owner(name), "{name}");
        }
    }
}
