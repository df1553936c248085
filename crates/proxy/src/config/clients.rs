//! Named clients as configured: their keys (read from the environment), allowed aliases,
//! priority and limits; and the queue's classes with the wait after which each is lifted a
//! class.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;
use super::keys::keys_of;
use super::limits::{ByLimit, Limit, Resource, Window, Written};
use crate::kinds::{Key, PerKind};

/// `[clients.NAME]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClient {
    pub key_env: String,
    pub(crate) aliases: Option<Vec<String>>,
    pub(crate) priority: Option<String>,
    pub(crate) max_concurrent: Option<u32>,
    pub(crate) requests_per_minute: Option<u32>,
    pub(crate) tokens_per_minute: Option<u64>,
    pub(crate) tokens_per_day: Option<u64>,
    pub(crate) tokens_per_month: Option<u64>,
    pub(crate) output_tokens_per_day: Option<u64>,
    pub(crate) output_tokens_per_month: Option<u64>,
    pub(crate) reserve_output_tokens: Option<u32>,
    pub(crate) max_queue_wait_ms: Option<u64>,
    pub(crate) gpu_seconds_per_minute: Option<f64>,
    pub(crate) gpu_seconds_per_day: Option<f64>,
    pub(crate) gpu_seconds_per_month: Option<f64>,
    pub(crate) cache_group: Option<String>,
}

/// `[priority.CLASS]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClass {
    pub max_wait_ms: Option<u64>,
}

/// `[priority]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPriorities {
    pub interactive: Option<RawClass>,
    pub normal: Option<RawClass>,
    pub batch: Option<RawClass>,
}

/// A request's class in a backend's queue; the lower goes first. `Idle` is the Batch API's
/// lines' own: it takes a slot only when no other request waits for it, is never lifted, and
/// gives its slot to any other class that asks; no client or header names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    Interactive = 0,
    #[default]
    Normal = 1,
    Batch = 2,
    Idle = 3,
}

/// A value for each class.
pub type ByClass<T> = PerKind<Priority, T, 4>;

impl Key for Priority {
    const ALL: &'static [Priority] = &Priority::ALL;
    fn index(self) -> usize {
        self as usize
    }
}

impl Priority {
    pub(crate) const ALL: [Priority; 4] = [
        Priority::Interactive,
        Priority::Normal,
        Priority::Batch,
        Priority::Idle,
    ];

    /// The classes a client or a request may name.
    pub(crate) const NAMED: [Priority; 3] =
        [Priority::Interactive, Priority::Normal, Priority::Batch];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Normal => "normal",
            Priority::Batch => "batch",
            Priority::Idle => "idle",
        }
    }

    /// A class a client or request may name (never `idle`).
    pub(crate) fn parse(s: &str) -> Option<Priority> {
        Priority::NAMED
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
    }
}

/// One named client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSpec {
    pub name: String,
    pub(crate) keys: Vec<String>,
    /// The aliases it may use; `None`: every alias.
    pub(crate) aliases: Option<BTreeSet<String>>,
    pub(crate) priority: Priority,
    pub(crate) max_concurrent: Option<NonZeroU32>,
    /// Its limits of each kind (GPU time in milliseconds of a backend's slot); those of a
    /// calendar day and month (`server.budget_timezone`) are kept in the ledger.
    pub(crate) limits: ByLimit<Option<std::num::NonZeroU64>>,
    /// The output reserved for each choice of a request that sets no output limit (and whose
    /// alias sets none either); `0`: none.
    pub(crate) reserve_output_tokens: u32,
    /// A request whose predicted wait for a slot is longer is refused at once (503).
    pub(crate) max_queue_wait: Option<Duration>,
    /// Whose prompt caches its requests may meet: the id of its `cache_group`, else of its
    /// own name ([`cache_group`]); the requests of one group may reuse each other's prefixes,
    /// never another group's.
    pub(crate) cache_group: u64,
}

/// The id of the cache group named `name` (a client's `cache_group`, or the client's own
/// name): XXH3-64 of it, the same in every process, never 0 (the group of requests of no
/// client where caches are not isolated).
pub fn cache_group(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), 0x6361_6368_655f_6772).max(1)
}

/// How many cache groups the clients of `raw` and the keys of `server.api_keys_env` (each
/// key a group of its own, as it owns its own) make: caches are isolated where there are
/// several.
pub(crate) fn cache_groups(
    raw: &BTreeMap<String, RawClient>,
    anonymous: Option<&[String]>,
) -> usize {
    let named = raw
        .iter()
        .map(|(name, c)| c.cache_group.clone().unwrap_or_else(|| name.clone()));
    let keys = anonymous
        .unwrap_or_default()
        .iter()
        .map(|k| super::key_owner(k));
    named.chain(keys).collect::<BTreeSet<_>>().len()
}

/// `clients.NAME.reserve_output_tokens` unset.
pub(crate) const DEFAULT_RESERVE_OUTPUT_TOKENS: u32 = 1024;

impl ClientSpec {
    /// Whether it has any limit (and so gets the rate-limit headers).
    pub(crate) fn limited(&self) -> bool {
        self.max_concurrent.is_some() || self.limits.iter().any(|(_, l)| l.is_some())
    }

    /// Its limit of kind `limit`, if it sets one.
    pub(crate) fn limit(&self, limit: Limit) -> Option<u64> {
        self.limits[limit].map(|n| n.get())
    }

    /// Its smallest limit of `resource`, over every window.
    pub(crate) fn smallest(&self, resource: Resource) -> Option<u64> {
        self.set()
            .filter(|(l, _)| l.resource == resource)
            .map(|(_, n)| n)
            .min()
    }

    /// The limits it sets, each with its amount.
    pub(crate) fn set(&self) -> impl Iterator<Item = (Limit, u64)> + '_ {
        self.limits
            .iter()
            .filter_map(|(l, n)| Some((l, n.as_ref()?.get())))
    }

    /// Whether it has a budget of GPU time (and so its requests' work is reserved).
    pub(crate) fn counts_gpu(&self) -> bool {
        self.set().any(|(l, _)| l.resource == Resource::Gpu)
    }

    /// Whether it has a budget counted in tokens (and so its requests' tokens are counted
    /// and reserved).
    pub(crate) fn counts_tokens(&self) -> bool {
        self.set().any(|(l, _)| l.resource.in_tokens())
    }

    /// Whether it has a budget of a calendar day or month.
    pub(crate) fn counts_days(&self) -> bool {
        self.set().any(|(l, _)| l.window.calendar())
    }

    pub(crate) fn may_use(&self, alias: &str) -> bool {
        self.aliases.as_ref().is_none_or(|a| a.contains(alias))
    }
}

/// Every named client (by name) and the wait after which each class is lifted into the next
/// one's turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clients {
    pub named: Vec<Arc<ClientSpec>>,
    max_wait: ByClass<Duration>,
}

impl Default for Clients {
    fn default() -> Clients {
        Clients {
            named: Vec::new(),
            max_wait: ByClass::from_fn(default_max_wait),
        }
    }
}

/// A class's `max_wait_ms` unset (`idle` is never lifted).
fn default_max_wait(class: Priority) -> Duration {
    Duration::from_millis(match class {
        Priority::Interactive => 5_000,
        Priority::Normal => 30_000,
        Priority::Batch => 120_000,
        Priority::Idle => u64::MAX,
    })
}

impl Clients {
    /// How long a request of `class` waits before it is lifted into the next class's turns.
    pub(crate) fn max_wait(&self, class: Priority) -> Duration {
        self.max_wait[class]
    }

    /// Whether any client's requests are `interactive` (no other request is: a request may
    /// only lower its client's class).
    pub(crate) fn has_interactive(&self) -> bool {
        self.named
            .iter()
            .any(|c| c.priority == Priority::Interactive)
    }
}

/// Validate `[clients]` and `[priority]`; `anonymous`: the keys of `server.api_keys_env`;
/// `is_alias`: whether a name is a defined alias.
pub fn validate(
    raw: BTreeMap<String, RawClient>,
    priorities: RawPriorities,
    anonymous: Option<&[String]>,
    is_alias: &dyn Fn(&str) -> bool,
    errs: &mut Vec<ConfigError>,
) -> Clients {
    let max_wait = max_waits(priorities, errs);
    // Who holds each key, to find a key held twice (the key itself is never shown).
    let mut holder: BTreeMap<String, String> = BTreeMap::new();
    for k in anonymous.unwrap_or_default() {
        holder.insert(k.clone(), "server.api_keys_env".into());
    }
    let named = raw
        .into_iter()
        .map(|(name, c)| Arc::new(client(name, c, &mut holder, is_alias, errs)))
        .collect();
    Clients { named, max_wait }
}

/// Each class's `max_wait_ms`, or its default.
fn max_waits(priorities: RawPriorities, errs: &mut Vec<ConfigError>) -> ByClass<Duration> {
    let mut max_wait = ByClass::from_fn(default_max_wait);
    for (class, raw) in Priority::NAMED.into_iter().zip([
        priorities.interactive,
        priorities.normal,
        priorities.batch,
    ]) {
        if let Some(ms) = raw.and_then(|r| r.max_wait_ms) {
            if ms == 0 {
                errs.push(ConfigError::Zero {
                    key: format!("priority.{}.max_wait_ms", class.as_str()),
                });
            }
            max_wait[class] = Duration::from_millis(ms);
        }
    }
    max_wait
}

/// A client's name checked: a name as others are, and none that the keys of
/// `server.api_keys_env` take (their client's, or a key's owner's).
fn client_name(name: &str, errs: &mut Vec<ConfigError>) {
    let taken = if name == "anonymous" {
        Some("is the name of the clients of server.api_keys_env")
    } else if super::keys::is_key_owner(name) {
        Some(
            "has the form of the owner of a key of server.api_keys_env (key- and 16 hex \
             digits)",
        )
    } else {
        None
    };
    if let Some(reason) = taken {
        errs.push(ConfigError::BadValue {
            key: "clients".into(),
            value: name.to_string(),
            reason: reason.into(),
        });
    }
    super::names::name_check(&format!("clients.{name}"), name, errs);
}

/// One client; `holder`: who holds each key so far (this client's keys are added).
fn client(
    name: String,
    c: RawClient,
    holder: &mut BTreeMap<String, String>,
    is_alias: &dyn Fn(&str) -> bool,
    errs: &mut Vec<ConfigError>,
) -> ClientSpec {
    client_name(&name, errs);
    let key = |k: &str| format!("clients.{name}.{k}");
    let keys = keys_of(&key("key_env"), &c.key_env, errs);
    let limits = super::limits::read(|l| written(&c, l), &key, errs);
    for k in &keys {
        let mine = key("key_env");
        match holder.get(k) {
            Some(other) if *other != mine => errs.push(ConfigError::BadValue {
                key: mine,
                value: c.key_env.clone(),
                reason: format!("holds a key that {other} holds too (the key is not shown)"),
            }),
            _ => {
                holder.insert(k.clone(), mine);
            }
        }
    }
    let allowed = c.aliases.map(|list| {
        for a in &list {
            if !is_alias(a) {
                errs.push(ConfigError::BadValue {
                    key: key("aliases"),
                    value: a.clone(),
                    reason: "is not a defined alias".into(),
                });
            }
        }
        list.into_iter().collect::<BTreeSet<_>>()
    });
    let priority = match c.priority.as_deref() {
        None => Priority::Normal,
        Some(p) => Priority::parse(p).unwrap_or_else(|| {
            errs.push(ConfigError::BadValue {
                key: key("priority"),
                value: p.into(),
                reason: "is not one of interactive, normal, batch".into(),
            });
            Priority::Normal
        }),
    };
    let nz32 = |k: &str, v: Option<u32>, errs: &mut Vec<ConfigError>| {
        v.and_then(|v| {
            NonZeroU32::new(v).or_else(|| {
                errs.push(ConfigError::Zero { key: key(k) });
                None
            })
        })
    };
    ClientSpec {
        max_concurrent: nz32("max_concurrent", c.max_concurrent, errs),
        limits,
        reserve_output_tokens: c
            .reserve_output_tokens
            .unwrap_or(DEFAULT_RESERVE_OUTPUT_TOKENS),
        max_queue_wait: c.max_queue_wait_ms.map(Duration::from_millis),
        cache_group: cache_group(&group_name(&key("cache_group"), &name, c.cache_group, errs)),
        name,
        keys,
        aliases: allowed,
        priority,
    }
}

/// What `c` writes of `limit`; `None` where it sets none (or no key sets that kind).
fn written(c: &RawClient, limit: Limit) -> Option<Written> {
    use Resource as R;
    use Window as W;
    use Written::{Count, Seconds};
    match (limit.resource, limit.window) {
        (R::Requests, W::Minute) => c.requests_per_minute.map(|n| Count(u64::from(n))),
        (R::Tokens, W::Minute) => c.tokens_per_minute.map(Count),
        (R::Tokens, W::Day) => c.tokens_per_day.map(Count),
        (R::Tokens, W::Month) => c.tokens_per_month.map(Count),
        (R::Gpu, W::Minute) => c.gpu_seconds_per_minute.map(Seconds),
        (R::Gpu, W::Day) => c.gpu_seconds_per_day.map(Seconds),
        (R::Gpu, W::Month) => c.gpu_seconds_per_month.map(Seconds),
        (R::OutputTokens, W::Day) => c.output_tokens_per_day.map(Count),
        (R::OutputTokens, W::Month) => c.output_tokens_per_month.map(Count),
        (R::Requests, W::Day | W::Month) | (R::OutputTokens, W::Minute) => None,
    }
}

/// A client's `cache_group` (a name as clients' names are), else its own name.
fn group_name<'a>(
    key: &str,
    name: &'a str,
    group: Option<String>,
    errs: &mut Vec<ConfigError>,
) -> std::borrow::Cow<'a, str> {
    match group {
        Some(g) => {
            super::names::name_check(key, &g, errs);
            std::borrow::Cow::Owned(g)
        }
        None => std::borrow::Cow::Borrowed(name),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn errors(toml: &str) -> String {
        match crate::config::from_toml(toml) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    const FLEET: &str = r#"
[backends.b]
url = "http://127.0.0.1:1"
flavor = "llamacpp"
slots = 1
[aliases.a]
backend = "b"
"#;

    #[test]
    fn clients_are_validated_naming_the_key() {
        std::env::set_var("SB_TEST_CLIENTS_ONE", "k1, k2");
        std::env::set_var("SB_TEST_CLIENTS_TWO", "k3,k2");
        let cfg = crate::config::from_toml(&format!(
            "{FLEET}\n[clients.ci]\nkey_env = \"SB_TEST_CLIENTS_ONE\"\npriority = \"batch\"\naliases = [\"a\"]\ntokens_per_minute = 100\n[priority.batch]\nmax_wait_ms = 7"
        ))
        .unwrap();
        let ci = &cfg.clients.named[0];
        assert_eq!((ci.name.as_str(), ci.priority), ("ci", Priority::Batch));
        assert_eq!(ci.keys, ["k1", "k2"]);
        assert!(ci.may_use("a") && !ci.may_use("b") && ci.limited());
        assert_eq!(
            cfg.clients.max_wait(Priority::Batch),
            Duration::from_millis(7)
        );
        assert_eq!(
            cfg.clients.max_wait(Priority::Interactive),
            Duration::from_secs(5)
        );
        let twice = errors(&format!(
            "{FLEET}\n[clients.ci]\nkey_env = \"SB_TEST_CLIENTS_ONE\"\n[clients.dev]\nkey_env = \"SB_TEST_CLIENTS_TWO\""
        ));
        assert!(
            twice.contains("clients.dev.key_env") && twice.contains("clients.ci.key_env"),
            "{twice}"
        );
        assert!(!twice.contains("k2"), "{twice}");
        let bad = errors(&format!(
            "{FLEET}\n[clients.ci]\nkey_env = \"SB_TEST_CLIENTS_UNSET\"\npriority = \"urgent\"\naliases = [\"zz\"]\nmax_concurrent = 0"
        ));
        for part in [
            "clients.ci.key_env: \"SB_TEST_CLIENTS_UNSET\" is not set",
            "clients.ci.priority: \"urgent\" is not one of",
            "clients.ci.aliases: \"zz\" is not a defined alias",
            "clients.ci.max_concurrent: must be greater than zero",
        ] {
            assert!(bad.contains(part), "{part}: {bad}");
        }
        // The form of a key's owner is no client's name.
        let owner = errors(&format!(
            "{FLEET}\n[clients.key-0123456789abcdef]\nkey_env = \"SB_TEST_CLIENTS_ONE\""
        ));
        assert!(
            owner.contains("key-0123456789abcdef") && owner.contains("the owner of a key"),
            "{owner}"
        );
    }

    #[test]
    fn each_limit_is_read_from_its_key_by_kind() {
        std::env::set_var("SB_TEST_CLIENTS_LIMITS", "k-limits");
        let cfg = crate::config::from_toml(&format!(
            "{FLEET}\n[clients.c]\nkey_env = \"SB_TEST_CLIENTS_LIMITS\"\nrequests_per_minute = 7\n\
             tokens_per_month = 900\ngpu_seconds_per_day = 1.5\noutput_tokens_per_day = 50"
        ))
        .unwrap();
        let c = &cfg.clients.named[0];
        let set: Vec<(Limit, u64)> = c.set().collect();
        let limit = Limit::new;
        assert_eq!(
            set,
            [
                (limit(Resource::Requests, Window::Minute), 7),
                (limit(Resource::Tokens, Window::Month), 900),
                (limit(Resource::Gpu, Window::Day), 1500),
                (limit(Resource::OutputTokens, Window::Day), 50),
            ]
        );
        assert!(c.counts_tokens() && c.counts_gpu() && c.counts_days());
        assert_eq!(c.smallest(Resource::Tokens), Some(900));
        let bad = errors(&format!(
            "{FLEET}\n[clients.c]\nkey_env = \"SB_TEST_CLIENTS_LIMITS\"\ntokens_per_day = 0\n\
             gpu_seconds_per_minute = 0.0001\noutput_tokens_per_month = 0"
        ));
        for part in [
            "clients.c.tokens_per_day: must be greater than zero",
            "clients.c.output_tokens_per_month: must be greater than zero",
            "clients.c.gpu_seconds_per_minute: \"0.0001\" is not a number of seconds",
        ] {
            assert!(bad.contains(part), "{part}: {bad}");
        }
        // Output tokens are a budget of a day and a month; no limiter counts a minute of them.
        let minute = errors(&format!(
            "{FLEET}\n[clients.c]\nkey_env = \"SB_TEST_CLIENTS_LIMITS\"\noutput_tokens_per_minute = 5"
        ));
        assert!(
            minute.contains("found `output_tokens_per_minute`"),
            "{minute}"
        );
    }
}
