//! `[backends.NAME]`: the URL and its TLS, slots, the key, timeouts and APIs of one backend —
//! as written, as validated, and the validation between them.

use std::num::NonZeroU32;
use std::time::Duration;

use http::HeaderValue;
use serde::Deserialize;
use url::Url;

use super::apis::Apis;
use super::error::ConfigError;
use super::keys::bearer;
use super::seed::Seed;
use super::sizing::{sizing, RawSizing, Sizing};
use super::values::nonzero;
use crate::flavor::Flavor;
use crate::runtime::Privacy;
use crate::upstream::tls::TlsSpec;
use crate::upstream::Origin;
use crate::wire::{Adapter, Converter};

/// `[backends.NAME]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    pub url: String,
    pub flavor: Flavor,
    pub slots: Option<RawSizing>,
    pub queue: Option<u32>,
    pub api_key_env: Option<String>,
    pub connect_timeout_ms: Option<u64>,
    pub(crate) header_timeout_secs: Option<u64>,
    pub(crate) stream_idle_timeout_ms: Option<u64>,
    pub(crate) total_timeout_secs: Option<u64>,
    pub ca_file: Option<std::path::PathBuf>,
    pub(crate) apis: Option<Vec<String>>,
    pub(crate) prefill_tokens_per_s: Option<f64>,
    pub(crate) prefill_half_depth: Option<f64>,
    pub(crate) decode_tokens_per_s: Option<f64>,
    pub(crate) decode_half_depth: Option<f64>,
    pub(crate) pin_slots: Option<bool>,
    pub(crate) cache_ram: Option<bool>,
}

/// The limits of one exchange with a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// To open the TCP connection.
    pub(crate) connect: Duration,
    /// From sending the request to the answer's head (a long prefill counts here).
    pub(crate) first_byte: Duration,
    /// Between two pieces of an answer's body (two events of a stream).
    pub(crate) idle: Duration,
    /// The whole exchange, head and body.
    pub(crate) total: Duration,
}

/// `[backends.NAME]` validated.
#[derive(Debug, Clone)]
pub struct Backend {
    pub name: String,
    /// Base URL without a trailing slash, e.g. `http://dankclaw:7771`.
    pub url: String,
    pub flavor: Flavor,
    /// `host:port` the backend is reached at (the URL's port, or its scheme's default).
    pub(crate) authority: String,
    /// The URL's path, put before every request path (empty for a server root).
    pub(crate) path_prefix: String,
    /// For an https backend: the name its certificate must show, and its `ca_file`.
    pub(crate) tls: Option<TlsSpec>,
    /// Slots in force: the configured number; with `slots = "auto"` the backend's own count
    /// once discovered, 1 until then.
    pub slots: NonZeroU32,
    /// `slots` as configured.
    pub(crate) slots_setting: Sizing,
    pub(crate) queue: u32,
    /// The backend's own key as the `Authorization: Bearer …` value that replaces the
    /// client's, made and checked once here (marked sensitive: never logged or shown).
    pub(crate) api_key: Option<HeaderValue>,
    pub(crate) timeouts: Timeouts,
    /// The wire APIs it serves itself; the others are translated to chat completions.
    pub(crate) apis: Apis,
    /// Its speeds before its answers are measured (the cost model's prior).
    pub(crate) seed: Seed,
    /// Each request is sent to the slot it took (`id_slot`), where its runtime takes that.
    pub(crate) pin_slots: bool,
    /// Its clients make several cache groups (`clients.NAME.cache_group`): a request never
    /// meets a prefix another group's request left ([`crate::runtime::Privacy`]), and the APIs
    /// its runtime cannot keep so are translated to chat completions.
    pub(crate) isolated: bool,
    /// llama.cpp: the server keeps prompts in host memory across its slots (`--cache-ram`,
    /// on unless started with `--cache-ram 0`), so no slot's cache is its last request's alone.
    pub(crate) cache_ram: bool,
}

impl Backend {
    /// How a request of `api` reaches this backend: `None` when it is sent as it is (chat, or
    /// an API the backend serves itself, converted there by its own converter) — see
    /// [`Backend::counting`] for what is counted then — else the translation to chat
    /// completions.
    pub(crate) fn translation(&self, api: &dyn Adapter) -> Option<Converter> {
        (!self.apis.serves(api)).then(|| Converter::translate(self.flavor))
    }

    /// The converter whose chat form of an `api` request is what this backend templates.
    pub(crate) fn counting(&self, api: &dyn Adapter) -> Converter {
        self.translation(api)
            .unwrap_or_else(|| Converter::native(self.flavor))
    }

    /// The backend as the upstream client reaches it: the one place its settings become the
    /// client's.
    pub(crate) fn origin(&self) -> Origin<'_> {
        Origin {
            name: &self.name,
            authority: &self.authority,
            path_prefix: &self.path_prefix,
            tls: self.tls.is_some(),
            connect: Some(self.timeouts.connect),
            auth: self.api_key.as_ref(),
        }
    }
}

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

/// Backend `name` as written, `isolated` where its clients make several cache groups.
pub(super) fn validate(
    name: &str,
    raw: RawBackend,
    (server, isolated): (&Timeouts, bool),
    errs: &mut Vec<ConfigError>,
) -> Option<Backend> {
    let timeouts = backend_timeouts(name, &raw, server, errs);
    let seed = seed(name, &raw, errs);
    let (url, address) = base_url(name, &raw.url, errs)?;
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
    let api_key = raw.api_key_env.and_then(|var| api_key(name, var, errs));
    let runtime = raw.flavor.runtime();
    let mut apis = super::apis::parse(name, raw.apis, raw.flavor, errs);
    if isolated {
        apis.keep_private(runtime.privacy);
    }
    let pin_slots = raw.pin_slots.unwrap_or(true) && !runtime.pins_slots.is_empty();
    if raw.cache_ram.is_some() && !matches!(runtime.privacy, Privacy::Slots(_)) {
        errs.push(ConfigError::BadValue {
            key: format!("backends.{name}.cache_ram"),
            value: raw.cache_ram.unwrap_or_default().to_string(),
            reason: format!("is for llama.cpp backends only, not {}", runtime.name),
        });
    }
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
        seed,
        pin_slots,
        isolated,
        cache_ram: raw.cache_ram.unwrap_or(true),
    })
}

/// `backends.NAME.url` checked: an http or https server root with a host, no query, fragment
/// or `/v1`; with the address it is reached at.
fn base_url(
    name: &str,
    raw: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<(Url, crate::address::Address)> {
    let key = format!("backends.{name}.url");
    let url = match Url::parse(raw) {
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
    let address = url.and_then(|u| {
        crate::address::address(&u)
            .map(|a| (u, a))
            .map_err(|e| e.to_string())
    });
    address
        .map_err(|reason| {
            errs.push(ConfigError::BadUrl {
                key,
                value: raw.to_string(),
                reason,
            })
        })
        .ok()
}

/// The backend's own key, from the environment variable `var` (`backends.NAME.api_key_env`),
/// as the `Authorization` value that replaces the client's.
fn api_key(name: &str, var: String, errs: &mut Vec<ConfigError>) -> Option<HeaderValue> {
    match std::env::var(&var) {
        Ok(k) => match bearer(&k) {
            Ok(v) => Some(v),
            Err(reason) => {
                errs.push(ConfigError::BadValue {
                    key: format!("backends.{name}.api_key_env"),
                    value: var,
                    reason: reason.to_string(),
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
    }
}

/// The cost model's seeds: each key set overrides the default speed; a speed or depth must be
/// a number above zero.
fn seed(name: &str, raw: &RawBackend, errs: &mut Vec<ConfigError>) -> Seed {
    let d = Seed::default();
    let mut positive = |key: &str, v: Option<f64>| {
        let v = v?;
        if v.is_finite() && v > 0.0 {
            return Some(v);
        }
        errs.push(ConfigError::BadValue {
            key: format!("backends.{name}.{key}"),
            value: v.to_string(),
            reason: "is not a number above zero".into(),
        });
        None
    };
    Seed {
        prefill_tps: positive("prefill_tokens_per_s", raw.prefill_tokens_per_s)
            .unwrap_or(d.prefill_tps),
        prefill_half_depth: positive("prefill_half_depth", raw.prefill_half_depth)
            .or(d.prefill_half_depth),
        decode_tps: positive("decode_tokens_per_s", raw.decode_tokens_per_s)
            .unwrap_or(d.decode_tps),
        decode_half_depth: positive("decode_half_depth", raw.decode_half_depth)
            .or(d.decode_half_depth),
    }
}
