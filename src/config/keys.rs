//! Keys in the config's environment variables: the client keys a variable holds, a backend's
//! key as the header it is sent in; none is ever shown in an error.

use http::HeaderValue;

use super::error::ConfigError;

/// Why `key` cannot be sent as a header value as it is (nothing if it can): an API key is
/// visible ASCII with no space. The reason never quotes the key.
fn sendable(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("is empty".into());
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
    Err(format!(
        "holds {what} at byte {at}, which cannot be sent in a header (the key is not shown)"
    ))
}

/// A backend key as the sensitive `Authorization: Bearer …` value it is sent in, or why it
/// cannot be one.
pub fn bearer(key: &str) -> Result<HeaderValue, String> {
    sendable(key)?;
    let mut v =
        HeaderValue::try_from(format!("Bearer {key}")).map_err(|_| "is not a header value")?;
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
