//! Figures in force: `"auto"` windows and slots taken from what the backends reported, and
//! where each figure of an alias comes from.

use std::num::NonZeroU32;
use std::sync::Arc;

// foldhash: keyed by backend names from the config (no untrusted keys).
use foldhash::HashMap;

use super::Snapshot;
use crate::config::{Alias, Backend, Config, Sizing};
use crate::fleet::discovery::Discovered;

/// What each backend reported, by backend name.
pub(crate) type Found = HashMap<String, Arc<Discovered>>;

/// Discoveries just made, each with the backend it asked.
pub(crate) type Fresh = Vec<(Arc<Backend>, Arc<Discovered>)>;

/// Whether `config` still has `backend` (same name, URL and flavour).
fn still_has(config: &Config, backend: &Backend) -> bool {
    config
        .backends
        .get(&backend.name)
        .is_some_and(|n| n.url == backend.url && n.flavor == backend.flavor)
}

/// Where a figure in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The number in routes.toml.
    Config,
    /// `"auto"`, taken from the backend at `at` (unix seconds).
    Discovered { at: u64 },
    /// `"auto"`, not discovered yet: no guard for a window, 1 for slots.
    Pending,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Discovered { .. } => "discovered",
            Source::Pending => "pending",
        }
    }

    /// When the figure was discovered, if it was.
    pub(crate) fn discovered_at(self) -> Option<u64> {
        match self {
            Source::Discovered { at } => Some(at),
            _ => None,
        }
    }
}

/// The window and slots an alias runs with, and where they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Tokens per conversation; `None`: no guard.
    pub window: Option<u32>,
    /// `None` when `context_window` is not set.
    pub window_source: Option<Source>,
    pub(crate) slots: u32,
    pub slots_source: Source,
}

/// The discoveries that hold for `config`: those of `previous` for backends still at the
/// same URL with the same flavour, with `fresh` ones on top.
pub(crate) fn carry(config: &Config, previous: Option<&Snapshot>, fresh: Fresh) -> Found {
    let mut found = Found::default();
    if let Some(p) = previous {
        for (name, d) in &p.found {
            if p.config
                .backends
                .get(name)
                .is_some_and(|b| still_has(config, b))
            {
                found.insert(name.clone(), Arc::clone(d));
            }
        }
    }
    for (b, d) in fresh {
        if still_has(config, &b) {
            found.insert(b.name.clone(), d);
        }
    }
    found
}

/// The slots in force for `backend`.
fn slots(backend: &Backend, found: &Found) -> NonZeroU32 {
    match backend.slots_setting {
        Sizing::Fixed(n) => n,
        Sizing::Auto => found
            .get(&backend.name)
            .and_then(|d| d.slots)
            .and_then(NonZeroU32::new)
            .unwrap_or(NonZeroU32::MIN),
    }
}

/// The window in force for `alias`.
fn window(alias: &Alias, found: &Found) -> Option<NonZeroU32> {
    match alias.window_setting? {
        Sizing::Fixed(n) => Some(n),
        Sizing::Auto => found
            .get(&alias.backend.name)?
            .window_for(&alias.upstream_model)
            .and_then(NonZeroU32::new),
    }
}

/// `config` with every `"auto"` figure put in force from `found` (and those not found at
/// their stand-ins: no window, 1 slot). Depends only on the configured settings, so applying
/// it to a config it made gives the same figures again.
pub(crate) fn apply(config: Config, found: &Found) -> Config {
    let backends: std::collections::BTreeMap<String, Arc<Backend>> = config
        .backends
        .iter()
        .map(|(name, b)| {
            let n = slots(b, found);
            let b = if n == b.slots {
                Arc::clone(b)
            } else {
                Arc::new(Backend {
                    slots: n,
                    ..(**b).clone()
                })
            };
            (name.clone(), b)
        })
        .collect();
    let aliases = config
        .aliases
        .iter()
        .map(|(name, a)| {
            let now = |b: &Arc<Backend>| {
                backends
                    .get(&b.name)
                    .map_or_else(|| Arc::clone(b), Arc::clone)
            };
            let backend = now(&a.backend);
            // Every replica with its figures in force, not only the first.
            let replicas: Vec<Arc<Backend>> = a.backends.iter().map(now).collect();
            let same = replicas
                .iter()
                .zip(&a.backends)
                .all(|(n, o)| Arc::ptr_eq(n, o));
            let w = window(a, found);
            let a = if w == a.context_window && Arc::ptr_eq(&backend, &a.backend) && same {
                Arc::clone(a)
            } else {
                Arc::new(Alias {
                    backend,
                    backends: replicas,
                    context_window: w,
                    ..(**a).clone()
                })
            };
            (name.clone(), a)
        })
        .collect();
    Config {
        server: config.server,
        backends,
        aliases,
        clients: config.clients,
        tracing: config.tracing,
        ledger: config.ledger,
        batches: config.batches,
    }
}

/// Where `alias`'s figures come from, given what was `found`.
pub(crate) fn figures(alias: &Alias, found: &Found) -> Figures {
    let at = found.get(&alias.backend.name).map(|d| d.when);
    let source = |setting: Sizing, known: bool| match (setting, at) {
        (Sizing::Fixed(_), _) => Source::Config,
        (Sizing::Auto, Some(at)) if known => Source::Discovered { at },
        (Sizing::Auto, _) => Source::Pending,
    };
    let window = alias.context_window.map(NonZeroU32::get);
    let slots = alias.backend.slots.get();
    let slots_known = found
        .get(&alias.backend.name)
        .is_some_and(|d| d.slots.is_some_and(|s| s > 0));
    Figures {
        window,
        window_source: alias.window_setting.map(|s| source(s, window.is_some())),
        slots,
        slots_source: source(alias.backend.slots_setting, slots_known),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const CFG: &str = r#"
        [backends.auto]
        url = "http://h:1"
        flavor = "llamacpp"
        slots = "auto"
        [backends.fixed]
        url = "http://h:2"
        flavor = "vllm"
        slots = 3
        [aliases.a]
        backend = "auto"
        context_window = "auto"
        [aliases.f]
        backend = "fixed"
        context_window = 1000
    "#;

    fn found(window: u32, slots: u32) -> Found {
        let mut f = Found::default();
        f.insert(
            "auto".into(),
            Arc::new(Discovered {
                window_per_slot: Some(window),
                slots: Some(slots),
                inputs: None,
                models: Vec::new(),
                when: 77,
            }),
        );
        f
    }

    #[test]
    fn auto_figures_are_pending_until_found_then_taken_and_reapplied() {
        let cfg = crate::config::from_toml(CFG).unwrap();
        let pending = apply(cfg.clone(), &Found::default());
        let a = &pending.aliases["a"];
        assert_eq!((a.context_window, a.backend.slots.get()), (None, 1));
        let fig = figures(a, &Found::default());
        assert_eq!(fig.window_source, Some(Source::Pending));
        assert_eq!(fig.slots_source, Source::Pending);

        let f = found(4096, 3);
        let taken = apply(pending, &f);
        let a = &taken.aliases["a"];
        assert_eq!(a.context_window.map(NonZeroU32::get), Some(4096));
        assert_eq!(a.backend.slots.get(), 3);
        assert_eq!(taken.backends["auto"].slots.get(), 3);
        let fig = figures(a, &f);
        assert_eq!(fig.window_source, Some(Source::Discovered { at: 77 }));
        assert_eq!(fig.slots_source.discovered_at(), Some(77));

        let rediscovered = apply(taken, &found(2048, 2));
        assert_eq!(
            rediscovered.aliases["a"]
                .context_window
                .map(NonZeroU32::get),
            Some(2048)
        );
        let f = &rediscovered.aliases["f"];
        assert_eq!(f.context_window.map(NonZeroU32::get), Some(1000));
        assert_eq!(figures(f, &Found::default()).slots_source, Source::Config);
    }
}
