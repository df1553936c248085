//! Turns raw config into typed config, collecting every error with the key and value it concerns.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use url::Url;

use super::apis::Apis;
use super::counting::{CountKind, GateConfig, MediaCosts, TokenizerFiles};
use super::names::name_check;
use super::raw::{RawAlias, RawBackend, RawConfig, RawServer, RawSizing};
use super::routing::{context_fallbacks, fallbacks, replicas};
use crate::address::TlsSpec;
use crate::flavor::Flavor;
use crate::reasoning::{OutputField, ThinkTags, ThinkTagsSpec};
use crate::wire::shape::ShapeSpec;

/// A validated configuration: every reference resolved, every value in range.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: Server,
    pub backends: BTreeMap<String, Arc<Backend>>,
    pub aliases: BTreeMap<String, Arc<Alias>>,
    /// Named clients and the queue's classes.
    pub clients: Arc<super::clients::Clients>,
    /// Where spans go; `None`: tracing off.
    pub tracing: Option<super::tracing::Tracing>,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub reasoning_field: OutputField,
    pub body_limit: usize,
    /// Most bytes of a whole (non-streamed) answer held to be read or rewritten; a longer
    /// one is relayed as it comes when nothing rewrites it, else refused.
    pub answer_limit: usize,
    /// Most bytes of one stream event held until its end; a longer one ends the stream.
    pub event_limit: usize,
    /// A request a backend took and then closed or reset without a byte of answer goes to
    /// the next replica or fallback, once (false: it is the client's 502, as the backend may
    /// have run it). Unset: for the APIs whose adapter says so (chat completions, Responses,
    /// Messages), not for the others.
    pub resend_unanswered: Option<bool>,
    /// Token counts at once, their wait for a turn, and the text one may tokenize.
    pub count: GateConfig,
    pub connect_timeout: Duration,
    pub header_timeout: Duration,
    pub shutdown_grace: Duration,
    pub health_interval: Duration,
    pub queue_timeout: Duration,
    /// Worker threads, each with its own runtime and listener.
    pub workers: usize,
    /// How long to wait for the first event of an SGLang stream (which may be a context error).
    pub stream_peek: Duration,
    /// Client keys accepted in `Authorization: Bearer …`; `None` = open.
    pub api_keys: Option<Vec<String>>,
    /// The backend-side timeouts of a backend that sets none of its own.
    pub timeouts: Timeouts,
    /// What a client connection may take: time, connections, nesting.
    pub client: ClientSide,
    pub breaker: BreakerConfig,
    /// Reload when the config file changes (besides SIGHUP).
    pub watch_config: bool,
    /// Changes to the file closer together than this are one reload.
    pub reload_debounce: Duration,
    /// A file that keeps changing is reloaded at least this often.
    pub reload_max_delay: Duration,
}

/// The client side's limits (`[server]` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSide {
    /// Time a client has to send a request's whole head, from its first byte.
    pub header_timeout: Duration,
    /// Time a client connection may sit idle between requests (or before the first).
    pub idle_timeout: Duration,
    /// Time a client may leave between two pieces of a request's body (and from the head to
    /// the first piece).
    pub body_timeout: Duration,
    /// Time a client has to send a request's whole body, from its head.
    pub body_total_timeout: Duration,
    /// Most client connections open at once (all workers); `None`: from the process's file
    /// descriptor limit when the server starts ([`crate::http::server`]).
    pub max_connections: Option<usize>,
    /// Deepest nesting of arrays and objects a request body may have.
    pub json_depth_limit: usize,
}

/// The limits of one exchange with a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open the TCP connection.
    pub connect: Duration,
    /// From sending the request to the answer's head (a long prefill counts here).
    pub first_byte: Duration,
    /// Between two pieces of an answer's body (two events of a stream).
    pub idle: Duration,
    /// The whole exchange, head and body.
    pub total: Duration,
}

/// When a backend's circuit breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open it.
    pub failures: NonZeroU32,
    /// How long it stays open before one request (or probe) is let through.
    pub open_for: Duration,
}

/// A figure the config gives (`Fixed`) or leaves to the backend (`"auto"`, taken from what
/// the backend reports when the snapshot is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    Fixed(NonZeroU32),
    Auto,
}

impl Sizing {
    pub fn is_auto(self) -> bool {
        self == Sizing::Auto
    }

    /// The configured number; `None` for `"auto"`.
    pub fn fixed(self) -> Option<NonZeroU32> {
        match self {
            Sizing::Fixed(n) => Some(n),
            Sizing::Auto => None,
        }
    }
}

impl std::fmt::Display for Sizing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sizing::Fixed(n) => write!(f, "{n}"),
            Sizing::Auto => f.write_str("auto"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Backend {
    pub name: String,
    /// Base URL without a trailing slash, e.g. `http://dankclaw:7771`.
    pub url: String,
    pub flavor: Flavor,
    /// `host:port` the backend is reached at (the URL's port, or its scheme's default).
    pub authority: String,
    /// The URL's path, put before every request path (empty for a server root).
    pub path_prefix: String,
    /// For an https backend: the name its certificate must show, and its `ca_file`.
    pub tls: Option<TlsSpec>,
    /// Slots in force: the configured number; with `slots = "auto"` the backend's own count
    /// once discovered, 1 until then.
    pub slots: NonZeroU32,
    /// `slots` as configured.
    pub slots_setting: Sizing,
    pub queue: u32,
    /// The backend's own key as the `Authorization: Bearer …` value that replaces the
    /// client's, made and checked once here (marked sensitive: never logged or shown).
    pub api_key: Option<HeaderValue>,
    pub timeouts: Timeouts,
    /// The wire APIs it serves itself; the others are translated to chat completions.
    pub apis: Apis,
}

pub use crate::wire::shape::Input;

#[derive(Debug, Clone)]
pub struct Alias {
    pub name: String,
    /// `name` as the `X-Switchboard-Alias` value of every answer (made once, here).
    pub served_as: HeaderValue,
    /// The first of `backends`: the one whose flavour shapes the body and whose endpoints
    /// count tokens (`count = "backend"`).
    pub backend: Arc<Backend>,
    /// Every replica, `backend` first; requests go to the least loaded usable one.
    pub backends: Vec<Arc<Backend>>,
    /// Aliases tried in order when no backend of this one can take a request.
    pub fallbacks: Vec<String>,
    pub upstream_model: String,
    /// The window in force: the configured number; with `context_window = "auto"` the
    /// backend's per-slot window once discovered, `None` (no guard) until then.
    pub context_window: Option<NonZeroU32>,
    /// `context_window` as configured; `None` when unset.
    pub window_setting: Option<Sizing>,
    /// The context guard's settings; present when `context_window` is set, in force once the
    /// window is known. Its counter is built with the snapshot (`crate::live`), which loads
    /// the tokenizer.
    pub guard: Option<GuardConfig>,
    /// Where over-window requests go instead of being rejected (an alias with a larger window).
    pub context_fallback: Option<String>,
    /// Defaults, stripped fields, the output cap and the input kinds taken.
    pub shape: ShapeSpec,
    pub old_names: Vec<String>,
    pub reasoning_field: Option<OutputField>,
    /// Inline reasoning markers to split out of `content` (opt-in per alias).
    pub think_tags: Option<Arc<ThinkTags>>,
    pub description: Option<String>,
}

/// How an alias's prompts are counted and judged (`count`, `tokenizer`, `media_tokens`,
/// `clamp_max_tokens`) against the alias's `context_window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardConfig {
    /// The counting strategy (the default resolved: local with a tokenizer, else estimate).
    pub count: CountKind,
    pub tokenizer: Option<TokenizerFiles>,
    pub media: MediaCosts,
    pub clamp_max_tokens: bool,
}

impl GuardConfig {
    /// The key and value to name when the counter of this guard cannot be built.
    pub fn counter_key(&self) -> (&'static str, String) {
        match &self.tokenizer {
            Some(t) if self.count != CountKind::Backend => {
                ("tokenizer", t.file.display().to_string())
            }
            _ => ("count", self.count.as_str().to_string()),
        }
    }
}

/// One problem in the config, naming the key and the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Load(String),
    #[error("aliases.{alias}.backend: {name:?} is not a defined backend")]
    UnknownBackend { alias: String, name: String },
    #[error("{key}: name {name:?} is already used by {other}")]
    DuplicateName {
        key: String,
        name: String,
        other: String,
    },
    #[error("{key}: {value:?} is not a valid URL ({reason})")]
    BadUrl {
        key: String,
        value: String,
        reason: String,
    },
    #[error("{key}: must be greater than zero, got 0")]
    Zero { key: String },
    #[error("{key}: {value:?} {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
    },
}

/// Every error found in one config; printed one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

const DEFAULT_LISTEN: &str = "0.0.0.0:7700";

/// Validate a raw config. Collects all errors rather than stopping at the first.
pub fn validate(raw: RawConfig) -> Result<Config, ConfigErrors> {
    let mut errs = Vec::new();
    let server = server(raw.server, &mut errs);
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
        if let Some(b) = backend(&name, b, &server.timeouts, &mut errs) {
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
        if let Some(a) = alias(&name, a, &backends, &mut errs) {
            aliases.insert(name, Arc::new(a));
        }
    }
    context_fallbacks(&aliases, &mut errs);
    fallbacks(&aliases, &mut errs);
    let clients = super::clients::validate(
        raw.clients,
        raw.priority,
        server.api_keys.as_deref(),
        &aliases,
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

/// The client keys in the environment variable `server.api_keys_env` names.
fn api_keys(var: Option<&str>, errs: &mut Vec<ConfigError>) -> Option<Vec<String>> {
    var.map(|var| super::clients::keys_of("server.api_keys_env", var, errs))
}

/// The backend-side defaults of `[server]`: timeouts and the breaker.
fn backend_side(raw: &RawServer, errs: &mut Vec<ConfigError>) -> (Timeouts, BreakerConfig) {
    let timeouts = Timeouts {
        connect: ms(
            "server.connect_timeout_ms",
            raw.connect_timeout_ms,
            3000,
            errs,
        ),
        first_byte: secs(
            "server.header_timeout_secs",
            raw.header_timeout_secs,
            900,
            errs,
        ),
        idle: ms(
            "server.stream_idle_timeout_ms",
            raw.stream_idle_timeout_ms,
            300_000,
            errs,
        ),
        total: secs(
            "server.total_timeout_secs",
            raw.total_timeout_secs,
            3600,
            errs,
        ),
    };
    let failures = raw.breaker_failures.unwrap_or(5);
    let breaker = BreakerConfig {
        failures: NonZeroU32::new(failures).unwrap_or_else(|| {
            errs.push(ConfigError::Zero {
                key: "server.breaker_failures".into(),
            });
            NonZeroU32::MIN
        }),
        open_for: ms("server.breaker_open_ms", raw.breaker_open_ms, 10_000, errs),
    };
    (timeouts, breaker)
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

/// Why a backend of `flavor` cannot have `slots = "auto"`, if it cannot.
fn slots_auto_refused(flavor: Flavor) -> Option<&'static str> {
    match flavor {
        Flavor::Llamacpp | Flavor::Sglang => None,
        Flavor::Vllm => {
            Some("needs a number: vllm does not report its slot count (--max-num-seqs) over HTTP")
        }
        Flavor::Openai => Some("needs a number: an openai backend reports no slot count"),
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

fn server(raw: RawServer, errs: &mut Vec<ConfigError>) -> Server {
    let listen = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen = socket_addr("server.listen", listen, errs)
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 7700)));
    let metrics_listen = raw
        .metrics_listen
        .as_deref()
        .and_then(|v| socket_addr("server.metrics_listen", v, errs));
    let reasoning = raw
        .reasoning_field
        .as_deref()
        .unwrap_or("reasoning_content");
    let api_keys = api_keys(raw.api_keys_env.as_deref(), errs);
    let (timeouts, breaker) = backend_side(&raw, errs);
    Server {
        timeouts,
        client: client_side(&raw, errs),
        breaker,
        watch_config: raw.watch_config.unwrap_or(true),
        reload_debounce: Duration::from_millis(raw.reload_debounce_ms.unwrap_or(200)),
        reload_max_delay: ms(
            "server.reload_max_delay_ms",
            raw.reload_max_delay_ms,
            2000,
            errs,
        ),
        listen,
        metrics_listen,
        reasoning_field: reasoning_field("server.reasoning_field", reasoning, errs),
        body_limit: nonzero(
            "server.body_limit_bytes",
            raw.body_limit_bytes.unwrap_or(64 << 20),
            errs,
        ) as usize,
        answer_limit: nonzero(
            "server.answer_limit_bytes",
            raw.answer_limit_bytes.unwrap_or(64 << 20),
            errs,
        ) as usize,
        event_limit: nonzero(
            "server.event_limit_bytes",
            raw.event_limit_bytes.unwrap_or(8 << 20),
            errs,
        ) as usize,
        resend_unanswered: raw.resend_unanswered,
        count: count_gate(&raw, errs),
        connect_timeout: timeouts.connect,
        header_timeout: timeouts.first_byte,
        shutdown_grace: Duration::from_secs(raw.shutdown_grace_secs.unwrap_or(30)),
        health_interval: secs(
            "server.health_interval_secs",
            raw.health_interval_secs,
            10,
            errs,
        ),
        queue_timeout: secs(
            "server.queue_timeout_secs",
            raw.queue_timeout_secs,
            300,
            errs,
        ),
        stream_peek: Duration::from_millis(raw.stream_peek_ms.unwrap_or(2000)),
        workers: nonzero(
            "server.workers",
            raw.workers.map_or_else(cores, |w| w as u64),
            errs,
        ) as usize,
        api_keys,
    }
}

/// The client side's limits of `[server]`.
fn client_side(raw: &RawServer, errs: &mut Vec<ConfigError>) -> ClientSide {
    ClientSide {
        header_timeout: ms(
            "server.client_header_timeout_ms",
            raw.client_header_timeout_ms,
            30_000,
            errs,
        ),
        idle_timeout: ms(
            "server.client_idle_timeout_ms",
            raw.client_idle_timeout_ms,
            120_000,
            errs,
        ),
        body_timeout: ms(
            "server.client_body_timeout_ms",
            raw.client_body_timeout_ms,
            30_000,
            errs,
        ),
        body_total_timeout: ms(
            "server.client_body_total_timeout_ms",
            raw.client_body_total_timeout_ms,
            300_000,
            errs,
        ),
        max_connections: raw
            .max_connections
            .map(|n| nonzero("server.max_connections", n, errs) as usize),
        json_depth_limit: nonzero(
            "server.json_depth_limit",
            raw.json_depth_limit.unwrap_or(64),
            errs,
        ) as usize,
    }
}

/// Token counts at once, their wait for a turn, and the text one may tokenize.
fn count_gate(raw: &RawServer, errs: &mut Vec<ConfigError>) -> GateConfig {
    GateConfig {
        concurrency: nonzero(
            "server.count_concurrency",
            raw.count_concurrency.unwrap_or_else(cores),
            errs,
        ) as usize,
        wait: ms(
            "server.count_queue_timeout_ms",
            raw.count_queue_timeout_ms,
            30_000,
            errs,
        ),
        limit_bytes: usize::try_from(nonzero(
            "server.count_limit_bytes",
            raw.count_limit_bytes.unwrap_or(8 << 20),
            errs,
        ))
        .unwrap_or(usize::MAX),
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

/// Why `key` cannot be sent as a header value as it is (nothing if it can): an API key is
/// visible ASCII with no space. The reason never quotes the key.
pub(super) fn sendable(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("is empty".into());
    }
    let Some(at) = key.bytes().position(|b| !b.is_ascii_graphic()) else {
        return Ok(());
    };
    let what = match key.as_bytes()[at] {
        b'\r' | b'\n' => "a line break (CR or LF)",
        b' ' | b'\t' => "a space or tab",
        b if b.is_ascii_control() => "a control character",
        _ => "a character that is not ASCII",
    };
    Err(format!(
        "holds {what} at byte {at}, which cannot be sent in a header (the key is not shown)"
    ))
}

/// A backend key as the sensitive `Authorization: Bearer …` value it is sent in, or why it
/// cannot be one.
pub fn bearer(key: &str) -> Result<HeaderValue, String> {
    sendable(key)?;
    let mut v =
        HeaderValue::try_from(format!("Bearer {key}")).map_err(|_| "is not a header value")?;
    v.set_sensitive(true);
    Ok(v)
}

fn backend(
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
            slots_auto_refused(raw.flavor),
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
    let apis = super::apis::parse(name, raw.apis, raw.flavor, errs);
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

/// An alias's `context_window` (a number, or "auto" where its backend reports one) and
/// `max_output_tokens` (below a numeric window).
fn window_and_cap(
    name: &str,
    raw: &mut RawAlias,
    backend: &Backend,
    errs: &mut Vec<ConfigError>,
) -> (Option<Sizing>, Option<NonZeroU32>) {
    let window_auto_refused = (backend.flavor == Flavor::Openai)
        .then_some("needs a number: an openai backend reports no context window");
    let window_setting = raw.context_window.take().and_then(|w| {
        sizing(
            &format!("aliases.{name}.context_window"),
            w,
            window_auto_refused,
            errs,
        )
    });
    let max_output_tokens = match raw.max_output_tokens {
        Some(0) => {
            errs.push(ConfigError::Zero {
                key: format!("aliases.{name}.max_output_tokens"),
            });
            None
        }
        m => m.and_then(NonZeroU32::new),
    };
    if let (Some(m), Some(Sizing::Fixed(w))) = (max_output_tokens, window_setting) {
        if m >= w {
            errs.push(ConfigError::BadValue {
                key: format!("aliases.{name}.max_output_tokens"),
                value: m.to_string(),
                reason: format!("leaves no room for a prompt in context_window {w}"),
            });
        }
    }
    (window_setting, max_output_tokens)
}

/// The guard settings of an alias with a `context_window`; without one, each guard key set
/// is an error.
fn guard_config(
    name: &str,
    window_setting: Option<Sizing>,
    raw: &mut RawAlias,
    errs: &mut Vec<ConfigError>,
) -> Option<GuardConfig> {
    let Some(_) = window_setting else {
        let set = [
            ("count", raw.count.is_some()),
            ("tokenizer", raw.tokenizer.is_some()),
            ("clamp_max_tokens", raw.clamp_max_tokens.is_some()),
            ("media_tokens", raw.media_tokens.is_some()),
        ];
        for (key, _) in set.iter().filter(|(_, is_set)| *is_set) {
            errs.push(ConfigError::BadValue {
                key: format!("aliases.{name}.{key}"),
                value: "set".into(),
                reason: "needs context_window".into(),
            });
        }
        return None;
    };
    let count = raw.count.unwrap_or(if raw.tokenizer.is_some() {
        CountKind::Local
    } else {
        CountKind::Estimate
    });
    if count == CountKind::Local && raw.tokenizer.is_none() {
        errs.push(ConfigError::BadValue {
            key: format!("aliases.{name}.count"),
            value: "local".into(),
            reason: "needs tokenizer = { file, config } (tokenizer.json and tokenizer_config.json)"
                .into(),
        });
    }
    Some(GuardConfig {
        count,
        tokenizer: raw.tokenizer.take(),
        media: raw.media_tokens.unwrap_or_default(),
        clamp_max_tokens: raw.clamp_max_tokens.unwrap_or(false),
    })
}

/// The alias's inline reasoning markers (`think_tags`, `think_tags_start_open`).
fn think_tags(name: &str, raw: &RawAlias, errs: &mut Vec<ConfigError>) -> Option<Arc<ThinkTags>> {
    let tags = raw.think_tags.as_ref().and_then(|spec| {
        match spec.resolve(raw.think_tags_start_open.unwrap_or(false)) {
            Ok(t) => Some(Arc::new(t)),
            Err(reason) => {
                errs.push(ConfigError::BadValue {
                    key: format!("aliases.{name}.think_tags"),
                    value: match spec {
                        ThinkTagsSpec::Preset(p) => p.clone(),
                        ThinkTagsSpec::Pair([open, close]) => format!("[{open}, {close}]"),
                    },
                    reason,
                });
                None
            }
        }
    });
    if raw.think_tags_start_open.is_some() && raw.think_tags.is_none() {
        errs.push(ConfigError::BadValue {
            key: format!("aliases.{name}.think_tags_start_open"),
            value: "set".into(),
            reason: "needs think_tags".into(),
        });
    }
    tags
}

fn alias(
    name: &str,
    mut raw: RawAlias,
    backends: &BTreeMap<String, Arc<Backend>>,
    errs: &mut Vec<ConfigError>,
) -> Option<Alias> {
    let replicas = replicas(name, &raw, backends, errs)?;
    let backend = &replicas[0];
    let (window_setting, max_output_tokens) = window_and_cap(name, &mut raw, backend, errs);
    let guard = guard_config(name, window_setting, &mut raw, errs);
    let mut inputs = Input::default();
    for (i, kind) in raw
        .inputs
        .clone()
        .unwrap_or_else(|| vec!["text".into()])
        .iter()
        .enumerate()
    {
        match kind.as_str() {
            "text" => {}
            "image" => inputs.image = true,
            "audio" => inputs.audio = true,
            other => errs.push(ConfigError::BadValue {
                key: format!("aliases.{name}.inputs[{i}]"),
                value: other.into(),
                reason: "is not one of text, image, audio".into(),
            }),
        }
    }
    let reasoning = raw
        .reasoning_field
        .as_deref()
        .map(|v| reasoning_field(&format!("aliases.{name}.reasoning_field"), v, errs));
    let think_tags = think_tags(name, &raw, errs);
    let shape = shape(
        name,
        inputs,
        raw.defaults,
        raw.strip_params,
        max_output_tokens,
        errs,
    );
    let upstream_model = raw.upstream_model.unwrap_or_else(|| name.to_string());
    Some(Alias {
        name: name.to_string(),
        served_as: HeaderValue::from_str(name).unwrap_or(HeaderValue::from_static("invalid")),
        backend: Arc::clone(backend),
        backends: replicas.clone(),
        fallbacks: raw.fallbacks,
        upstream_model,
        context_window: window_setting.and_then(Sizing::fixed),
        window_setting,
        guard,
        context_fallback: raw.context_fallback,
        shape,
        old_names: raw.old_names,
        reasoning_field: reasoning,
        think_tags,
        description: raw.description,
    })
}

/// Sampling fields whose value must be a number that is not negative.
const NUMERIC: [&str; 6] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
];

/// The keys `defaults` and `strip_params` of one alias, with its inputs and its validated
/// `max_output_tokens` ([`window_and_cap`]).
fn shape(
    name: &str,
    inputs: Input,
    defaults: Option<serde_json::Map<String, serde_json::Value>>,
    strip: Option<Vec<String>>,
    max_output_tokens: Option<NonZeroU32>,
    errs: &mut Vec<ConfigError>,
) -> ShapeSpec {
    let strip = strip.unwrap_or_default();
    let defaults = defaults.unwrap_or_default();
    let mut bad = |key: String, value: String, reason: &str| {
        errs.push(ConfigError::BadValue {
            key,
            value,
            reason: reason.into(),
        })
    };
    for (key, value) in &defaults {
        let at = format!("aliases.{name}.defaults.{key}");
        let shown = match value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if crate::wire::shape::is_request_field(key) {
            bad(at, shown, "is part of each request, not a default");
        } else if strip.contains(key) {
            bad(at, shown, "is also in strip_params");
        } else if NUMERIC.contains(&key.as_str())
            && !value.as_f64().is_some_and(|v| v >= 0.0 && v.is_finite())
        {
            bad(at, shown, "is not a number of zero or more");
        }
    }
    for (i, key) in strip.iter().enumerate() {
        let at = format!("aliases.{name}.strip_params[{i}]");
        if key.is_empty() {
            bad(at, key.clone(), "is empty");
        } else if crate::wire::shape::is_request_field(key) {
            bad(
                at,
                key.clone(),
                "is part of each request and cannot be removed",
            );
        } else if strip[..i].contains(key) {
            bad(at, key.clone(), "is listed twice");
        }
    }
    ShapeSpec {
        alias: name.to_string(),
        inputs,
        defaults,
        strip,
        max_output_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::super::names::{is_name, NAME_LIMIT};
    use crate::config::from_toml;

    const BASE: &str = r#"
        [backends.gpu]
        url = "http://dankclaw:7771"
        flavor = "llamacpp"
        slots = 4
        [aliases.frank-zealot]
        backend = "gpu"
        context_window = 262144
        old_names = ["frank-small"]
    "#;

    fn errors(extra: &str) -> String {
        match from_toml(&format!("{BASE}\n{extra}")) {
            Ok(_) => panic!("config with {extra:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn keys_that_cannot_be_sent_are_refused_without_being_shown() {
        let v = super::bearer("sk-backend_1.x~/+=").unwrap();
        assert_eq!(v, "Bearer sk-backend_1.x~/+=");
        assert!(v.is_sensitive());
        assert!(!format!("{v:?}").contains("sk-backend"));
        for (key, what) in [
            ("sk-secret\r", "a line break (CR or LF) at byte 9"),
            ("sk-secret\n", "a line break (CR or LF) at byte 9"),
            ("sk-se cret", "a space or tab at byte 5"),
            ("sk-\tsecret", "a space or tab at byte 3"),
            ("sk-\x7fsecret", "a control character at byte 3"),
            ("sk-\0secret", "a control character at byte 3"),
            ("sk-sécret", "a character that is not ASCII at byte 4"),
            ("", "is empty"),
        ] {
            let e = super::bearer(key).unwrap_err();
            assert!(e.contains(what), "{key:?}: {e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn names_that_labels_urls_and_the_page_cannot_carry_are_refused() {
        let e = errors("[aliases.\"m\\\"} 1\\ninjected_total{a=\\\"1\"]\nbackend = \"gpu\"");
        assert!(e.contains("is not a name"), "{e}");
        assert!(e.contains("aliases.m\"} 1\ninjected_total"), "{e}");
        let e = errors("[backends.\"g p u\"]\nurl = \"http://h:1\"\nflavor = \"llamacpp\"");
        assert!(e.contains("backends.g p u: \"g p u\" is not a name"), "{e}");
        let e = errors("[aliases.y]\nbackend = \"gpu\"\nold_names = [\"ok\", \"<b>\"]");
        assert!(
            e.contains("aliases.y.old_names[1]: \"<b>\" is not a name"),
            "{e}"
        );
        for good in [
            "qwen3-coder:30b",
            "Qwen/Qwen3-8B",
            "frank_zealot.v2",
            "a@b+c",
            "x",
        ] {
            assert!(is_name(good), "{good}");
        }
        let long = "a".repeat(NAME_LIMIT + 1);
        for bad in [
            "",
            "-lead",
            ".hidden",
            "sp ace",
            "quo\"te",
            "new\nline",
            "é",
            "a?b",
            "a%20",
            &long,
        ] {
            assert!(!is_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn base_config_is_valid() {
        let cfg = from_toml(BASE).unwrap();
        let a = &cfg.aliases["frank-zealot"];
        assert_eq!(a.upstream_model, "frank-zealot");
        assert_eq!(a.backend.url, "http://dankclaw:7771");
        assert_eq!(cfg.server.listen.port(), 7700);
    }

    #[test]
    fn alias_with_undefined_backend_names_the_key() {
        let e = errors("[aliases.x]\nbackend = \"nope\"");
        assert!(
            e.contains("aliases.x.backend: \"nope\" is not a defined backend"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_names_name_both_keys() {
        let e = errors("[aliases.y]\nbackend = \"gpu\"\nold_names = [\"frank-small\"]");
        assert!(e.contains("aliases.y.old_names: name \"frank-small\" is already used by aliases.frank-zealot.old_names"), "{e}");
        let e = errors("[aliases.z]\nbackend = \"gpu\"\nold_names = [\"frank-zealot\"]");
        assert!(e.contains("aliases.z.old_names: name \"frank-zealot\" is already used by aliases.frank-zealot"), "{e}");
    }

    #[test]
    fn bad_url_names_the_key_and_value() {
        let e = errors("[backends.b2]\nurl = \"dankclaw:7771\"\nflavor = \"vllm\"");
        assert!(
            e.contains("backends.b2.url: \"dankclaw:7771\" is not a valid URL"),
            "{e}"
        );
        let e = errors("[backends.b3]\nurl = \"not a url\"\nflavor = \"vllm\"");
        assert!(e.contains("backends.b3.url: \"not a url\""), "{e}");
    }

    /// Both schemes get an authority and a path prefix; https a server name and its
    /// `ca_file`, which validation does not read; `ca_file` on an http URL is refused.
    #[test]
    fn backends_of_both_schemes_have_an_address() {
        let cfg = from_toml(&format!(
            "{BASE}\n[backends.s]\nurl = \"https://gpu-box.fleet/llm/\"\nflavor = \"vllm\"\nca_file = \"/nowhere/ca.pem\""
        ))
        .unwrap();
        let (http, https) = (&cfg.backends["gpu"], &cfg.backends["s"]);
        assert_eq!(
            (http.authority.as_str(), http.path_prefix.as_str()),
            ("dankclaw:7771", "")
        );
        assert!(http.tls.is_none());
        assert_eq!(
            (https.authority.as_str(), https.path_prefix.as_str()),
            ("gpu-box.fleet:443", "/llm")
        );
        let tls = https.tls.as_ref().unwrap();
        assert_eq!(tls.server_name.to_str(), "gpu-box.fleet");
        assert_eq!(
            tls.ca_file.as_deref(),
            Some(std::path::Path::new("/nowhere/ca.pem"))
        );
        let e =
            errors("[backends.p]\nurl = \"http://h:1\"\nflavor = \"vllm\"\nca_file = \"ca.pem\"");
        assert!(
            e.contains("backends.p.ca_file: \"ca.pem\" is only for an https url"),
            "{e}"
        );
    }

    #[test]
    fn zero_window_and_zero_slots_are_refused() {
        let e = errors("[aliases.w]\nbackend = \"gpu\"\ncontext_window = 0");
        assert!(
            e.contains("aliases.w.context_window: must be greater than zero"),
            "{e}"
        );
        let e = errors("[backends.b4]\nurl = \"http://h:1\"\nflavor = \"sglang\"\nslots = 0");
        assert!(
            e.contains("backends.b4.slots: must be greater than zero"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let e = errors("[server]\nlisten_addr = \"0.0.0.0:1\"");
        assert!(e.contains("listen_addr"), "{e}");
        let e = errors("[aliases.q]\nbackend = \"gpu\"\ncontex_window = 5");
        assert!(e.contains("contex_window"), "{e}");
        let e = errors("[backends.b5]\nurl = \"http://h:1\"\nflavor = \"tgi\"");
        assert!(e.contains("tgi"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = errors("[server]\nlisten = \"nowhere\"\nreasoning_field = \"thoughts\"");
        assert!(e.contains("server.listen: \"nowhere\""), "{e}");
        assert!(
            e.contains("server.reasoning_field: \"thoughts\" is not one of"),
            "{e}"
        );
    }

    #[test]
    fn replicas_fallbacks_and_timeouts_are_checked() {
        let cfg = from_toml(&format!(
            "{BASE}\n[backends.gpu2]\nurl = \"http://h:2\"\nflavor = \"vllm\"\nstream_idle_timeout_ms = 500\n[aliases.r]\nbackends = [\"gpu\", \"gpu2\"]\nfallbacks = [\"frank-zealot\"]"
        ))
        .unwrap();
        let r = &cfg.aliases["r"];
        let names: Vec<&str> = r.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["gpu", "gpu2"]);
        assert_eq!(r.backend.name, "gpu");
        assert_eq!(r.fallbacks, ["frank-zealot"]);
        let idle = cfg.backends["gpu2"].timeouts.idle;
        assert_eq!(idle, std::time::Duration::from_millis(500));
        assert_eq!(cfg.backends["gpu"].timeouts, cfg.server.timeouts);

        let e = errors("[aliases.x]\nbackend = \"gpu\"\nbackends = [\"gpu\"]");
        assert!(
            e.contains("aliases.x.backends: \"set\" and backend are both set"),
            "{e}"
        );
        let e = errors("[aliases.x]\nupstream_model = \"m\"");
        assert!(e.contains("aliases.x.backend: \"unset\" is needed"), "{e}");
        let e = errors("[aliases.x]\nbackends = [\"gpu\", \"nope\", \"gpu\"]");
        assert!(
            e.contains("aliases.x.backends[1]: \"nope\" is not a defined backend"),
            "{e}"
        );
        assert!(
            e.contains("aliases.x.backends[2]: \"gpu\" is named twice"),
            "{e}"
        );
        let e = errors("[aliases.x]\nbackend = \"gpu\"\nfallbacks = [\"x\", \"nope\"]");
        assert!(
            e.contains("aliases.x.fallbacks[0]: \"x\" is the alias itself"),
            "{e}"
        );
        assert!(
            e.contains("aliases.x.fallbacks[1]: \"nope\" is not a defined alias"),
            "{e}"
        );
        let e = errors(
            "[aliases.x]\nbackend = \"gpu\"\nfallbacks = [\"y\"]\n[aliases.y]\nbackend = \"gpu\"\nfallbacks = [\"x\"]",
        );
        assert!(e.contains("\"x -> y -> x\" is a cycle"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let e =
            errors("[backends.z]\nurl = \"http://h:3\"\nflavor = \"vllm\"\ntotal_timeout_secs = 0");
        assert!(
            e.contains("backends.z.total_timeout_secs: must be greater than zero"),
            "{e}"
        );
    }

    #[test]
    fn shaping_keys_are_typed() {
        let cfg = from_toml(&format!(
            "{BASE}\n[aliases.s]\nbackend = \"gpu\"\ncontext_window = 8192\ninputs = [\"text\", \"image\"]\n\
             defaults = {{ temperature = 0.0, chat_template_kwargs = {{ enable_thinking = false }} }}\n\
             strip_params = [\"logprobs\"]\nmax_output_tokens = 1024"
        ))
        .unwrap();
        let s = &cfg.aliases["s"].shape;
        assert_eq!(s.alias, "s");
        assert!(s.inputs.image && !s.inputs.audio);
        assert_eq!(
            serde_json::Value::Object(s.defaults.clone()),
            serde_json::json!({"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": false}})
        );
        assert_eq!(s.strip, ["logprobs"]);
        assert_eq!(s.max_output_tokens.map(|c| c.get()), Some(1024));
        let plain = &cfg.aliases["frank-zealot"].shape;
        assert!(plain.defaults.is_empty() && plain.strip.is_empty());
        assert_eq!(plain.inputs, crate::wire::shape::Input::default());
    }

    #[test]
    fn bad_shaping_keys_name_the_key_and_value() {
        let e = errors("[aliases.s]\nbackend = \"gpu\"\ndefaults = { model = \"x\", temperature = \"hot\", top_p = 0.5 }");
        assert!(
            e.contains("aliases.s.defaults.model: \"x\" is part of each request, not a default"),
            "{e}"
        );
        assert!(
            e.contains("aliases.s.defaults.temperature: \"hot\" is not a number of zero or more"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 2, "{e}");
        let e = errors("[aliases.s]\nbackend = \"gpu\"\nstrip_params = [\"stream\", \"seed\", \"seed\"]\ndefaults = { seed = 1 }");
        assert!(
            e.contains("aliases.s.strip_params[0]: \"stream\" is part of each request"),
            "{e}"
        );
        assert!(
            e.contains("aliases.s.strip_params[2]: \"seed\" is listed twice"),
            "{e}"
        );
        assert!(
            e.contains("aliases.s.defaults.seed: \"1\" is also in strip_params"),
            "{e}"
        );
        let e = errors("[aliases.s]\nbackend = \"gpu\"\nmax_output_tokens = 0");
        assert!(
            e.contains("aliases.s.max_output_tokens: must be greater than zero"),
            "{e}"
        );
        let e =
            errors("[aliases.s]\nbackend = \"gpu\"\ncontext_window = 100\nmax_output_tokens = 100");
        assert!(
            e.contains("aliases.s.max_output_tokens: \"100\" leaves no room for a prompt in context_window 100"),
            "{e}"
        );
    }

    #[test]
    fn auto_window_and_slots_are_typed_and_refused_where_no_backend_reports_them() {
        let cfg = from_toml(&format!(
            "{BASE}\n[backends.a]\nurl = \"http://h:1\"\nflavor = \"sglang\"\nslots = \"auto\"\n\
             [aliases.x]\nbackend = \"a\"\ncontext_window = \"auto\"\nmax_output_tokens = 512"
        ))
        .unwrap();
        let x = &cfg.aliases["x"];
        assert_eq!(x.window_setting, Some(super::Sizing::Auto));
        assert_eq!(x.context_window, None, "no window until discovered");
        assert!(x.guard.is_some(), "the guard settings wait for the window");
        assert_eq!(x.shape.max_output_tokens.map(|m| m.get()), Some(512));
        assert_eq!(cfg.backends["a"].slots_setting, super::Sizing::Auto);
        assert_eq!(cfg.backends["a"].slots.get(), 1, "1 slot until discovered");
        let e = errors("[backends.v]\nurl = \"http://h:1\"\nflavor = \"vllm\"\nslots = \"auto\"");
        assert!(
            e.contains("backends.v.slots: \"auto\" needs a number: vllm"),
            "{e}"
        );
        let e = errors(
            "[backends.o]\nurl = \"http://h:1\"\nflavor = \"openai\"\n\
             [aliases.o]\nbackend = \"o\"\ncontext_window = \"auto\"",
        );
        assert!(
            e.contains("aliases.o.context_window: \"auto\" needs a number"),
            "{e}"
        );
        let e = errors("[aliases.b]\nbackend = \"gpu\"\ncontext_window = \"big\"");
        assert!(
            e.contains("aliases.b.context_window: \"big\" is neither a number nor \"auto\""),
            "{e}"
        );
        let e =
            errors("[aliases.m]\nbackend = \"gpu\"\ncontext_window = 100\nmax_output_tokens = 100");
        assert!(
            e.contains("aliases.m.max_output_tokens: \"100\" leaves no room"),
            "{e}"
        );
        assert!(from_toml(&BASE.replace("slots = 4", "slots = \"4\"")).is_ok());
    }

    #[test]
    fn every_error_is_reported_not_just_the_first() {
        let e = errors(
            "[aliases.x]\nbackend = \"nope\"\n[aliases.w]\nbackend = \"gpu\"\ncontext_window = 0",
        );
        assert_eq!(e.lines().count(), 2, "{e}");
    }
}
