//! `[server]`: the listener, limits, the backend side's defaults and the client side.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use super::{cores, ms, nonzero, reasoning_field, secs, socket_addr};
use crate::config::counting::GateConfig;
use crate::config::error::ConfigError;
use crate::config::model::{AfterSpill, BreakerConfig, ClientSide, Server, SharedState, Timeouts};
use crate::config::raw::RawServer;

const DEFAULT_LISTEN: &str = "0.0.0.0:7700";

/// The keys in the environment variable the setting `key` names (client keys, `/metrics`
/// keys, admin keys); `None` while it is unset.
fn keys(key: &str, var: Option<&str>, errs: &mut Vec<ConfigError>) -> Option<Vec<String>> {
    var.map(|var| crate::config::keys::keys_of(key, var, errs))
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

pub(super) fn server(raw: RawServer, errs: &mut Vec<ConfigError>) -> Server {
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
        metrics_keys,
        admin_keys,
        shared_state: shared_state(&raw, errs),
    }
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
