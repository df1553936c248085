//! The validated configuration: what the rest of the program reads, every reference resolved.
//! Each section's own type is in its file ([`super::server`], [`super::backends`], …).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::aliases::Alias;
use super::backends::Backend;
use super::clients::Clients;
use super::ledger::Ledger;
use super::server::Server;
use super::tracing::Tracing;

/// A validated configuration: every reference resolved, every value in range.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: Server,
    pub backends: BTreeMap<String, Arc<Backend>>,
    pub aliases: BTreeMap<String, Arc<Alias>>,
    /// Named clients and the queue's classes.
    pub clients: Arc<Clients>,
    /// Where spans go; `None`: tracing off.
    pub tracing: Option<Tracing>,
    /// Where usage is recorded; `None`: no ledger.
    pub ledger: Option<Ledger>,
    /// The Batch API's bounds (served when there is a ledger).
    pub(crate) batches: super::Batches,
}
