//! The live aliases and replicas of one snapshot: each alias with its metric handles, its
//! context guard and its replicas; each replica (a backend) with its slots, its breaker, what
//! is learned of its connections, and its health and reported load. Built once with the snapshot, so a request carries its
//! handles from step to step and never looks one up by name.
//!
//! They live here, not in `fleet/`, because an alias's metric handles are `observe`'s, and
//! `observe` names `fleet`.

use std::sync::Arc;

use crate::config::{Alias, Backend};
use crate::fleet::breaker::Breaker;
use crate::fleet::health::BackendHealth;
use crate::fleet::slots::Slots;
use crate::guard::GuardSpec;
use crate::observe::metrics::AliasMetrics;
use crate::upstream::watch::ConnWatch;

/// One backend as the snapshot serves it: the same value for every alias it serves.
#[derive(Debug)]
pub struct Replica {
    pub backend: Arc<Backend>,
    /// Its slots and queue (kept across snapshots while their sizes are the same).
    pub slots: Arc<Slots>,
    /// Its circuit breaker (kept across snapshots while its URL is the same).
    pub breaker: Arc<Breaker>,
    /// What is learned of its connections (kept while its URL is the same).
    pub conns: Arc<ConnWatch>,
    /// Its state by its last probe and the load it last reported (the process's, by name).
    pub(crate) health: Arc<BackendHealth>,
}

impl Replica {
    /// The backend's config name.
    pub(crate) fn name(&self) -> &str {
        &self.backend.name
    }

    /// Whether a request of the API named `api` (in `apis`) is sent to the slot it took
    /// (`id_slot`): its runtime takes that for the API, its config lets it, and no other
    /// process shares its slots.
    pub(crate) fn pins(&self, api: Option<&str>) -> bool {
        let runtime = self.backend.flavor.runtime();
        self.backend.pin_slots
            && !self.slots.is_shared()
            && api.is_some_and(|a| runtime.pins_slots.contains(&a))
    }
}

/// One alias as the snapshot serves it.
#[derive(Debug)]
pub struct LiveAlias {
    pub spec: Arc<Alias>,
    pub metrics: AliasMetrics,
    /// Its context guard with its counter built; in force where the window is known.
    guard: Option<Arc<GuardSpec>>,
    /// Its replicas, in the order of its `backends` (the first is its `backend`).
    pub(crate) replicas: Vec<Arc<Replica>>,
}

impl LiveAlias {
    pub(crate) fn new(
        spec: Arc<Alias>,
        metrics: AliasMetrics,
        guard: Option<Arc<GuardSpec>>,
        replicas: Vec<Arc<Replica>>,
    ) -> LiveAlias {
        debug_assert_eq!(replicas.len(), spec.backends.len());
        LiveAlias {
            spec,
            metrics,
            guard,
            replicas,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.spec.name
    }

    /// The context guard, where it is in force (not a pending `"auto"` window).
    pub fn guard(&self) -> Option<&Arc<GuardSpec>> {
        self.guard.as_ref().filter(|g| g.window > 0)
    }

    /// The guard as built, in force or not (the next snapshot keeps its counter).
    pub(crate) fn built_guard(&self) -> Option<&Arc<GuardSpec>> {
        self.guard.as_ref()
    }

    /// Its first replica: the backend its `backend` names.
    pub(crate) fn first(&self) -> &Arc<Replica> {
        &self.replicas[0]
    }
}

impl AsRef<Alias> for LiveAlias {
    fn as_ref(&self) -> &Alias {
        &self.spec
    }
}
