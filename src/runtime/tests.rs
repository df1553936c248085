//! The registry held: one runtime per flavour, in its order, with facts that agree.

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
