//! Named clients at run time: which client a key belongs to (compared in constant time) and
//! who owns what its requests leave, what it may use, its priority, and its limits, budgets
//! and counters (kept across reloads while the client exists).

pub(crate) mod charge;
pub(crate) mod headers;
pub(crate) mod limiter;
pub(crate) mod place;
pub(crate) mod shared;

use std::sync::atomic::{AtomicI64, AtomicU32};
use std::sync::Arc;
use std::time::Instant;

use axum::http::{header, HeaderMap, HeaderName};

use crate::budget::{Board, Budgets};
use crate::calendar::Clock;
use crate::config::{ByLimit, ClientSpec, Config, Limit, Priority, Resource, Window};
use crate::error::ProxyError;
use crate::lock::Locked;
use crate::observe::metrics::{ClientMetrics, Metrics};
use crate::shared::Store;
use limiter::{Limiter, Limits, Local};

/// The header a client lowers its own priority with, per request.
pub(crate) const PRIORITY: HeaderName = HeaderName::from_static("x-switchboard-priority");

/// The name of the clients of `server.api_keys_env`.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// What lives as long as a client does, across reloads: its counters.
#[derive(Debug)]
pub struct ClientState {
    /// The same in every process (see [`client_id`]): the unit of the queue's fair turn.
    pub id: u64,
    pub(crate) limiter: Box<dyn Limiter>,
    /// Its budget of GPU time a minute, in milliseconds (a limiter of its own, its "tokens").
    pub(crate) gpu: Box<dyn Limiter>,
    /// Its budgets of a calendar day and month, tokens and GPU time.
    pub budgets: Budgets,
    pub inflight: AtomicU32,
    pub queued: AtomicI64,
    pub(crate) metrics: ClientMetrics,
    /// Tokens and GPU time charged, in 10-second steps: the status page's last five minutes.
    pub recent: Recent,
}

impl ClientState {
    /// Where it stands against each of its limits now: those of a minute as its limiters
    /// keep them, those of a day and a month as its budgets do.
    pub(crate) fn standing(&self, now: Instant) -> ByLimit<Option<limiter::Left>> {
        let mut out = self.budgets.standing();
        let (counts, gpu) = (self.limiter.standing(now), self.gpu.standing(now));
        let minute = |resource| Limit::new(resource, Window::Minute);
        out[minute(Resource::Requests)] = counts.requests;
        out[minute(Resource::Tokens)] = counts.tokens;
        out[minute(Resource::Gpu)] = gpu.tokens;
        out
    }
}

/// Tokens and GPU-milliseconds charged in the last five minutes, in a ring of 30 steps of
/// 10 s.
#[derive(Debug)]
pub struct Recent {
    origin: Instant,
    ring: std::sync::Mutex<[(u64, u64, u64); 30]>,
}

impl Recent {
    fn new() -> Recent {
        Recent {
            origin: Instant::now(),
            ring: std::sync::Mutex::new([(u64::MAX, 0, 0); 30]),
        }
    }

    fn step(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_secs() / 10
    }

    pub fn add(&self, at: Instant, tokens: u64, gpu_ms: u64) {
        let n = self.step(at);
        let mut ring = self.ring.locked();
        let slot = &mut ring[(n % 30) as usize];
        if slot.0 != n {
            *slot = (n, 0, 0);
        }
        slot.1 += tokens;
        slot.2 += gpu_ms;
    }

    /// The tokens and GPU-milliseconds of each 10-second step of the five minutes to `now`,
    /// the oldest first (the last, the step `now` is in).
    pub(crate) fn steps(&self, now: Instant) -> [(u64, u64); 30] {
        let n = self.step(now);
        let ring = self.ring.locked();
        let mut out = [(0, 0); 30];
        for step in n.saturating_sub(29)..=n {
            let s = ring[(step % 30) as usize];
            if s.0 == step {
                out[29 - (n - step) as usize] = (s.1, s.2);
            }
        }
        out
    }
}

/// The tokens and GPU-milliseconds of `steps` (of [`Recent::steps`]) together.
pub(crate) fn total(steps: &[(u64, u64)]) -> (u64, u64) {
    steps.iter().fold((0, 0), |(t, g), s| (t + s.0, g + s.1))
}

/// The client a request comes from, as the snapshot knows it, and who owns what it leaves.
#[derive(Debug, Clone)]
pub struct Caller {
    pub spec: Arc<ClientSpec>,
    pub state: Arc<ClientState>,
    /// What [`Caller::owner`] reads, shared with what records it (a request's ledger row).
    pub owner: Arc<str>,
    /// Whose cached prompt prefixes its requests may meet: its client's `cache_group`; a key
    /// of `server.api_keys_env` is a group of its own, as it is an owner of its own.
    pub(crate) cache_group: u64,
}

impl Caller {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Who owns what the caller's requests leave — files, batches and their stored data, the
    /// usage it reads: a named client's name; for a key of `server.api_keys_env`, a hash of
    /// that key ([`crate::config::key_owner`]), so each key owns its own while all are the
    /// one client [`ANONYMOUS`] of the limits and classes.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// Its owner as a number (XXH3-64 of [`Caller::owner`], the same in every process): what
    /// a conversation's key is one owner's by.
    pub(crate) fn owner_id(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(self.owner.as_bytes())
    }

    pub(crate) fn may_use(&self, alias: &str) -> bool {
        self.spec.may_use(alias)
    }
}

/// The class of a request of a client of class `own`, as its headers may lower it.
pub(crate) fn class(own: Priority, headers: &HeaderMap) -> Result<Priority, ProxyError> {
    let Some(v) = headers.get(PRIORITY) else {
        return Ok(own);
    };
    let asked = v.to_str().ok().and_then(Priority::parse).ok_or_else(|| {
        ProxyError::InvalidRequest(format!(
            "invalid x-switchboard-priority header {:?}: expected interactive, normal or batch",
            crate::error::Echo::new(&String::from_utf8_lossy(v.as_bytes()))
        ))
    })?;
    Ok(asked.max(own))
}

/// The limits of a new client: in `store` when there is one, else in this process.
fn limiter(
    kind: &str,
    spec: &ClientSpec,
    limits: Limits,
    store: Option<&Arc<Store>>,
) -> Box<dyn Limiter> {
    let now = Instant::now();
    match store {
        Some(store) => Box::new(shared::Shared::new(
            Arc::clone(store),
            kind,
            &spec.name,
            limits,
            now,
        )),
        None => Box::new(Local::new(limits, now)),
    }
}

/// Every client of one config: who holds which key.
#[derive(Debug, Default)]
pub struct Registry {
    /// Some key is configured: a request without a known one is refused.
    closed: bool,
    /// One per client ([`ANONYMOUS`]'s own owner is its name: what it owned before its keys
    /// each owned their own).
    callers: Vec<Caller>,
    /// Each key and the caller it makes: its client, and its owner.
    keyed: Vec<(String, Caller)>,
}

/// A client's id: XXH3-64 of its name, so every process gives a client the same one (the
/// unit of the fair turn in this process's queues and in the shared store's); never 0, the
/// id of requests of no client.
fn client_id(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes()).max(1)
}

/// Its limits of a minute as its limiter's (`gpu`: its GPU time's, in milliseconds for
/// tokens, no count of requests).
fn limits(spec: &ClientSpec, gpu: bool) -> Limits {
    let minute = |resource| spec.limit(Limit::new(resource, Window::Minute));
    match gpu {
        false => Limits {
            requests_per_minute: minute(Resource::Requests),
            tokens_per_minute: minute(Resource::Tokens),
        },
        true => Limits {
            requests_per_minute: None,
            tokens_per_minute: minute(Resource::Gpu),
        },
    }
}

/// Its budgets (the budgets keep those of a calendar window).
fn budget_limits(spec: &ClientSpec) -> crate::budget::Limits {
    spec.limits.map(|_, n| n.map(std::num::NonZeroU64::get))
}

impl Registry {
    /// The clients of `config`; one that `previous` has too keeps its counters (its limits
    /// set to the new ones). With `store`, their limits are kept there, shared by every
    /// process that uses it; with `board`, their budgets of a day and a month count what the
    /// ledger says other processes spent.
    pub(crate) fn build(
        config: &Config,
        metrics: &Metrics,
        previous: Option<&Registry>,
        store: Option<&Arc<Store>>,
        board: Option<&Arc<Board>>,
    ) -> Registry {
        let calendar = &config.server.budget_timezone;
        let anonymous = config.server.api_keys.as_ref().map(|keys| {
            Arc::new(ClientSpec {
                name: ANONYMOUS.into(),
                keys: keys.clone(),
                aliases: None,
                priority: Priority::Normal,
                max_concurrent: None,
                limits: ByLimit::default(),
                reserve_output_tokens: 0,
                max_queue_wait: None,
                cache_group: crate::config::cache_group(ANONYMOUS),
            })
        });
        let specs = anonymous
            .into_iter()
            .chain(config.clients.named.iter().cloned());
        let callers: Vec<Caller> = specs
            .map(|spec| {
                let kept = previous
                    .and_then(|p| p.callers.iter().find(|c| c.spec.name == spec.name))
                    .map(|c| Arc::clone(&c.state));
                let state = match kept {
                    Some(s) => {
                        s.limiter.reconfigure(limits(&spec, false));
                        s.gpu.reconfigure(limits(&spec, true));
                        s.budgets.reconfigure(
                            budget_limits(&spec),
                            calendar.clone(),
                            board.cloned(),
                        );
                        s
                    }
                    None => Arc::new(ClientState {
                        id: client_id(&spec.name),
                        limiter: limiter("client", &spec, limits(&spec, false), store),
                        gpu: limiter("gpu", &spec, limits(&spec, true), store),
                        budgets: Budgets::new(
                            &spec.name,
                            budget_limits(&spec),
                            calendar.clone(),
                            board.cloned(),
                            Clock::system(),
                        ),
                        inflight: AtomicU32::new(0),
                        queued: AtomicI64::new(0),
                        metrics: metrics.client(&spec.name),
                        recent: Recent::new(),
                    }),
                };
                let owner = Arc::from(spec.name.as_str());
                let cache_group = spec.cache_group;
                Caller {
                    spec,
                    state,
                    owner,
                    cache_group,
                }
            })
            .collect();
        let keyed = callers
            .iter()
            .flat_map(|c| {
                let anonymous = c.spec.name == ANONYMOUS;
                c.spec.keys.iter().map(move |k| {
                    let mut caller = c.clone();
                    if anonymous {
                        let owner = crate::config::key_owner(k);
                        caller.cache_group = crate::config::cache_group(&owner);
                        caller.owner = Arc::from(owner);
                    }
                    (k.clone(), caller)
                })
            })
            .collect();
        Registry {
            closed: !callers.is_empty(),
            callers,
            keyed,
        }
    }

    /// Some key is required.
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }

    pub fn callers(&self) -> &[Caller] {
        &self.callers
    }

    /// The client holding `key`, as that key's caller (its owner): every key is compared,
    /// each in constant time, so the time taken says nothing of which (or how much of one)
    /// matched.
    pub(crate) fn holder(&self, key: &str) -> Option<&Caller> {
        let mut found = None;
        for (k, c) in &self.keyed {
            if same(k.as_bytes(), key.as_bytes()) {
                found = Some(c);
            }
        }
        found
    }

    /// A caller whose owner is `owner` (a batch's, to run its lines as): of one of its keys,
    /// else the client of that name.
    pub(crate) fn owned_by(&self, owner: &str) -> Option<&Caller> {
        let keyed = self.keyed.iter().map(|(_, c)| c);
        keyed.chain(&self.callers).find(|c| c.owner() == owner)
    }

    /// The client of a request by the key in its headers; `None` when no key is configured;
    /// 401 for a missing or unknown key.
    pub(crate) fn identify(&self, headers: &HeaderMap) -> Result<Option<&Caller>, ProxyError> {
        if !self.closed {
            return Ok(None);
        }
        presented(headers)
            .and_then(|k| self.holder(k))
            .map(Some)
            .ok_or(ProxyError::Unauthorized)
    }
}

/// The key a request presents: `Authorization: Bearer …`, or Anthropic's `x-api-key`.
pub(crate) fn presented(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim());
    bearer.or_else(|| {
        headers
            .get(crate::upstream::exchange::X_API_KEY)
            .and_then(|v| v.to_str().ok())
    })
}

/// Whether `key` is one of `keys`: every one compared, each in constant time.
pub(crate) fn one_of(keys: &[String], key: &str) -> bool {
    keys.iter()
        .fold(false, |found, k| same(k.as_bytes(), key.as_bytes()) | found)
}

/// Equal bytes, in a time that depends on the lengths only (`subtle`'s comparison, which
/// the optimizer cannot turn into an early exit).
fn same(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn recent_tokens_are_the_last_five_minutes() {
        let r = Recent::new();
        let t0 = r.origin;
        r.add(t0, 5, 1000);
        r.add(t0 + std::time::Duration::from_secs(100), 7, 250);
        assert_eq!(
            total(&r.steps(t0 + std::time::Duration::from_secs(100))),
            (12, 1250)
        );
        assert_eq!(
            total(&r.steps(t0 + std::time::Duration::from_secs(305))),
            (7, 250)
        );
        assert_eq!(
            total(&r.steps(t0 + std::time::Duration::from_secs(500))),
            (0, 0)
        );
    }

    #[test]
    fn recent_steps_end_with_the_step_now_is_in() {
        let r = Recent::new();
        let t0 = r.origin;
        r.add(t0, 5, 1000);
        r.add(t0 + std::time::Duration::from_secs(100), 7, 250);
        // Ten steps in: the first steps of the run are before the five minutes.
        let steps = r.steps(t0 + std::time::Duration::from_secs(100));
        assert_eq!(steps[29], (7, 250));
        assert_eq!(steps[19], (5, 1000));
        assert_eq!(steps.iter().filter(|s| **s != (0, 0)).count(), 2);
        // Past five minutes of the first, only the second is left, 21 steps before now.
        let steps = r.steps(t0 + std::time::Duration::from_secs(305));
        assert_eq!(steps[29 - 20], (7, 250));
        assert_eq!(steps.iter().filter(|s| **s != (0, 0)).count(), 1);
    }

    #[test]
    fn each_key_of_api_keys_env_owns_its_own_and_all_share_one_client() {
        std::env::set_var("SB_UNIT_OWNER_KEYS", "k-1,k-2");
        std::env::set_var("SB_UNIT_OWNER_ANN", "ann-1,ann-2");
        let config = crate::config::from_toml(
            "[server]\napi_keys_env = \"SB_UNIT_OWNER_KEYS\"\n[backends.b]\n\
             url = \"http://127.0.0.1:9\"\nflavor = \"llamacpp\"\n[aliases.a]\nbackend = \"b\"\n\
             [clients.ann]\nkey_env = \"SB_UNIT_OWNER_ANN\"\n",
        )
        .unwrap();
        let r = Registry::build(&config, &Metrics::new(), None, None, None);
        let (one, two) = (r.holder("k-1").unwrap(), r.holder("k-2").unwrap());
        assert_eq!(one.owner(), crate::config::key_owner("k-1"));
        assert_eq!(two.owner(), crate::config::key_owner("k-2"));
        assert_ne!(one.owner(), two.owner());
        assert_eq!((one.name(), two.name()), (ANONYMOUS, ANONYMOUS));
        assert!(Arc::ptr_eq(&one.state, &two.state), "one client's limits");
        for k in ["ann-1", "ann-2"] {
            assert_eq!(r.holder(k).unwrap().owner(), "ann");
        }
        assert!(r.holder("k-3").is_none());
        let found = r.owned_by(two.owner()).unwrap();
        assert_eq!(found.owner(), two.owner());
        assert_eq!(r.owned_by("ann").unwrap().name(), "ann");
        // What the keys owned while they were one owner is still found by that name.
        assert_eq!(r.owned_by(ANONYMOUS).unwrap().name(), ANONYMOUS);
        assert_eq!(r.callers().len(), 2);
    }

    #[test]
    fn keys_are_compared_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
        assert!(same(b"", b""));
    }

    #[test]
    fn a_request_may_lower_its_class_never_raise_it() {
        let mut h = HeaderMap::new();
        assert_eq!(class(Priority::Normal, &h).unwrap(), Priority::Normal);
        h.insert(PRIORITY, HeaderValue::from_static("batch"));
        assert_eq!(class(Priority::Normal, &h).unwrap(), Priority::Batch);
        h.insert(PRIORITY, HeaderValue::from_static("interactive"));
        assert_eq!(class(Priority::Batch, &h).unwrap(), Priority::Batch);
        h.insert(PRIORITY, HeaderValue::from_static("urgent"));
        assert!(class(Priority::Batch, &h).is_err());
    }
}
