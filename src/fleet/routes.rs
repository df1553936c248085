//! The alias table: a model name (alias or old name) resolves to the route that serves it.

use std::borrow::Cow;
use std::sync::Arc;

// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;

use crate::config::{Alias, Config};
use prometheus_client::encoding::EncodeLabelValue;

/// Why a request left an alias for its next fallback (or a replica for the next one).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum FallbackReason {
    /// Every replica is down by its health probe.
    down,
    /// Loading its model (by health probe or its 503).
    loading,
    /// Its breaker refuses requests.
    breaker_open,
    /// Connection refused, or failed before the kernel took a byte of the request (a
    /// failure after that ends the request: it is sent nowhere else).
    connect,
    /// The first-byte timeout ran out before a byte of the request was written (connecting).
    timeout,
    /// A 5xx answer.
    status_5xx,
    /// Every slot busy and the queue full.
    overloaded,
    /// The queue wait ran out.
    queue_timeout,
}

/// The aliases a request for `alias` may be served by, in order: the alias, then its
/// fallbacks depth first (each alias once), of those `may` lets the client use — an alias it
/// may not use is left out as if no `fallbacks` named it (and so are the aliases only it leads to).
fn fallback_order(
    table: &RouteTable,
    alias: &Arc<Alias>,
    may: &dyn Fn(&str) -> bool,
) -> Vec<Arc<Alias>> {
    let mut order = vec![Arc::clone(alias)];
    let mut at = 0;
    while at < order.len() {
        let mut next = Vec::new();
        for name in &order[at].fallbacks {
            if let Some(fb) = table.alias(name).filter(|fb| may(&fb.name)) {
                if !order.iter().chain(&next).any(|a| a.name == fb.name) {
                    next.push(Arc::clone(fb));
                }
            }
        }
        at += 1;
        // Depth first: the fallbacks of an alias come right after it.
        let tail = order.split_off(at);
        order.extend(next);
        order.extend(tail);
    }
    order
}

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
    /// Each alias's [`fallback_order`], made once.
    orders: HashMap<String, Vec<Arc<Alias>>>,
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
        let mut table = RouteTable {
            by_name,
            aliases,
            orders: HashMap::default(),
        };
        let orders = table
            .aliases
            .iter()
            .map(|a| (a.name.clone(), fallback_order(&table, a, &|_| true)))
            .collect();
        table.orders = orders;
        table
    }

    /// The aliases that may serve a request for `alias`: itself first, then its fallbacks.
    pub fn order(&self, alias: &str) -> &[Arc<Alias>] {
        self.orders.get(alias).map_or(&[], Vec::as_slice)
    }

    /// [`Self::order`] for a client that may use only the aliases `may` allows: the same
    /// slice when it may use each of them (no allocation), else the order made anew without
    /// the fallbacks it may not use.
    pub fn order_for(&self, alias: &str, may: &dyn Fn(&str) -> bool) -> Cow<'_, [Arc<Alias>]> {
        let order = self.order(alias);
        match order.split_first() {
            Some((first, rest)) if rest.iter().any(|a| !may(&a.name)) => {
                Cow::Owned(fallback_order(self, first, may))
            }
            _ => Cow::Borrowed(order),
        }
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

    #[test]
    fn fallbacks_are_ordered_depth_first_each_once() {
        let cfg = crate::config::from_toml(
            r#"
            [backends.b]
            url = "http://127.0.0.1:1"
            flavor = "llamacpp"
            [aliases.a]
            backend = "b"
            fallbacks = ["x", "y"]
            [aliases.x]
            backend = "b"
            fallbacks = ["z", "y"]
            [aliases.y]
            backend = "b"
            [aliases.z]
            backend = "b"
            fallbacks = ["y"]
            "#,
        )
        .unwrap();
        let t = RouteTable::new(&cfg);
        let names: Vec<&str> = t.order("a").iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a", "x", "z", "y"]);
        assert_eq!(t.order("y").len(), 1);
    }

    #[test]
    fn a_fallback_the_client_may_not_use_is_left_out_with_what_only_it_leads_to() {
        let cfg = crate::config::from_toml(
            r#"
            [backends.b]
            url = "http://127.0.0.1:1"
            flavor = "llamacpp"
            [aliases.a]
            backend = "b"
            fallbacks = ["x", "y"]
            [aliases.x]
            backend = "b"
            fallbacks = ["z", "y"]
            [aliases.y]
            backend = "b"
            [aliases.z]
            backend = "b"
            "#,
        )
        .unwrap();
        let t = RouteTable::new(&cfg);
        let names = |o: &[Arc<Alias>]| o.iter().map(|a| a.name.clone()).collect::<Vec<_>>();
        assert!(matches!(t.order_for("a", &|_| true), Cow::Borrowed(_)));
        assert_eq!(names(&t.order_for("a", &|n| n != "x")), ["a", "y"]);
        assert_eq!(names(&t.order_for("a", &|n| n != "y")), ["a", "x", "z"]);
        assert_eq!(names(&t.order_for("a", &|n| n == "a")), ["a"]);
    }
}
