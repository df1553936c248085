//! `[backends.NAME]`: the URL and its TLS, slots, the key, timeouts and APIs of one backend.

use std::num::NonZeroU32;
use std::time::Duration;

use url::Url;

use super::{nonzero, sizing};
use crate::address::TlsSpec;
use crate::config::error::ConfigError;
use crate::config::keys::bearer;
use crate::config::model::{Backend, Sizing, Timeouts};
use crate::config::raw::RawBackend;

/// A backend's own timeouts, each defaulting to the server's.
fn backend_timeouts(
    name: &str,
    raw: &RawBackend,
    server: &Timeouts,
    errs: &mut Vec<ConfigError>,
) -> Timeouts {
    let mut own = |key: &str, v: Option<u64>, unit: fn(u64) -> Duration, default: Duration| {
        v.map_or(default, |v| {
            unit(nonzero(&format!("backends.{name}.{key}"), v, errs))
        })
    };
    Timeouts {
        connect: own(
            "connect_timeout_ms",
            raw.connect_timeout_ms,
            Duration::from_millis,
            server.connect,
        ),
        first_byte: own(
            "header_timeout_secs",
            raw.header_timeout_secs,
            Duration::from_secs,
            server.first_byte,
        ),
        idle: own(
            "stream_idle_timeout_ms",
            raw.stream_idle_timeout_ms,
            Duration::from_millis,
            server.idle,
        ),
        total: own(
            "total_timeout_secs",
            raw.total_timeout_secs,
            Duration::from_secs,
            server.total,
        ),
    }
}

pub(super) fn backend(
    name: &str,
    raw: RawBackend,
    server: &Timeouts,
    errs: &mut Vec<ConfigError>,
) -> Option<Backend> {
    let timeouts = backend_timeouts(name, &raw, server, errs);
    let key = format!("backends.{name}.url");
    let url = match Url::parse(&raw.url) {
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            Err(format!("scheme {:?} is not http or https", u.scheme()))
        }
        Ok(u) if u.host_str().is_none() => Err("no host".to_string()),
        Ok(u) if u.query().is_some() || u.fragment().is_some() => {
            Err("a base URL takes no query or fragment".to_string())
        }
        Ok(u) if u.path().trim_end_matches('/').ends_with("/v1") => Err(
            "the base URL is the server root: leave out /v1 (requests keep their own /v1/... path)"
                .to_string(),
        ),
        Ok(u) => Ok(u),
        Err(e) => Err(e.to_string()),
    };
    let address = url.and_then(|u| crate::address::address(&u).map(|a| (u, a)));
    let (url, address) = match address {
        Ok(ua) => ua,
        Err(reason) => {
            errs.push(ConfigError::BadUrl {
                key,
                value: raw.url,
                reason,
            });
            return None;
        }
    };
    let tls = match (address.server_name, raw.ca_file) {
        (Some(server_name), ca_file) => Some(TlsSpec {
            server_name,
            ca_file,
        }),
        (None, Some(ca_file)) => {
            errs.push(ConfigError::BadValue {
                key: format!("backends.{name}.ca_file"),
                value: ca_file.display().to_string(),
                reason: "is only for an https url".into(),
            });
            None
        }
        (None, None) => None,
    };
    let slots_setting = match raw.slots {
        None => Sizing::Fixed(NonZeroU32::MIN),
        Some(s) => sizing(
            &format!("backends.{name}.slots"),
            s,
            raw.flavor.runtime().slots_unknown,
            errs,
        )?,
    };
    let api_key = match raw.api_key_env {
        Some(var) => match std::env::var(&var) {
            Ok(k) => match bearer(&k) {
                Ok(v) => Some(v),
                Err(reason) => {
                    errs.push(ConfigError::BadValue {
                        key: format!("backends.{name}.api_key_env"),
                        value: var,
                        reason,
                    });
                    None
                }
            },
            Err(_) => {
                errs.push(ConfigError::BadValue {
                    key: format!("backends.{name}.api_key_env"),
                    value: var,
                    reason: "is not set in the environment".into(),
                });
                None
            }
        },
        None => None,
    };
    let apis = crate::config::apis::parse(name, raw.apis, raw.flavor, errs);
    Some(Backend {
        name: name.to_string(),
        url: url.as_str().trim_end_matches('/').to_string(),
        authority: address.authority,
        path_prefix: address.path_prefix,
        tls,
        flavor: raw.flavor,
        slots: slots_setting.fixed().unwrap_or(NonZeroU32::MIN),
        slots_setting,
        queue: raw.queue.unwrap_or(64),
        api_key,
        timeouts,
        apis,
    })
}
