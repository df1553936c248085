//! One error type for everything a client can be told: its variants, their messages and the
//! one table of status, `type`, `param` and `code` ([`crate::envelope`] renders it).

use std::time::Duration;

use axum::http::StatusCode;

use crate::echo::Clip;
pub use crate::echo::{bounded, Echo, ECHO_LIMIT, MESSAGE_LIMIT};

/// Everything that can go wrong while serving a request.
///
/// Each variant maps to exactly one status, `type` and `code` in [`ProxyError::parts`];
/// [`crate::envelope`] renders the OpenAI envelope `{"error":{"message","type","param","code"}}`.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(
        "The model `{model}` does not exist or you do not have access to it. Known models: {known}"
    )]
    ModelNotFound { model: Echo, known: String },
    #[error("you must provide a model parameter")]
    MissingModel,
    #[error("invalid JSON body: {}", Clip(.0))]
    InvalidJson(String),
    #[error("{}", Clip(.0))]
    InvalidRequest(String),
    #[error("invalid value for {param}: {}", Clip(.message))]
    InvalidParam {
        param: &'static str,
        message: String,
    },
    #[error(
        "model {alias} does not accept {kind} input, and the request has a part of type {part:?}"
    )]
    UnsupportedInput {
        alias: String,
        kind: &'static str,
        /// The part's `type`.
        part: String,
        /// Where the part is: `messages` or `input`.
        param: &'static str,
    },
    #[error("model {alias} does not accept image input, and the request has a top-level \"images\" field (backends ignore it, so it is not passed on)")]
    LegacyImages { alias: String },
    #[error("unsupported content type {0:?}: send application/json")]
    UnsupportedContentType(Echo),
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// A field of `POST /v1/files`' form other than its file is longer than its bound.
    #[error("the form's field {field} is longer than its limit of {limit} bytes")]
    FieldTooLarge { field: Echo, limit: u64 },
    /// A count endpoint's request has more text to tokenize than `server.count_limit_bytes`.
    #[error("the request has {bytes} bytes of prompt text to count, more than the limit of {limit} bytes (server.count_limit_bytes)")]
    CountTooLarge { bytes: usize, limit: usize },
    /// A count endpoint's request found no turn to count within the wait.
    #[error(
        "token counting is busy: {running} counts are running and no turn came within {waited:?}"
    )]
    CountBusy { running: usize, waited: Duration },
    #[error("{}", context_message(*.window, *.prompt, *.completion, *.estimate))]
    ContextLengthExceeded {
        window: u32,
        prompt: u32,
        completion: Option<u32>,
        estimate: bool,
    },
    #[error("no route for {method} {path}")]
    NotFound { method: Echo, path: Echo },
    #[error("upstream {backend} is unreachable")]
    UpstreamConnect { backend: String },
    #[error("upstream {backend} did not answer within {elapsed:?}")]
    UpstreamTimeout { backend: String, elapsed: Duration },
    #[error("upstream {backend} is loading, retry later")]
    UpstreamLoading { backend: String, retry_after: u64 },
    #[error("upstream {backend} failed: {}", Clip(.detail))]
    UpstreamProtocol { backend: String, detail: String },
    /// The backend's answer breaks HTTP/1.1 (a malformed head, chunk or trailer).
    #[error("upstream {backend} sent a malformed answer: {}", Clip(.detail))]
    UpstreamMalformed { backend: String, detail: String },
    /// A whole answer that must be read to be rewritten is longer than the proxy holds.
    #[error("upstream {backend} sent an answer longer than {limit} bytes (server.answer_limit_bytes), too long to read whole")]
    AnswerTooLarge { backend: String, limit: usize },
    /// One stream event is longer than the proxy holds until the event's end.
    #[error("upstream {backend} sent a stream event longer than {limit} bytes (server.event_limit_bytes)")]
    EventTooLarge { backend: String, limit: usize },
    /// The TLS handshake with an https backend failed; `detail` says why, naming no address.
    #[error("upstream {backend} is unreachable: {detail}")]
    UpstreamTls { backend: String, detail: String },
    #[error("all {slots} slots of {alias} are busy and its queue is full")]
    Overloaded {
        alias: String,
        slots: u32,
        retry_after: u64,
    },
    #[error("no slot of {alias} came free within the queue timeout of {waited:?}")]
    QueueTimeout {
        alias: String,
        waited: Duration,
        retry_after: u64,
    },
    #[error("the wait for a slot of {alias} is predicted at {predicted:?}, longer than the {limit:?} this request may wait")]
    WaitTooLong {
        alias: String,
        predicted: Duration,
        limit: Duration,
        retry_after: u64,
    },
    #[error("no backend of {alias} can take requests now ({why})")]
    NoBackend {
        alias: String,
        why: &'static str,
        retry_after: u64,
    },
    #[error("invalid or missing API key")]
    Unauthorized,
    /// A request body nested deeper than `server.json_depth_limit`.
    #[error("the request body nests arrays and objects more than {limit} deep (server.json_depth_limit)")]
    TooDeep { limit: usize },
    /// The proxy is out of file descriptors: no backend connection could be opened.
    #[error("the proxy cannot open a backend connection now ({detail}); retry shortly")]
    ProxyExhausted { detail: String },
    /// `server.max_connections` client connections are open: a new one is answered and closed.
    #[error("too many open connections (server.max_connections = {limit}); retry shortly")]
    TooManyConnections { limit: usize },
    /// The client did not send the request's body in time; the connection is closed.
    #[error("{} {waited:?}", if *.total { "the request body was not received within" } else { "the request body stalled: no byte for" })]
    BodyTimeout { waited: Duration, total: bool },
    /// A usage API an admin key (`server.admin_keys_env`) is needed for.
    #[error("this endpoint needs an admin key (server.admin_keys_env)")]
    AdminOnly,
    /// Usage is asked for and no `[ledger]` records it.
    #[error("usage is not recorded: the config has no [ledger]")]
    NoLedger,
    /// The ledger's database could not be read (`detail` is shown to the client: see
    /// [`ProxyError::database`] for a database's own error).
    #[error("the usage ledger cannot be read now ({detail}); retry shortly")]
    LedgerUnavailable { detail: String },
    /// A file or batch that does not exist, or is not the caller's.
    #[error("No such {kind} object: {id}")]
    NoSuchObject { kind: &'static str, id: Echo },
    /// The Batch API is asked for and no `[ledger]` keeps its state.
    #[error("the Batch API is off: {0}")]
    BatchesOff(&'static str),
    /// A client's bound on its files, bytes or batches in progress (`[batches]`).
    #[error("{0}")]
    BatchLimit(String),
    /// A client's limit refuses the request; `retry_after` `None`: it never fits.
    #[error("rate limit of client {client}: {detail}")]
    RateLimited {
        client: String,
        detail: String,
        /// The day's quota is spent (OpenAI's `insufficient_quota`).
        quota: bool,
        retry_after: Option<u64>,
    },
}

/// OpenAI's exact context-length wording, with an estimate marker where the count is one.
fn context_message(window: u32, prompt: u32, completion: Option<u32>, estimate: bool) -> String {
    let mut msg = match completion {
        Some(out) => format!(
            "This model's maximum context length is {window} tokens. However, you requested {} tokens ({prompt} in the messages, {out} in the completion). Please reduce the length of the messages or completion.",
            u64::from(prompt) + u64::from(out)
        ),
        None => format!(
            "This model's maximum context length is {window} tokens. However, your messages resulted in {prompt} tokens. Please reduce the length of the messages."
        ),
    };
    if estimate {
        msg.push_str(" (token count is an estimate)");
    }
    msg
}

impl ProxyError {
    /// The ledger's database failed with `e`: logged here, and the client told only that
    /// it did not answer (its error may name the database's file or host).
    pub fn database(e: impl std::fmt::Display) -> ProxyError {
        tracing::warn!(error = %e, "the usage ledger's database failed");
        ProxyError::LedgerUnavailable {
            detail: "its database did not answer".into(),
        }
    }

    /// Status, OpenAI `type`, `param` and `code` of this error. The `type` follows from the
    /// status (see [`ProxyError::table`], the one table of the rest).
    pub fn parts(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    ) {
        let (status, param, code) = self.table();
        let kind = match status.as_u16() {
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        (status, kind, param, Some(code))
    }

    /// Status, `param` and `code` of each variant.
    fn table(&self) -> (StatusCode, Option<&'static str>, &'static str) {
        use ProxyError::*;
        use StatusCode as S;
        match self {
            ModelNotFound { .. } => (S::NOT_FOUND, Some("model"), "model_not_found"),
            MissingModel => (S::BAD_REQUEST, Some("model"), "missing_model"),
            InvalidJson(_) => (S::BAD_REQUEST, None, "invalid_json"),
            InvalidRequest(_) => (S::BAD_REQUEST, None, "invalid_request"),
            InvalidParam { param, .. } => (S::BAD_REQUEST, Some(param), "invalid_value"),
            UnsupportedInput { param, .. } => (S::BAD_REQUEST, Some(param), "unsupported_input"),
            LegacyImages { .. } => (S::BAD_REQUEST, Some("images"), "unsupported_input"),
            UnsupportedContentType(_) => (S::BAD_REQUEST, None, "unsupported_content_type"),
            PayloadTooLarge { .. } | CountTooLarge { .. } | FieldTooLarge { .. } => {
                (S::PAYLOAD_TOO_LARGE, None, "request_too_large")
            }
            CountBusy { .. } => (S::SERVICE_UNAVAILABLE, None, "count_busy"),
            ContextLengthExceeded { .. } => {
                (S::BAD_REQUEST, Some("messages"), "context_length_exceeded")
            }
            NotFound { .. } => (S::NOT_FOUND, None, "unknown_url"),
            UpstreamConnect { .. }
            | UpstreamProtocol { .. }
            | UpstreamMalformed { .. }
            | UpstreamTls { .. } => (S::BAD_GATEWAY, None, "bad_gateway"),
            AnswerTooLarge { .. } => (S::BAD_GATEWAY, None, "answer_too_large"),
            EventTooLarge { .. } => (S::BAD_GATEWAY, None, "event_too_large"),
            UpstreamTimeout { .. } => (S::GATEWAY_TIMEOUT, None, "upstream_timeout"),
            UpstreamLoading { .. } => (S::SERVICE_UNAVAILABLE, None, "model_loading"),
            Overloaded { .. } => (S::TOO_MANY_REQUESTS, None, "overloaded"),
            QueueTimeout { .. } => (S::SERVICE_UNAVAILABLE, None, "queue_timeout"),
            WaitTooLong { .. } => (S::SERVICE_UNAVAILABLE, None, "wait_too_long"),
            NoBackend { .. } => (S::SERVICE_UNAVAILABLE, None, "no_backend"),
            Unauthorized => (S::UNAUTHORIZED, None, "invalid_api_key"),
            TooDeep { .. } => (S::BAD_REQUEST, None, "json_too_deep"),
            BodyTimeout { .. } => (S::REQUEST_TIMEOUT, None, "request_timeout"),
            TooManyConnections { .. } => (S::SERVICE_UNAVAILABLE, None, "too_many_connections"),
            ProxyExhausted { .. } => (S::SERVICE_UNAVAILABLE, None, "proxy_overloaded"),
            AdminOnly => (S::FORBIDDEN, None, "admin_key_required"),
            NoLedger => (S::NOT_FOUND, None, "usage_not_recorded"),
            LedgerUnavailable { .. } => (S::SERVICE_UNAVAILABLE, None, "ledger_unavailable"),
            NoSuchObject { .. } => (S::NOT_FOUND, Some("id"), "not_found"),
            BatchesOff(_) => (S::NOT_FOUND, None, "batches_off"),
            BatchLimit(_) => (S::BAD_REQUEST, None, "limit_exceeded"),
            RateLimited { quota: true, .. } => (S::TOO_MANY_REQUESTS, None, "insufficient_quota"),
            RateLimited { .. } => (S::TOO_MANY_REQUESTS, None, "rate_limit_exceeded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_message_matches_openai_wording() {
        let e = ProxyError::ContextLengthExceeded {
            window: 8192,
            prompt: 7554,
            completion: Some(1000),
            estimate: false,
        };
        assert_eq!(e.to_string(), "This model's maximum context length is 8192 tokens. However, you requested 8554 tokens (7554 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.");
        let e = ProxyError::ContextLengthExceeded {
            window: 8192,
            prompt: 8554,
            completion: None,
            estimate: false,
        };
        assert_eq!(e.to_string(), "This model's maximum context length is 8192 tokens. However, your messages resulted in 8554 tokens. Please reduce the length of the messages.");
    }

    #[test]
    fn unsupported_input_names_the_alias_and_the_part() {
        let e = ProxyError::UnsupportedInput {
            alias: "frank-dragoon".into(),
            kind: "image",
            part: "image_url".into(),
            param: "messages",
        };
        assert_eq!(
            e.to_string(),
            "model frank-dragoon does not accept image input, and the request has a part of type \"image_url\""
        );
        let (status, kind, param, code) = e.parts();
        assert_eq!(
            (status.as_u16(), kind, param, code),
            (
                400,
                "invalid_request_error",
                Some("messages"),
                Some("unsupported_input")
            )
        );
        let e = ProxyError::LegacyImages {
            alias: "frank-dragoon".into(),
        };
        assert!(e.to_string().contains("\"images\""), "{e}");
        assert_eq!(e.parts().2, Some("images"));
    }

    #[test]
    fn client_input_in_messages_is_bounded() {
        let huge = "m".repeat(20 << 20);
        let messages = [
            ProxyError::ModelNotFound {
                model: Echo::new(&huge),
                known: "a, b".into(),
            },
            ProxyError::NotFound {
                method: Echo::new("POST"),
                path: Echo::new(&huge),
            },
            ProxyError::UnsupportedContentType(Echo::new(&huge)),
            ProxyError::InvalidJson(huge.clone()),
            ProxyError::InvalidRequest(huge.clone()),
            ProxyError::InvalidParam {
                param: "model",
                message: huge.clone(),
            },
            ProxyError::UpstreamProtocol {
                backend: "b".into(),
                detail: huge.clone(),
            },
        ]
        .map(|e| e.to_string());
        for m in &messages {
            assert!(m.len() < MESSAGE_LIMIT + 200, "{}", m.len());
            assert!(m.contains("… (20971520 bytes)"), "{}", &m[m.len() - 40..]);
        }
        assert!(messages[0].starts_with(&format!(
            "The model `{}… (20971520 bytes)` does not",
            "m".repeat(256)
        )));
        assert_eq!(
            bounded(format_args!("{}", "x".repeat(2000))).len(),
            MESSAGE_LIMIT + "… (2000 bytes)".len()
        );
    }

    /// How many variants [`ordinal`] knows; a new variant needs an arm there (the match
    /// does not compile without one) and a sample in [`one_of_each`].
    const VARIANTS: usize = 39;

    fn ordinal(e: &ProxyError) -> usize {
        use ProxyError::*;
        match e {
            ModelNotFound { .. } => 0,
            MissingModel => 1,
            InvalidJson(_) => 2,
            InvalidRequest(_) => 3,
            InvalidParam { .. } => 4,
            UnsupportedInput { .. } => 5,
            LegacyImages { .. } => 6,
            UnsupportedContentType(_) => 7,
            PayloadTooLarge { .. } => 8,
            CountTooLarge { .. } => 9,
            CountBusy { .. } => 10,
            ContextLengthExceeded { .. } => 11,
            NotFound { .. } => 12,
            UpstreamConnect { .. } => 13,
            UpstreamTimeout { .. } => 14,
            UpstreamLoading { .. } => 15,
            UpstreamProtocol { .. } => 16,
            UpstreamMalformed { .. } => 17,
            AnswerTooLarge { .. } => 18,
            EventTooLarge { .. } => 19,
            UpstreamTls { .. } => 20,
            Overloaded { .. } => 21,
            QueueTimeout { .. } => 22,
            NoBackend { .. } => 23,
            Unauthorized => 24,
            TooDeep { .. } => 25,
            ProxyExhausted { .. } => 26,
            TooManyConnections { .. } => 27,
            BodyTimeout { .. } => 28,
            RateLimited { quota: false, .. } => 29,
            RateLimited { quota: true, .. } => 30,
            WaitTooLong { .. } => 31,
            AdminOnly => 32,
            NoLedger => 33,
            LedgerUnavailable { .. } => 34,
            NoSuchObject { .. } => 35,
            BatchesOff(_) => 36,
            BatchLimit(_) => 37,
            FieldTooLarge { .. } => 38,
        }
    }

    /// One error of each kind the table tells apart.
    fn one_of_each() -> Vec<ProxyError> {
        use ProxyError::*;
        let b = || "b".to_string();
        let d = Duration::from_secs(1);
        vec![
            ModelNotFound {
                model: Echo::new("m"),
                known: "a".into(),
            },
            MissingModel,
            InvalidJson("x".into()),
            InvalidRequest("x".into()),
            InvalidParam {
                param: "model",
                message: "x".into(),
            },
            UnsupportedInput {
                alias: "a".into(),
                kind: "image",
                part: "image_url".into(),
                param: "messages",
            },
            LegacyImages { alias: "a".into() },
            UnsupportedContentType(Echo::new("text/plain")),
            PayloadTooLarge { limit: 1 },
            FieldTooLarge {
                field: Echo::new("purpose"),
                limit: 1,
            },
            CountTooLarge { bytes: 2, limit: 1 },
            CountBusy {
                running: 1,
                waited: d,
            },
            ContextLengthExceeded {
                window: 1,
                prompt: 2,
                completion: None,
                estimate: false,
            },
            NotFound {
                method: Echo::new("GET"),
                path: Echo::new("/x"),
            },
            UpstreamConnect { backend: b() },
            UpstreamTimeout {
                backend: b(),
                elapsed: d,
            },
            UpstreamLoading {
                backend: b(),
                retry_after: 1,
            },
            UpstreamProtocol {
                backend: b(),
                detail: "x".into(),
            },
            UpstreamMalformed {
                backend: b(),
                detail: "x".into(),
            },
            AnswerTooLarge {
                backend: b(),
                limit: 1,
            },
            EventTooLarge {
                backend: b(),
                limit: 1,
            },
            UpstreamTls {
                backend: b(),
                detail: "x".into(),
            },
            Overloaded {
                alias: "a".into(),
                slots: 1,
                retry_after: 1,
            },
            QueueTimeout {
                alias: "a".into(),
                waited: d,
                retry_after: 1,
            },
            WaitTooLong {
                alias: "a".into(),
                predicted: d,
                limit: d,
                retry_after: 1,
            },
            NoBackend {
                alias: "a".into(),
                why: "down",
                retry_after: 1,
            },
            Unauthorized,
            TooDeep { limit: 64 },
            ProxyExhausted { detail: "x".into() },
            AdminOnly,
            NoLedger,
            LedgerUnavailable { detail: "x".into() },
            NoSuchObject {
                kind: "File",
                id: Echo::new("file-1"),
            },
            BatchesOff("no ledger"),
            BatchLimit("x".into()),
            TooManyConnections { limit: 1 },
            BodyTimeout {
                waited: d,
                total: false,
            },
            RateLimited {
                client: "c".into(),
                detail: "x".into(),
                quota: false,
                retry_after: None,
            },
            RateLimited {
                client: "c".into(),
                detail: "x".into(),
                quota: true,
                retry_after: None,
            },
        ]
    }

    /// docs/ERRORS.md's table: each row's status cell and `code`.
    fn documented() -> Vec<(String, String)> {
        include_str!("../../../docs/ERRORS.md")
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| situation"))
            .filter_map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                let code = cells.get(2)?.trim().trim_matches('`');
                Some((cells[1].to_string(), code.to_string()))
            })
            .collect()
    }

    #[test]
    fn the_error_reference_has_a_row_for_each_status_and_code_and_no_other() {
        let samples = one_of_each();
        let mut seen: Vec<usize> = samples.iter().map(ordinal).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen,
            (0..VARIANTS).collect::<Vec<_>>(),
            "a sample of each variant"
        );
        let docs = documented();
        assert!(docs.len() > 20, "the table is read: {docs:?}");
        for e in &samples {
            let (status, _, _, code) = e.parts();
            let code = code.unwrap();
            assert!(
                // An error that comes after the stream's 200 is a final event in its row.
                docs.iter().any(|(s, c)| c == code
                    && (s.starts_with(status.as_str()) || s.starts_with("final SSE event"))),
                "docs/ERRORS.md has no row of status {status} and code `{code}` ({e:?})"
            );
        }
        for (status, code) in &docs {
            assert!(
                samples.iter().any(|e| e.parts().3 == Some(code.as_str())),
                "docs/ERRORS.md names code `{code}` (status {status}), which no error has"
            );
        }
    }
}
