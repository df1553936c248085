//! The alias table: a model name (alias or old name) resolves to the route that serves it.

use std::sync::Arc;

// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;

use crate::config::{Alias, Config};

/// What a request for one model name is served by.
#[derive(Debug, Clone)]
pub struct Route {
    pub alias: Arc<Alias>,
    /// Set when the request used an old name of the alias.
    pub deprecated_name: Option<String>,
}

/// Alias and old names → route. Built once per config snapshot.
#[derive(Debug, Default)]
pub struct RouteTable {
    by_name: HashMap<String, (Arc<Alias>, bool)>,
    aliases: Vec<Arc<Alias>>,
}

impl RouteTable {
    pub fn new(config: &Config) -> Self {
        let mut by_name = HashMap::default();
        let mut aliases = Vec::new();
        for alias in config.aliases.values() {
            by_name.insert(alias.name.clone(), (Arc::clone(alias), false));
            for old in &alias.old_names {
                by_name.insert(old.clone(), (Arc::clone(alias), true));
            }
            aliases.push(Arc::clone(alias));
        }
        RouteTable { by_name, aliases }
    }

    /// The route for `model`, or `None` when no alias or old name matches.
    pub fn resolve(&self, model: &str) -> Option<Route> {
        self.by_name.get(model).map(|(alias, old)| Route {
            alias: Arc::clone(alias),
            deprecated_name: old.then(|| model.to_string()),
        })
    }

    /// The alias by its current name only.
    pub fn alias(&self, name: &str) -> Option<&Arc<Alias>> {
        match self.by_name.get(name) {
            Some((alias, false)) => Some(alias),
            _ => None,
        }
    }

    /// Every alias (not old names), sorted by name.
    pub fn aliases(&self) -> &[Arc<Alias>] {
        &self.aliases
    }

    /// Comma-separated alias names, for the `model_not_found` message.
    pub fn known(&self) -> String {
        let names: Vec<&str> = self.aliases.iter().map(|a| a.name.as_str()).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = r#"
        [backends.b]
        url = "http://127.0.0.1:1"
        flavor = "llamacpp"
        [aliases.new-name]
        backend = "b"
        upstream_model = "up"
        old_names = ["old-name"]
    "#;

    #[test]
    fn resolves_alias_and_old_name() {
        let cfg = crate::config::from_toml(CFG).unwrap();
        let t = RouteTable::new(&cfg);
        let r = t.resolve("new-name").unwrap();
        assert_eq!(r.alias.upstream_model, "up");
        assert!(r.deprecated_name.is_none());
        let r = t.resolve("old-name").unwrap();
        assert_eq!(r.alias.name, "new-name");
        assert_eq!(r.deprecated_name.as_deref(), Some("old-name"));
        assert!(t.resolve("nope").is_none());
        assert!(t.alias("old-name").is_none());
        assert_eq!(t.known(), "new-name");
    }
}
