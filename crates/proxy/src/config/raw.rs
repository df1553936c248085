//! The config file as written: serde structs that reject unknown keys, nothing validated yet.
//! Each section's own struct is in its file ([`super::server`], [`super::backends`], …).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::aliases::RawAlias;
use super::backends::RawBackend;
use super::batches::RawBatches;
use super::clients::{RawClient, RawPriorities};
use super::ledger::RawLedger;
use super::server::RawServer;
use super::tracing::RawTracing;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    pub aliases: BTreeMap<String, RawAlias>,
    /// Named clients: keys, allowed aliases, priority, limits.
    #[serde(default)]
    pub clients: BTreeMap<String, RawClient>,
    /// The queue's classes: how long a request of each may wait before it is lifted a class.
    #[serde(default)]
    pub priority: RawPriorities,
    /// Spans exported over OTLP: where, how many.
    #[serde(default)]
    pub tracing: RawTracing,
    /// The usage ledger: where, how batched, how long kept.
    #[serde(default)]
    pub ledger: RawLedger,
    /// The Batch API's bounds.
    #[serde(default)]
    pub batches: RawBatches,
}
