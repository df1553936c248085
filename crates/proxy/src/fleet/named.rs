//! What the process learns of each backend by name and keeps for its life, across reloads:
//! one shared value per name, made on first use, so a snapshot's replicas hold theirs and a
//! request reads it without a lookup.

use crate::lock::ReadWrite;
use std::sync::{Arc, RwLock};

// foldhash: keyed by backend names from the config (no untrusted keys).
use foldhash::HashMap;

/// One `T` per backend name.
#[derive(Debug)]
pub(crate) struct ByName<T> {
    backends: RwLock<HashMap<String, Arc<T>>>,
}

impl<T> Default for ByName<T> {
    fn default() -> Self {
        ByName {
            backends: RwLock::new(HashMap::default()),
        }
    }
}

impl<T: Default> ByName<T> {
    /// Backend `name`'s, made on first use.
    pub(crate) fn of(&self, name: &str) -> Arc<T> {
        if let Some(v) = self.get(name) {
            return v;
        }
        let mut all = self.backends.writing();
        Arc::clone(all.entry(name.to_string()).or_default())
    }
}

impl<T> ByName<T> {
    /// Backend `name`'s, if it was ever made.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<T>> {
        let known = self.backends.reading();
        known.get(name).map(Arc::clone)
    }
}
