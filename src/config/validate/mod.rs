//! Turns raw config into typed config ([`super::model`]), section by section, collecting
//! every error with the key and value it concerns. No I/O but reading the environment
//! variables the config names.

mod alias;
mod backend;
mod server;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::error::{ConfigError, ConfigErrors};
use super::model::{Config, Sizing};
use super::names::name_check;
use super::raw::{RawConfig, RawSizing};
use super::routing::{context_fallbacks, fallbacks};
use crate::reasoning::OutputField;

/// Validate a raw config. Collects all errors rather than stopping at the first.
pub fn validate(raw: RawConfig) -> Result<Config, ConfigErrors> {
    let mut errs = Vec::new();
    let server = server::server(raw.server, &mut errs);
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
        if let Some(b) = backend::backend(&name, b, &server.timeouts, &mut errs) {
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
        if let Some(a) = alias::alias(&name, a, &backends, &mut errs) {
            aliases.insert(name, Arc::new(a));
        }
    }
    context_fallbacks(&aliases, &mut errs);
    fallbacks(&aliases, &mut errs);
    let clients = super::clients::validate(
        raw.clients,
        raw.priority,
        server.api_keys.as_deref(),
        &|a| aliases.contains_key(a),
        &mut errs,
    );
    let tracing = super::tracing::validate(raw.tracing, &mut errs);
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

fn socket_addr(key: &str, value: &str, errs: &mut Vec<ConfigError>) -> Option<SocketAddr> {
    match value.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.push(ConfigError::BadValue {
                key: key.into(),
                value: value.into(),
                reason: "is not an address of the form IP:PORT".into(),
            });
            None
        }
    }
}

fn reasoning_field(key: &str, value: &str, errs: &mut Vec<ConfigError>) -> OutputField {
    value.parse().unwrap_or_else(|_| {
        errs.push(ConfigError::BadValue {
            key: key.into(),
            value: value.into(),
            reason: "is not one of reasoning_content, reasoning, both".into(),
        });
        OutputField::default()
    })
}

fn nonzero(key: &str, value: u64, errs: &mut Vec<ConfigError>) -> u64 {
    if value == 0 {
        errs.push(ConfigError::Zero { key: key.into() });
    }
    value
}

/// A number greater than zero or `"auto"`; `auto_refused` says why "auto" cannot be had here.
fn sizing(
    key: &str,
    raw: RawSizing,
    auto_refused: Option<&str>,
    errs: &mut Vec<ConfigError>,
) -> Option<Sizing> {
    let number = match raw {
        RawSizing::Word(w) if w == "auto" => {
            if let Some(reason) = auto_refused {
                errs.push(ConfigError::BadValue {
                    key: key.into(),
                    value: w,
                    reason: reason.into(),
                });
                return None;
            }
            return Some(Sizing::Auto);
        }
        RawSizing::Word(w) => match w.trim().parse::<u64>() {
            Ok(n) => n,
            Err(_) => {
                errs.push(ConfigError::BadValue {
                    key: key.into(),
                    value: w,
                    reason: "is neither a number nor \"auto\"".into(),
                });
                return None;
            }
        },
        RawSizing::Number(n) => n,
    };
    match u32::try_from(number).ok().and_then(NonZeroU32::new) {
        Some(n) => Some(Sizing::Fixed(n)),
        None if number == 0 => {
            errs.push(ConfigError::Zero { key: key.into() });
            None
        }
        None => {
            errs.push(ConfigError::BadValue {
                key: key.into(),
                value: number.to_string(),
                reason: "is larger than 4294967295".into(),
            });
            None
        }
    }
}

/// `value` (or `default`) milliseconds, refused when zero.
fn ms(key: &str, value: Option<u64>, default: u64, errs: &mut Vec<ConfigError>) -> Duration {
    Duration::from_millis(nonzero(key, value.unwrap_or(default), errs))
}

/// `value` (or `default`) seconds, refused when zero.
fn secs(key: &str, value: Option<u64>, default: u64, errs: &mut Vec<ConfigError>) -> Duration {
    Duration::from_secs(nonzero(key, value.unwrap_or(default), errs))
}

/// One per CPU: the default of the worker and count concurrency.
fn cores() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

#[cfg(test)]
mod tests;
