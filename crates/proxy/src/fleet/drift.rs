//! Drift: where an alias's config disagrees with what its backend reported (`check --probe`).

use std::collections::BTreeMap;
use std::fmt;

use super::discovery::{Discovered, DiscoveryError};
use crate::config::{Alias, Config, Input, Sizing};

/// One disagreement between routes.toml and the backend, for one alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Disagreement {
    pub(crate) alias: String,
    /// The config key concerned, e.g. `context_window` or `backends.gpu.slots`.
    pub(crate) key: String,
    pub(crate) configured: String,
    pub(crate) discovered: String,
    /// What the disagreement does to requests.
    pub(crate) effect: String,
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "alias {}: {}: configured {}, discovered {}: {}",
            self.alias, self.key, self.configured, self.discovered, self.effect
        )
    }
}

fn kinds(input: Input) -> String {
    format!("[{}]", input.names().join(", "))
}

/// Every disagreement of `alias` with what its backend reported (or failed to).
pub(crate) fn compare(
    alias: &Alias,
    found: &Result<Discovered, DiscoveryError>,
) -> Vec<Disagreement> {
    let backend = &alias.backend;
    let one = |key: String, configured: String, discovered: String, effect: String| Disagreement {
        alias: alias.name.clone(),
        key,
        configured,
        discovered,
        effect,
    };
    let found = match found {
        Ok(f) => f,
        Err(e) => {
            return vec![one(
                format!("backends.{}", backend.name),
                backend.url.clone(),
                e.to_string(),
                "the backend could not be asked what it serves".into(),
            )]
        }
    };
    let mut out = Vec::new();
    let window = found.window_for(&alias.upstream_model);
    match (alias.window_setting, window) {
        (Some(Sizing::Fixed(w)), Some(d)) if w.get() > d => out.push(one(
            "context_window".into(),
            w.to_string(),
            format!("{d} per slot"),
            format!(
                "a request between {d} and {w} tokens passes the guard and fails at the backend"
            ),
        )),
        (Some(Sizing::Auto), None) => out.push(one(
            "context_window".into(),
            "auto".into(),
            "nothing".into(),
            "the backend reports no window, so the alias has no context guard".into(),
        )),
        _ => {}
    }
    let slots_key = format!("backends.{}.slots", backend.name);
    match (backend.slots_setting, found.slots) {
        (Sizing::Fixed(n), Some(d)) if n.get() > d => out.push(one(
            slots_key,
            n.to_string(),
            d.to_string(),
            format!("requests beyond {d} at once wait in a queue inside the backend"),
        )),
        (Sizing::Auto, None) => out.push(one(
            slots_key,
            "auto".into(),
            "nothing".into(),
            "the backend reports no slot count, so 1 slot is in force".into(),
        )),
        _ => {}
    }
    if let Some(taken) = found.inputs {
        let refused = alias.shape.inputs.beyond(taken);
        if refused != Input::default() {
            let names: Vec<&str> = refused.names().into_iter().skip(1).collect();
            out.push(one(
                "inputs".into(),
                kinds(alias.shape.inputs),
                kinds(taken),
                format!("the model does not take {}", names.join(" or ")),
            ));
        }
    }
    if found.serves(&alias.upstream_model) == Some(false) {
        out.push(one(
            "upstream_model".into(),
            format!("{:?}", alias.upstream_model),
            format!("[{}]", found.model_names()),
            "the backend does not serve that model name".into(),
        ));
    }
    out
}

/// One line on an alias that agrees with its backend: the figures compared.
pub(crate) fn agreement(alias: &Alias, found: &Discovered) -> String {
    let window = found
        .window_for(&alias.upstream_model)
        .map_or("not reported".into(), |w| w.to_string());
    let slots = found.slots.map_or("not reported".into(), |s| s.to_string());
    let inputs = found.inputs.map_or("not reported".into(), kinds);
    format!(
        "alias {}: ok (context_window {} / backend {window}, slots {} / backend {slots}, inputs {} / backend {inputs})",
        alias.name,
        alias
            .window_setting
            .map_or("unset".into(), |w| w.to_string()),
        alias.backend.slots_setting,
        kinds(alias.shape.inputs),
    )
}

/// What each backend answered, by backend name.
pub(crate) type Probed = BTreeMap<String, Result<Discovered, DiscoveryError>>;

/// The lines of `check --probe`, alias by alias: each disagreement, or one line saying the
/// alias agrees; and how many disagreements there are.
pub fn report(config: &Config, probed: &Probed) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut count = 0;
    for alias in config.aliases.values() {
        let Some(found) = probed.get(&alias.backend.name) else {
            continue;
        };
        let found_wrong = compare(alias, found);
        match (found_wrong.is_empty(), found) {
            (true, Ok(f)) => lines.push(agreement(alias, f)),
            _ => {
                count += found_wrong.len();
                lines.extend(found_wrong.iter().map(ToString::to_string));
            }
        }
    }
    (lines, count)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::fleet::discovery::ServedModel;

    /// Alias `a` on backend `b`; `extra` holds its keys (`upstream_model` defaults to `m`).
    fn alias(extra: &str, slots: &str) -> std::sync::Arc<Alias> {
        let extra = if extra.contains("upstream_model") {
            extra.to_string()
        } else {
            format!("upstream_model = \"m\"\n{extra}")
        };
        let cfg = crate::config::from_toml(&format!(
            "[backends.b]\nurl = \"http://h:1\"\nflavor = \"llamacpp\"\nslots = {slots}\n\
             [aliases.a]\nbackend = \"b\"\n{extra}"
        ))
        .unwrap();
        std::sync::Arc::clone(&cfg.aliases["a"])
    }

    fn found(window: u32, slots: u32, image: bool) -> Discovered {
        Discovered {
            window_per_slot: Some(window),
            slots: Some(slots),
            inputs: Some(Input {
                image,
                audio: false,
            }),
            models: vec![ServedModel {
                id: "m".into(),
                window: None,
            }],
            when: 1,
        }
    }

    #[test]
    fn every_disagreement_names_alias_key_and_both_values() {
        let a = alias(
            "context_window = 8192\ninputs = [\"text\", \"image\", \"audio\"]\nupstream_model = \"x\"",
            "4",
        );
        let lines: Vec<String> = compare(&a, &Ok(found(4096, 2, true)))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(
            lines[0]
                .starts_with("alias a: context_window: configured 8192, discovered 4096 per slot"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("alias a: backends.b.slots: configured 4, discovered 2"),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("inputs: configured [text, image, audio], discovered [text, image]: the model does not take audio"), "{}", lines[2]);
        assert!(
            lines[3].contains("upstream_model: configured \"x\", discovered [m]"),
            "{}",
            lines[3]
        );
    }

    #[test]
    fn smaller_figures_and_auto_that_was_found_agree() {
        let a = alias("context_window = 2048", "1");
        assert!(compare(&a, &Ok(found(4096, 2, false))).is_empty());
        let a = alias("context_window = \"auto\"", "\"auto\"");
        assert!(compare(&a, &Ok(found(4096, 2, false))).is_empty());
        let mut none = found(4096, 2, false);
        none.window_per_slot = None;
        none.slots = None;
        assert_eq!(compare(&a, &Ok(none)).len(), 2);
    }

    #[test]
    fn an_unreachable_backend_is_a_disagreement() {
        let a = alias("", "1");
        let d = compare(&a, &Err(DiscoveryError::Unreachable("refused".into())));
        assert_eq!(d.len(), 1);
        assert!(
            d[0].to_string()
                .contains("backends.b: configured http://h:1, discovered unreachable: refused"),
            "{}",
            d[0]
        );
    }
}
