//! The registry held: one runtime per flavour, in its order, with facts that agree, each
//! described in the docs.

use super::*;
use clap::ValueEnum;

#[test]
fn each_flavor_has_its_runtime_in_the_registry() {
    let flavors = Flavor::value_variants();
    assert_eq!(RUNTIMES.len(), flavors.len(), "a runtime per flavour");
    for &f in flavors {
        assert_eq!(
            f.runtime().name,
            f.as_str(),
            "RUNTIMES is in Flavor's order"
        );
    }
    let mut names: Vec<&str> = RUNTIMES.iter().map(|r| r.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), RUNTIMES.len(), "a runtime name twice");
}

#[test]
fn each_runtimes_facts_agree() {
    for r in RUNTIMES {
        let n = r.name;
        assert!(r.health_path.starts_with('/'), "{n}: health path");
        for load in r.load {
            assert!(load.path().starts_with('/'), "{n}: load path");
        }
        assert!(r.serves.contains(&"chat"), "{n}: serves chat completions");
        for c in r.count_paths {
            assert!(c.path.starts_with('/'), "{n}: counting path {}", c.path);
            assert!(
                r.serves.contains(&c.api),
                "{n}: counts {} it does not serve",
                c.api
            );
        }
        match r.tokenize {
            Some(Tokenize::Templated { template, tokenize }) => {
                assert!(
                    template.starts_with('/') && tokenize.starts_with('/'),
                    "{n}"
                );
            }
            Some(Tokenize::Messages { path, .. }) => assert!(path.starts_with('/'), "{n}"),
            None => {}
        }
        // Slots are "auto" exactly where discovery reads a slot count.
        let reports_slots = matches!(r.discovery, Discovery::Props | Discovery::ServerInfo);
        assert_eq!(r.slots_unknown.is_none(), reports_slots, "{n}: slots");
        for why in [r.slots_unknown, r.window_unknown].into_iter().flatten() {
            assert!(why.starts_with("needs a number: "), "{n}: {why}");
        }
    }
    assert_eq!(
        names_with(|r| r.tokenize.is_some()),
        "llamacpp, vllm or sglang"
    );
    assert_eq!(
        Flavor::Llamacpp.runtime().count_path("messages"),
        Some("/v1/messages/count_tokens")
    );
    assert_eq!(Flavor::Openai.runtime().count_path("messages"), None);
}

/// The rows of the table in `text`'s section under `heading`, by their first cell's name.
fn rows<'a>(text: &'a str, heading: &str) -> Vec<(&'a str, &'a str)> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no section {heading}"));
    let section = &text[start + heading.len()..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .collect()
}

#[test]
fn the_architecture_docs_describe_each_runtime() {
    let doc = include_str!("../../../../docs/ARCHITECTURE.md");
    let rows = rows(doc, "\n## Runtimes\n");
    for r in RUNTIMES {
        let row = rows
            .iter()
            .find(|(name, _)| *name == r.name)
            .map(|(_, row)| *row)
            .unwrap_or_else(|| {
                panic!(
                    "docs/ARCHITECTURE.md: no row for runtime {} in its Runtimes table",
                    r.name
                )
            });
        assert!(
            row.contains(&format!("`{}`", r.health_path)),
            "docs/ARCHITECTURE.md: the row of {} does not give its health path {}",
            r.name,
            r.health_path
        );
    }
    for (name, _) in &rows {
        assert!(
            RUNTIMES.iter().any(|r| r.name == *name),
            "docs/ARCHITECTURE.md: a row for {name}, which is no registered runtime"
        );
    }
}

#[test]
fn the_config_docs_name_each_runtime() {
    let doc = include_str!("../../../../docs/CONFIG.md");
    let row = doc
        .lines()
        .find(|l| l.starts_with("| `flavor` |"))
        .expect("docs/CONFIG.md: no row for the flavor key");
    for r in RUNTIMES {
        assert!(
            row.contains(&format!("`{}`", r.name)),
            "docs/CONFIG.md: the flavor row does not name runtime {}",
            r.name
        );
    }
}
