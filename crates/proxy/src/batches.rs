//! The Batch API as the proxy serves it: its state ([`switchboard_store::batches`]: files,
//! batches, their lines, the runner) opened in the config's ledger, or why it is off.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
pub(crate) use switchboard_store::batches::*;

use crate::config::{self, ConfigError, ConfigErrors};

/// The Batch API's state in `config`'s ledger, opened; why there is none (no ledger, or one
/// that cannot be used and is not `required`); an error when the database or the files'
/// folder of a required ledger cannot be used.
pub(crate) fn of(
    config: &config::Config,
    up: Gauge,
) -> Result<Result<Arc<Batches>, &'static str>, ConfigErrors> {
    let Some(ledger) = &config.ledger else {
        return Ok(Err("no [ledger] (or server.data_dir) keeps its state"));
    };
    match Batches::open(&ledger.url, config.server.data_dir.as_deref(), up) {
        Ok(b) => Ok(Ok(Arc::new(b))),
        // The proxy serves without the ledger, and without the Batch API it keeps.
        Err(e) if !ledger.required => {
            tracing::error!(error = %e, "the Batch API is off: its state cannot be opened");
            Ok(Err("its state in the ledger could not be opened at start"))
        }
        Err(e) => Err(ConfigErrors(vec![ConfigError::Load(format!(
            "ledger.url: the Batch API's state: {e}"
        ))])),
    }
}
