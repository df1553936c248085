//! Configuration: load `routes.toml` plus `SWITCHBOARD_*` overrides, then validate into typed structs.

mod aliases;
mod apis;
mod backends;
mod batches;
mod clients;
mod counting;
mod error;
mod keys;
mod ledger;
mod limits;
mod model;
mod names;
mod raw;
mod routing;
mod schedule;
mod seed;
mod server;
mod sizing;
mod tracing;
mod validate;
mod values;

use std::path::Path;

use figment::providers::{Env, Format, Toml};
use figment::Figment;

pub(crate) use aliases::{Alias, GuardConfig, Input};
pub(crate) use backends::Backend;
pub(crate) use batches::Batches;
pub use clients::{cache_group, ByClass, ClientSpec, Clients, Priority};
pub use counting::{CountKind, GateConfig, MediaCosts, TokenizerFiles};
pub use error::{ConfigError, ConfigErrors};
#[cfg(test)]
pub(crate) use keys::bearer;
pub(crate) use keys::key_owner;
pub use ledger::{Ledger, LedgerUrl};
pub use limits::{ByLimit, Limit, Resource, Window};
pub use model::Config;
pub(crate) use raw::RawConfig;
pub(crate) use schedule::{Order, Scheduling};
pub(crate) use seed::Seed;
pub use server::{AfterSpill, BreakerConfig, ClientSide, Server, SharedState};
pub(crate) use sizing::Sizing;
pub(crate) use tracing::Tracing;
pub use validate::validate;

/// Read the file and the environment into raw structs. Syntax and unknown keys fail here.
pub fn load_raw(path: &Path) -> Result<RawConfig, ConfigErrors> {
    if !path.exists() {
        return Err(ConfigErrors(vec![ConfigError::Load(format!(
            "{}: no such file",
            path.display()
        ))]));
    }
    Figment::new()
        .merge(Toml::file_exact(path))
        .merge(Env::prefixed("SWITCHBOARD_").split("__").filter(|key| {
            // Only config sections: other SWITCHBOARD_* variables (API keys, log level) are not config.
            let key = key.as_str().to_ascii_lowercase();
            [
                "server.",
                "backends.",
                "aliases.",
                "clients.",
                "priority.",
                "tracing.",
                "ledger.",
                "batches.",
            ]
            .iter()
            .any(|section| key.starts_with(section))
        }))
        .extract::<RawConfig>()
        .map_err(|e| {
            ConfigErrors(
                e.into_iter()
                    .map(|e| ConfigError::Load(e.to_string()))
                    .collect(),
            )
        })
}

/// Load and validate: the one entry point `serve`, `check` and reload use.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    validate(load_raw(path)?)
}

/// The `[ledger]` of the config at `path` alone, where `server.data_dir` puts it: what
/// `switchboard usage` reads. The other sections are not validated (the environment variables
/// of the clients' keys belong to the serving process).
pub fn load_ledger(path: &Path) -> Result<Option<Ledger>, ConfigErrors> {
    let raw = load_raw(path)?;
    let mut errs = Vec::new();
    let data_dir = server::data_dir(raw.server.data_dir.as_deref(), &mut errs);
    let ledger = ledger::validate(raw.ledger, data_dir.as_deref(), &mut errs);
    match errs.is_empty() {
        true => Ok(ledger),
        false => Err(ConfigErrors(errs)),
    }
}

/// Parse a config from TOML text (no environment): for tests and tools.
pub fn from_toml(text: &str) -> Result<Config, ConfigErrors> {
    let raw = Figment::new()
        .merge(Toml::string(text))
        .extract::<RawConfig>()
        .map_err(|e| {
            ConfigErrors(
                e.into_iter()
                    .map(|e| ConfigError::Load(e.to_string()))
                    .collect(),
            )
        })?;
    validate(raw)
}
