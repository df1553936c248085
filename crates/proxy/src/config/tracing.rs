//! `[tracing]`: where spans are exported (OTLP over HTTP/protobuf), with which headers, how
//! many are sampled and kept waiting; off while no `otlp_endpoint` is set.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::error::ConfigError;
use crate::address::address;
use crate::upstream::tls::TlsSpec;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    pub otlp_endpoint: Option<String>,
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) headers_env: BTreeMap<String, String>,
    pub(crate) sample_ratio: Option<f64>,
    pub(crate) service_name: Option<String>,
    pub(crate) capture_content: Option<bool>,
    pub(crate) capture_max_bytes: Option<u64>,
    pub(crate) export_max_bytes: Option<u64>,
    pub(crate) queue_spans: Option<u64>,
    pub(crate) export_interval_ms: Option<u64>,
    pub(crate) export_timeout_ms: Option<u64>,
}

/// Tracing as configured: spans exported to one OTLP/HTTP collector.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    /// The collector's traces URL as configured (`/v1/traces` added to a bare host).
    pub url: String,
    /// `host:port` the collector is reached at.
    pub(crate) authority: String,
    /// The path spans are posted to.
    pub(crate) path: String,
    /// For an https collector: the name its certificate must show (Mozilla's roots).
    pub(crate) tls: Option<TlsSpec>,
    /// Sent with every export (`headers`, then `headers_env` read once here).
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// The share of traces recorded, decided on the trace id; a client's parent may only
    /// lower it (its unsampled flag is followed, its sampled one never passes the ratio).
    pub(crate) sample_ratio: f64,
    pub(crate) service_name: String,
    /// Prompts and answers as span attributes (`gen_ai.input.messages`, …).
    pub(crate) capture_content: bool,
    /// Bytes of captured content a span attribute holds at most (cut at a character boundary,
    /// the span marked `switchboard.content.truncated`).
    pub(crate) capture_max_bytes: usize,
    /// An export's request body is kept under this many bytes (its spans as the exporter
    /// encodes them); a span bigger alone is dropped and counted.
    pub(crate) export_max_bytes: usize,
    /// Ended spans waiting for export at most; more are dropped and counted.
    pub(crate) queue: usize,
    /// How often waiting spans are exported (sooner when a batch is full).
    pub(crate) interval: Duration,
    /// An export that takes longer is given up (its spans counted as dropped).
    pub(crate) timeout: Duration,
}

/// The `[tracing]` section: `None` when no endpoint is set (tracing off).
pub fn validate(raw: RawTracing, errs: &mut Vec<ConfigError>) -> Option<Tracing> {
    let endpoint = raw.otlp_endpoint?;
    let bad = |key: &str, value: &str, reason: &str| ConfigError::BadValue {
        key: format!("tracing.{key}"),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let url = match url::Url::parse(&endpoint) {
        Ok(u) => u,
        Err(e) => {
            errs.push(bad(
                "otlp_endpoint",
                &endpoint,
                &format!("is not a URL: {e}"),
            ));
            return None;
        }
    };
    if url.query().is_some() || url.fragment().is_some() {
        errs.push(bad("otlp_endpoint", &endpoint, "has a query or fragment"));
        return None;
    }
    let at = match address(&url) {
        Ok(a) => a,
        Err(reason) => {
            errs.push(bad("otlp_endpoint", &endpoint, &reason.to_string()));
            return None;
        }
    };
    let path = if at.path_prefix.is_empty() {
        "/v1/traces".to_string()
    } else {
        at.path_prefix.clone()
    };
    let headers = headers(&raw.headers, &raw.headers_env, errs);
    let sample_ratio = raw.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        errs.push(bad(
            "sample_ratio",
            &sample_ratio.to_string(),
            "must be between 0 and 1",
        ));
    }
    let service_name = raw.service_name.unwrap_or_else(|| "switchboard".into());
    if service_name.is_empty() {
        errs.push(bad("service_name", "", "must not be empty"));
    }
    let queue = raw.queue_spans.unwrap_or(2048);
    if queue == 0 || queue > 1 << 20 {
        errs.push(bad(
            "queue_spans",
            &queue.to_string(),
            "must be between 1 and 1048576",
        ));
    }
    let ms = |key: &str, v: Option<u64>, default: u64, errs: &mut Vec<ConfigError>| {
        let v = v.unwrap_or(default);
        if v == 0 {
            errs.push(bad(key, "0", "must be at least 1"));
        }
        Duration::from_millis(v)
    };
    let (capture_max_bytes, export_max_bytes) =
        sizes(raw.capture_max_bytes, raw.export_max_bytes, errs);
    let interval = ms("export_interval_ms", raw.export_interval_ms, 1000, errs);
    let timeout = ms("export_timeout_ms", raw.export_timeout_ms, 10_000, errs);
    Some(Tracing {
        url: format!(
            "{}://{}{}",
            if at.server_name.is_some() {
                "https"
            } else {
                "http"
            },
            at.authority,
            path
        ),
        tls: at.server_name.map(|server_name| TlsSpec {
            server_name,
            ca_file: None,
        }),
        authority: at.authority,
        path,
        headers,
        sample_ratio,
        service_name,
        capture_content: raw.capture_content.unwrap_or(false),
        capture_max_bytes,
        export_max_bytes,
        queue: usize::try_from(queue).unwrap_or(2048),
        interval,
        timeout,
    })
}

/// The most bytes an export may hold (the OpenTelemetry Collector refuses a request body over
/// 20 MiB by default), and the least.
const EXPORT_MAX: u64 = 64 << 20;
const EXPORT_MIN: u64 = 16 << 10;

/// `capture_max_bytes` (default 64 KiB) and `export_max_bytes` (default 16 MiB), each in range.
fn sizes(capture: Option<u64>, export: Option<u64>, errs: &mut Vec<ConfigError>) -> (usize, usize) {
    let mut check = |key: &str, v: Option<u64>, default: u64, range: (u64, u64)| {
        let v = v.unwrap_or(default);
        if !(range.0..=range.1).contains(&v) {
            errs.push(ConfigError::BadValue {
                key: format!("tracing.{key}"),
                value: v.to_string(),
                reason: format!("must be between {} and {}", range.0, range.1),
            });
            return usize::try_from(default).unwrap_or(usize::MAX);
        }
        usize::try_from(v).unwrap_or(usize::MAX)
    };
    let capture = check("capture_max_bytes", capture, 64 << 10, (1, EXPORT_MAX));
    let export = check(
        "export_max_bytes",
        export,
        16 << 20,
        (EXPORT_MIN, EXPORT_MAX),
    );
    (capture, export)
}

/// The export's headers: the literal ones, then those whose values are in the environment.
fn headers(
    literal: &BTreeMap<String, String>,
    from_env: &BTreeMap<String, String>,
    errs: &mut Vec<ConfigError>,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    let values = literal.iter().map(|(k, v)| ("headers", k, Ok(v.clone())));
    let env = from_env.iter().map(|(k, var)| {
        let value = std::env::var(var).map_err(|_| var.clone());
        ("headers_env", k, value)
    });
    for (section, name, value) in values.chain(env) {
        let key = format!("tracing.{section}.{name}");
        let Ok(header) = HeaderName::try_from(name.as_str()) else {
            errs.push(ConfigError::BadValue {
                key,
                value: name.clone(),
                reason: "is not a header name".into(),
            });
            continue;
        };
        let value = match value {
            Ok(v) => v,
            Err(var) => {
                errs.push(ConfigError::BadValue {
                    key,
                    value: var,
                    reason: "is not set in the environment".into(),
                });
                continue;
            }
        };
        match HeaderValue::try_from(value) {
            Ok(mut v) => {
                // An auth token is never logged or shown.
                v.set_sensitive(true);
                out.push((header, v));
            }
            Err(_) => errs.push(ConfigError::BadValue {
                key,
                value: "(hidden)".into(),
                reason: "is not a valid header value".into(),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(endpoint: &str) -> RawTracing {
        RawTracing {
            otlp_endpoint: Some(endpoint.into()),
            ..RawTracing::default()
        }
    }

    #[test]
    fn no_endpoint_is_tracing_off() {
        let mut errs = Vec::new();
        assert_eq!(validate(RawTracing::default(), &mut errs), None);
        assert!(errs.is_empty());
    }

    #[test]
    fn a_bare_collector_gets_the_traces_path_and_a_path_is_kept() {
        let mut errs = Vec::new();
        let t = validate(raw("http://collector:4318"), &mut errs).unwrap();
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("collector:4318", "/v1/traces")
        );
        assert_eq!(t.url, "http://collector:4318/v1/traces");
        let t = validate(
            raw("https://otel.example/api/public/otel/v1/traces"),
            &mut errs,
        )
        .unwrap();
        assert_eq!(t.authority, "otel.example:443");
        assert_eq!(t.path, "/api/public/otel/v1/traces");
        assert!(t.tls.is_some());
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!((t.sample_ratio, t.queue), (1.0, 2048));
        assert!(!t.capture_content);
        assert_eq!((t.capture_max_bytes, t.export_max_bytes), (65536, 16 << 20));
    }

    #[test]
    fn bad_values_are_errors_naming_their_key() {
        let mut errs = Vec::new();
        let mut r = raw("http://collector:4318");
        r.sample_ratio = Some(1.5);
        r.queue_spans = Some(0);
        r.export_interval_ms = Some(0);
        r.capture_max_bytes = Some(0);
        r.export_max_bytes = Some(1 << 30);
        r.headers.insert("bad header".into(), "x".into());
        r.headers_env
            .insert("authorization".into(), "SWITCHBOARD_TEST_UNSET_VAR".into());
        validate(r, &mut errs);
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        for key in [
            "tracing.sample_ratio",
            "tracing.queue_spans",
            "tracing.export_interval_ms",
            "tracing.capture_max_bytes",
            "tracing.export_max_bytes",
            "tracing.headers.bad header",
            "tracing.headers_env.authorization",
        ] {
            assert!(text.iter().any(|t| t.contains(key)), "{key}: {text:?}");
        }
        assert!(validate(raw("ftp://x"), &mut errs).is_none());
        assert!(validate(raw("not a url"), &mut errs).is_none());
    }
}
