//! What a backend, an alias, an old name or a client may be called: what labels, URLs, headers
//! and the status page carry as it is.

use super::error::ConfigError;

/// Longest name of a backend, alias, old name or client.
pub(crate) const NAME_LIMIT: usize = 128;

/// Whether `name` can name a backend, an alias or a client: what a Prometheus label value, a URL path
/// (`/v1/models/NAME`), a header value (`x-switchboard-alias`) and the status page carry as it
/// is: ASCII letters and digits and `.`, `_`, `-`, `:`, `/`, `@`, `+`, from a letter or digit
/// on, at most [`NAME_LIMIT`] bytes (model names as runtimes and hubs spell them:
/// `qwen3-coder:30b`, `Qwen/Qwen3-8B`).
pub(crate) fn is_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= NAME_LIMIT
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-:/@+".contains(c))
}

pub(crate) fn name_check(key: &str, name: &str, errs: &mut Vec<ConfigError>) {
    if !is_name(name) {
        errs.push(ConfigError::BadValue {
            key: key.to_string(),
            value: crate::echo::Echo::new(name).to_string(),
            reason: format!("is not a name: use ASCII letters, digits and . _ - : / @ + (from a letter or digit on, at most {NAME_LIMIT} bytes)"),
        });
    }
}
