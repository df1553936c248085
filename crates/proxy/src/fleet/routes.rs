//! The alias table: a model name (alias or old name) resolves to the route that serves it,
//! and each alias to the order of aliases that may serve its requests. Generic over what an
//! alias is held as: the snapshot's live aliases (`crate::live::alias::LiveAlias`), or the
//! config's own [`Alias`] where only names matter.

use std::borrow::Cow;
use std::sync::Arc;

// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;

use crate::config::Alias;
#[cfg(test)]
use crate::config::Config;
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
fn fallback_order<A: AsRef<Alias>>(
    table: &RouteTable<A>,
    alias: &Arc<A>,
    may: &dyn Fn(&str) -> bool,
) -> Vec<Arc<A>> {
    let mut order = vec![Arc::clone(alias)];
    let mut at = 0;
    while at < order.len() {
        let mut next = Vec::new();
        for name in &spec(&order[at]).fallbacks {
            if let Some(fb) = table.alias(name).filter(|fb| may(&spec(fb).name)) {
                let fb_name = &spec(fb).name;
                if !order.iter().chain(&next).any(|a| spec(a).name == *fb_name) {
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
#[derive(Debug)]
pub struct Route<A = Alias> {
    pub alias: Arc<A>,
    /// Set when the request used an old name of the alias.
    pub(crate) deprecated_name: Option<String>,
}

/// Alias and old names → route. Built once per config snapshot.
#[derive(Debug)]
pub struct RouteTable<A = Alias> {
    by_name: HashMap<String, (Arc<A>, bool)>,
    aliases: Vec<Arc<A>>,
    /// Each alias's [`fallback_order`], made once, in the order of `aliases`.
    orders: Vec<Vec<Arc<A>>>,
}

/// The config's alias behind however the table holds it.
fn spec<A: AsRef<Alias>>(a: &Arc<A>) -> &Alias {
    (**a).as_ref()
}

impl AsRef<Alias> for Alias {
    fn as_ref(&self) -> &Alias {
        self
    }
}

impl RouteTable<Alias> {
    /// The table of a config's own aliases.
    #[cfg(test)]
    pub(crate) fn new(config: &Config) -> Self {
        RouteTable::of(config.aliases.values().cloned())
    }
}

impl<A: AsRef<Alias>> RouteTable<A> {
    /// The table of `aliases` (in name order), each under its name and its old names.
    pub(crate) fn of(aliases: impl IntoIterator<Item = Arc<A>>) -> Self {
        let mut by_name = HashMap::default();
        let mut all = Vec::new();
        for alias in aliases {
            let spec = (*alias).as_ref();
            by_name.insert(spec.name.clone(), (Arc::clone(&alias), false));
            for old in &spec.old_names {
                by_name.insert(old.clone(), (Arc::clone(&alias), true));
            }
            all.push(alias);
        }
        let mut table = RouteTable {
            by_name,
            aliases: all,
            orders: Vec::new(),
        };
        let orders = table
            .aliases
            .iter()
            .map(|a| fallback_order(&table, a, &|_| true))
            .collect();
        table.orders = orders;
        table
    }

    /// The aliases that may serve a request for `alias`: itself first, then its fallbacks.
    pub(crate) fn order(&self, alias: &A) -> &[Arc<A>] {
        let name = &alias.as_ref().name;
        self.aliases
            .binary_search_by(|a| spec(a).name.as_str().cmp(name))
            .ok()
            .map_or(&[], |i| self.orders[i].as_slice())
    }

    /// [`Self::order`] for a client that may use only the aliases `may` allows: the same
    /// slice when it may use each of them (no allocation), else the order made anew without
    /// the fallbacks it may not use.
    pub(crate) fn order_for(&self, alias: &A, may: &dyn Fn(&str) -> bool) -> Cow<'_, [Arc<A>]> {
        let order = self.order(alias);
        match order.split_first() {
            Some((first, rest)) if rest.iter().any(|a| !may(&spec(a).name)) => {
                Cow::Owned(fallback_order(self, first, may))
            }
            _ => Cow::Borrowed(order),
        }
    }

    /// The route for `model`, or `None` when no alias or old name matches.
    pub fn resolve(&self, model: &str) -> Option<Route<A>> {
        self.by_name.get(model).map(|(alias, old)| Route {
            alias: Arc::clone(alias),
            deprecated_name: old.then(|| model.to_string()),
        })
    }

    /// The alias by its current name only.
    pub fn alias(&self, name: &str) -> Option<&Arc<A>> {
        match self.by_name.get(name) {
            Some((alias, false)) => Some(alias),
            _ => None,
        }
    }

    /// Every alias (not old names), sorted by name.
    pub fn aliases(&self) -> &[Arc<A>] {
        &self.aliases
    }

    /// Comma-separated alias names, for the `model_not_found` message.
    pub fn known(&self) -> String {
        let names: Vec<&str> = self.aliases.iter().map(|a| spec(a).name.as_str()).collect();
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
        let names: Vec<&str> = t
            .order(t.alias("a").unwrap())
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        assert_eq!(names, ["a", "x", "z", "y"]);
        assert_eq!(t.order(t.alias("y").unwrap()).len(), 1);
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
        let a = t.alias("a").unwrap();
        assert!(matches!(t.order_for(a, &|_| true), Cow::Borrowed(_)));
        assert_eq!(names(&t.order_for(a, &|n| n != "x")), ["a", "y"]);
        assert_eq!(names(&t.order_for(a, &|n| n != "y")), ["a", "x", "z"]);
        assert_eq!(names(&t.order_for(a, &|n| n == "a")), ["a"]);
    }
}
