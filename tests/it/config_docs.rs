//! The config keys, the example file and the reference held together: every key a raw config
//! struct accepts is shown in `routes.toml` (set or commented out) under its section, and has
//! a row in its section's table in docs/CONFIG.md; and every key those tables name is one the
//! structs accept. A key added, renamed or removed in one place fails here until the others
//! follow.

use std::collections::BTreeSet;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The fields of `struct NAME { … }` in `source` (public to its crate or to all), one a line
/// as `key: Type`.
fn fields(source: &str, name: &str) -> BTreeSet<String> {
    let start = source
        .find(&format!(" struct {name} {{"))
        .unwrap_or_else(|| panic!("no struct {name}"));
    let body = &source[start..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines()
        .skip(1)
        .map(|l| l.trim())
        .filter(|l| !l.starts_with("//") && !l.starts_with("#["))
        .map(|l| {
            l.trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ")
        })
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.trim().to_string()))
        .filter(|k| !k.contains(' '))
        .collect()
}

/// The lines of `text` from the heading line starting with `heading` to the next `## `.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n{heading}"))
        .unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

/// The keys named in the first cell of each row of the tables in `text`.
fn table_keys(text: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cell = line[1..].split('|').next().unwrap();
        for part in cell.split('`').skip(1).step_by(2) {
            keys.insert(part.to_string());
        }
    }
    keys
}

/// The keys set or shown commented out (`# key = …`) in routes.toml's tables whose header
/// (set or commented out) starts with `[prefix`.
fn example_keys(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut inside = false;
    for line in text.lines() {
        let bare = line.trim_start_matches('#').trim();
        if bare.starts_with('[') && bare.ends_with(']') && !bare.contains('"') {
            inside = bare.starts_with(&format!("[{prefix}"));
            continue;
        }
        if !inside {
            continue;
        }
        if let Some((key, _)) = bare.split_once('=') {
            let key = key.trim();
            if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                keys.insert(key.to_string());
            }
        }
    }
    keys
}

#[test]
fn every_config_key_is_in_the_example_and_the_reference_and_no_other() {
    let docs = read("docs/CONFIG.md");
    let example = read("routes.toml");
    let mut problems = Vec::new();
    // Each section's raw struct, in its section's file under crates/proxy/src/config/.
    for (file, name, heading, prefix) in [
        ("server.rs", "RawServer", "## `[server]`", "server"),
        (
            "backends.rs",
            "RawBackend",
            "## `[backends.NAME]`",
            "backends.",
        ),
        ("aliases.rs", "RawAlias", "## `[aliases.NAME]`", "aliases."),
        ("clients.rs", "RawClient", "## `[clients.NAME]`", "clients."),
        (
            "clients.rs",
            "RawClass",
            "## `[priority.CLASS]`",
            "priority.",
        ),
        ("tracing.rs", "RawTracing", "## `[tracing]`", "tracing"),
        ("ledger.rs", "RawLedger", "## `[ledger]`", "ledger"),
        ("batches.rs", "RawBatches", "## `[batches]`", "batches"),
    ] {
        let keys = fields(&read(&format!("crates/proxy/src/config/{file}")), name);
        assert!(!keys.is_empty(), "{name}: no fields read");
        let documented = table_keys(section(&docs, heading));
        let shown = example_keys(&example, prefix);
        for k in &keys {
            if !documented.contains(k) {
                problems.push(format!("{heading}: `{k}` has no row in docs/CONFIG.md"));
            }
            if !shown.contains(k) {
                problems.push(format!("[{prefix}…]: `{k}` is not shown in routes.toml"));
            }
        }
        for k in documented.difference(&keys) {
            problems.push(format!(
                "{heading}: docs/CONFIG.md has `{k}`, which {name} does not accept"
            ));
        }
        for k in shown.difference(&keys) {
            problems.push(format!(
                "[{prefix}…]: routes.toml shows `{k}`, which {name} does not accept"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
