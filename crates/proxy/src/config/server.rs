//! `[server]`: the listener, limits, the backend side's defaults and the client side — as
//! written, as validated, and the validation between them.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::Deserialize;

use super::backends::Timeouts;
use super::counting::GateConfig;
use super::error::ConfigError;
use super::schedule::{RawSchedule, Scheduling};
use super::values::{cores, ms, nonzero, reasoning_field, secs, socket_addr};
use crate::reasoning::OutputField;

/// `[server]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    pub(crate) metrics_listen: Option<String>,
    pub(crate) reasoning_field: Option<String>,
    pub(crate) body_limit_bytes: Option<u64>,
    pub(crate) answer_limit_bytes: Option<u64>,
    pub(crate) event_limit_bytes: Option<u64>,
    pub(crate) resend_unanswered: Option<bool>,
    pub(crate) count_concurrency: Option<u64>,
    pub(crate) count_queue_timeout_ms: Option<u64>,
    pub(crate) count_limit_bytes: Option<u64>,
    pub(crate) connect_timeout_ms: Option<u64>,
    pub(crate) header_timeout_secs: Option<u64>,
    pub(crate) shutdown_grace_secs: Option<u64>,
    pub(crate) health_interval_secs: Option<u64>,
    pub(crate) queue_timeout_secs: Option<u64>,
    pub(crate) stream_peek_ms: Option<u64>,
    pub(crate) workers: Option<usize>,
    pub(crate) api_keys_env: Option<String>,
    pub(crate) metrics_keys_env: Option<String>,
    pub(crate) admin_keys_env: Option<String>,
    pub(crate) data_dir: Option<String>,
    pub(crate) budget_timezone: Option<String>,
    pub(crate) stream_idle_timeout_ms: Option<u64>,
    pub(crate) total_timeout_secs: Option<u64>,
    pub(crate) client_header_timeout_ms: Option<u64>,
    pub(crate) client_idle_timeout_ms: Option<u64>,
    pub(crate) client_body_timeout_ms: Option<u64>,
    pub(crate) client_body_total_timeout_ms: Option<u64>,
    pub(crate) max_connections: Option<u64>,
    pub(crate) json_depth_limit: Option<u64>,
    pub(crate) breaker_failures: Option<u32>,
    pub(crate) breaker_open_ms: Option<u64>,
    pub(crate) watch_config: Option<bool>,
    pub(crate) reload_debounce_ms: Option<u64>,
    pub(crate) reload_max_delay_ms: Option<u64>,
    pub(crate) shared_state: Option<String>,
    pub(crate) shared_state_lease_ms: Option<u64>,
    pub(crate) shared_state_timeout_ms: Option<u64>,
    pub(crate) load_interval_ms: Option<u64>,
    pub(crate) after_spill: Option<String>,
    pub(crate) spill_wait_ms: Option<u64>,
    pub(crate) schedule: Option<String>,
    pub(crate) preempt_after_ms: Option<u64>,
    pub(crate) max_preemptions: Option<u32>,
    pub(crate) slot_hold_ms: Option<u64>,
    pub(crate) pin_slack_gpu_seconds: Option<f64>,
}

/// `[server]` validated.
#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub(crate) reasoning_field: OutputField,
    pub(crate) body_limit: usize,
    /// Most bytes of a whole (non-streamed) answer held to be read or rewritten; a longer
    /// one is relayed as it comes when nothing rewrites it, else refused.
    pub(crate) answer_limit: usize,
    /// Most bytes of one stream event held until its end; a longer one ends the stream.
    pub(crate) event_limit: usize,
    /// A request a backend took and then closed or reset without a byte of answer goes to
    /// the next replica or fallback, once (false: it is the client's 502, as the backend may
    /// have run it). Unset: for the APIs whose adapter says so (chat completions, Responses,
    /// Messages), not for the others.
    pub(crate) resend_unanswered: Option<bool>,
    /// Token counts at once, their wait for a turn, and the text one may tokenize.
    pub(crate) count: GateConfig,
    pub(crate) connect_timeout: Duration,
    pub shutdown_grace: Duration,
    pub(crate) health_interval: Duration,
    pub(crate) queue_timeout: Duration,
    /// Worker threads, each with its own runtime and listener.
    pub workers: usize,
    /// How long to wait for the first event of an SGLang stream (which may be a context error).
    pub(crate) stream_peek: Duration,
    /// Client keys accepted in `Authorization: Bearer …`; `None` = open.
    pub api_keys: Option<Vec<String>>,
    /// Keys that may scrape `/metrics` (`Authorization: Bearer …`); `None` = open.
    pub(crate) metrics_keys: Option<Vec<String>>,
    /// Keys that see the whole status page (every alias and client); `None`: none do beyond
    /// what a client key or an open proxy shows.
    pub(crate) admin_keys: Option<Vec<String>>,
    /// Where the proxy keeps its files (the ledger's SQLite file, unless `[ledger] url` says
    /// otherwise); `None`: nowhere.
    pub(crate) data_dir: Option<std::path::PathBuf>,
    /// The zone whose midnights start the clients' budgets of a day and a month.
    pub(crate) budget_timezone: crate::calendar::Calendar,
    /// The backend-side timeouts of a backend that sets none of its own.
    pub(crate) timeouts: Timeouts,
    /// What a client connection may take: time, connections, nesting.
    pub(crate) client: ClientSide,
    pub(crate) breaker: BreakerConfig,
    /// Reload when the config file changes (besides SIGHUP).
    pub watch_config: bool,
    /// Changes to the file closer together than this are one reload.
    pub(crate) reload_debounce: Duration,
    /// A file that keeps changing is reloaded at least this often.
    pub(crate) reload_max_delay: Duration,
    /// The store slot counts and client limits are kept in across processes; `None`: each
    /// process counts on its own.
    pub(crate) shared_state: Option<SharedState>,
    /// How often the load of replicas is read from the backends; `None`: never (each process
    /// counts only its own requests).
    pub(crate) load_interval: Option<Duration>,
    /// Where a conversation that spilled to its next replica goes next.
    pub(crate) after_spill: AfterSpill,
    /// How long a later turn of a conversation waits for a slot of its first replica, when
    /// that is full by this process's own requests, before it goes to the next in its order
    /// (zero: it goes at once).
    pub(crate) spill_wait: Duration,
    /// How each backend's slots are shared.
    pub(crate) schedule: Scheduling,
}

/// `server.shared_state`: where the counts several processes share are kept, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedState {
    /// `redis://HOST:PORT/N` (Redis or Valkey, one server, not Cluster).
    pub url: String,
    /// How long a slot or client lease lives without renewal: what a killed process holds
    /// for at most.
    pub lease: Duration,
    /// Longest a call to the store may take before the process counts on its own.
    pub timeout: Duration,
}

/// Where a conversation goes after its first replica was full and it went to the next in its
/// order (`server.after_spill`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterSpill {
    /// Back to its first replica as soon as that has a free slot: every process makes the same
    /// choice from the request and the backends' load alone.
    #[default]
    Return,
    /// On where this process sent it last, while that replica has a free slot (where its
    /// prefix now is cached); another process does not know it spilled.
    Stay,
}

/// The client side's limits (`[server]` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSide {
    /// Time a client has to send a request's whole head, from its first byte.
    pub(crate) header_timeout: Duration,
    /// Time a client connection may sit idle between requests (or before the first).
    pub(crate) idle_timeout: Duration,
    /// Time a client may leave between two pieces of a request's body (and from the head to
    /// the first piece).
    pub(crate) body_timeout: Duration,
    /// Time a client has to send a request's whole body, from its head.
    pub(crate) body_total_timeout: Duration,
    /// Most client connections open at once (all workers); `None`: from the process's file
    /// descriptor limit when the server starts ([`crate::http::server`]).
    pub(crate) max_connections: Option<usize>,
    /// Deepest nesting of arrays and objects a request body may have.
    pub(crate) json_depth_limit: usize,
}

/// When a backend's circuit breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open it.
    pub(crate) failures: NonZeroU32,
    /// How long it stays open before one request (or probe) is let through.
    pub(crate) open_for: Duration,
}

const DEFAULT_LISTEN: &str = "0.0.0.0:7700";

/// The keys in the environment variable the setting `key` names (client keys, `/metrics`
/// keys, admin keys); `None` while it is unset.
fn keys(key: &str, var: Option<&str>, errs: &mut Vec<ConfigError>) -> Option<Vec<String>> {
    var.map(|var| super::keys::keys_of(key, var, errs))
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

pub(super) fn validate(raw: RawServer, errs: &mut Vec<ConfigError>) -> Server {
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
    let api_keys = keys("server.api_keys_env", raw.api_keys_env.as_deref(), errs);
    let metrics_keys = keys(
        "server.metrics_keys_env",
        raw.metrics_keys_env.as_deref(),
        errs,
    );
    let admin_keys = keys("server.admin_keys_env", raw.admin_keys_env.as_deref(), errs);
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
        load_interval: match raw.load_interval_ms.unwrap_or(500) {
            0 => None,
            n => Some(Duration::from_millis(n)),
        },
        after_spill: after_spill(raw.after_spill.as_deref(), errs),
        spill_wait: Duration::from_millis(raw.spill_wait_ms.unwrap_or(30_000)),
        schedule: super::schedule::validate(
            RawSchedule {
                schedule: raw.schedule.as_deref(),
                preempt_after_ms: raw.preempt_after_ms,
                max_preemptions: raw.max_preemptions,
                slot_hold_ms: raw.slot_hold_ms,
                pin_slack_gpu_seconds: raw.pin_slack_gpu_seconds,
            },
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
        metrics_keys,
        admin_keys,
        data_dir: data_dir(raw.data_dir.as_deref(), errs),
        budget_timezone: budget_timezone(raw.budget_timezone.as_deref(), errs),
        shared_state: shared_state(&raw, errs),
    }
}

/// `server.budget_timezone`: a zone of the IANA database bundled in the binary; UTC unset.
fn budget_timezone(raw: Option<&str>, errs: &mut Vec<ConfigError>) -> crate::calendar::Calendar {
    use crate::calendar::Calendar;
    let Some(name) = raw else {
        return Calendar::default();
    };
    Calendar::named(name).unwrap_or_else(|e| {
        errs.push(ConfigError::BadValue {
            key: "server.budget_timezone".into(),
            value: name.into(),
            reason: e.to_string(),
        });
        Calendar::default()
    })
}

/// `server.data_dir`: a path, not an empty one (whether it exists is not read here).
pub(super) fn data_dir(
    raw: Option<&str>,
    errs: &mut Vec<ConfigError>,
) -> Option<std::path::PathBuf> {
    if raw == Some("") {
        errs.push(ConfigError::BadValue {
            key: "server.data_dir".into(),
            value: String::new(),
            reason: "must name a directory".into(),
        });
    }
    raw.filter(|d| !d.is_empty()).map(std::path::PathBuf::from)
}

/// `server.shared_state` and its lease and timeout: a `redis://` URL with a host (no I/O
/// here); a lease at least a second and at least three times the timeout, so a renewal
/// that times out once still comes before the lease runs out.
fn shared_state(raw: &RawServer, errs: &mut Vec<ConfigError>) -> Option<SharedState> {
    let lease = ms(
        "server.shared_state_lease_ms",
        raw.shared_state_lease_ms,
        5000,
        errs,
    );
    let timeout = ms(
        "server.shared_state_timeout_ms",
        raw.shared_state_timeout_ms,
        250,
        errs,
    );
    let url = raw.shared_state.as_deref()?.trim();
    let bad = |reason: &str| ConfigError::BadValue {
        key: "server.shared_state".into(),
        value: url.to_string(),
        reason: reason.into(),
    };
    match url::Url::parse(url) {
        Ok(u) if u.scheme() != "redis" => {
            errs.push(bad("expected a redis://HOST:PORT/N URL"));
        }
        Ok(u) if u.host_str().is_none_or(str::is_empty) => errs.push(bad("no host")),
        Ok(u) if !database(u.path()) => {
            errs.push(bad("the path is the database number, e.g. /0"));
        }
        Ok(_) => {}
        Err(e) => errs.push(bad(&e.to_string())),
    }
    if lease < Duration::from_secs(1) || lease < timeout * 3 {
        errs.push(ConfigError::BadValue {
            key: "server.shared_state_lease_ms".into(),
            value: lease.as_millis().to_string(),
            reason: "at least 1000 and at least three times server.shared_state_timeout_ms".into(),
        });
    }
    Some(SharedState {
        url: url.to_string(),
        lease,
        timeout,
    })
}

/// `server.after_spill`: `"return"` (the default) or `"stay"`.
fn after_spill(value: Option<&str>, errs: &mut Vec<ConfigError>) -> AfterSpill {
    match value {
        None | Some("return") => AfterSpill::Return,
        Some("stay") => AfterSpill::Stay,
        Some(other) => {
            errs.push(ConfigError::BadValue {
                key: "server.after_spill".into(),
                value: other.into(),
                reason: "must be \"return\" or \"stay\"".into(),
            });
            AfterSpill::default()
        }
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

/// A URL path that names a database: none, or `/N`.
fn database(path: &str) -> bool {
    let n = path.trim_start_matches('/');
    n.is_empty() || n.parse::<u32>().is_ok()
}
