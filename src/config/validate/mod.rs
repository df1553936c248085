//! Turns raw config into typed config ([`super::model`]): each section by its own file's
//! validation, then what one section says of another (an alias's backends, its fallbacks),
//! collecting every error with the key and value it concerns. No I/O but reading the
//! environment variables the config names.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::error::{ConfigError, ConfigErrors};
use super::model::Config;
use super::names::name_check;
use super::raw::RawConfig;
use super::routing::{context_fallbacks, fallbacks, replicas};
use super::{aliases, backends, clients, server, tracing};

/// Validate a raw config. Collects all errors rather than stopping at the first.
pub fn validate(raw: RawConfig) -> Result<Config, ConfigErrors> {
    let mut errs = Vec::new();
    let server = server::validate(raw.server, &mut errs);
    for name in raw.backends.keys() {
        name_check(&format!("backends.{name}"), name, &mut errs);
    }
    for (name, a) in &raw.aliases {
        name_check(&format!("aliases.{name}"), name, &mut errs);
        for (i, old) in a.old_names.iter().enumerate() {
            name_check(&format!("aliases.{name}.old_names[{i}]"), old, &mut errs);
        }
    }
    let mut backends = BTreeMap::new();
    for (name, b) in raw.backends {
        if let Some(b) = backends::validate(&name, b, &server.timeouts, &mut errs) {
            backends.insert(name, Arc::new(b));
        }
    }
    let mut aliases = BTreeMap::new();
    let mut names: HashMap<String, String> = HashMap::new();
    for name in raw.aliases.keys() {
        names.insert(name.clone(), format!("aliases.{name}"));
    }
    for (name, a) in raw.aliases {
        for old in &a.old_names {
            let key = format!("aliases.{name}.old_names");
            match names.get(old) {
                Some(other) => errs.push(ConfigError::DuplicateName {
                    key,
                    name: old.clone(),
                    other: other.clone(),
                }),
                None => {
                    names.insert(old.clone(), key);
                }
            }
        }
        let Some(replicas) = replicas(&name, &a, &backends, &mut errs) else {
            continue;
        };
        if let Some(a) = aliases::validate(&name, a, replicas, &mut errs) {
            aliases.insert(name, Arc::new(a));
        }
    }
    context_fallbacks(&aliases, &mut errs);
    fallbacks(&aliases, &mut errs);
    let clients = clients::validate(
        raw.clients,
        raw.priority,
        server.api_keys.as_deref(),
        &|a| aliases.contains_key(a),
        &mut errs,
    );
    let tracing = tracing::validate(raw.tracing, &mut errs);
    if errs.is_empty() {
        Ok(Config {
            server,
            backends,
            aliases,
            clients: Arc::new(clients),
            tracing,
        })
    } else {
        Err(ConfigErrors(errs))
    }
}

#[cfg(test)]
mod tests;
