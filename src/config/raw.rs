//! The config file as written: serde structs that reject unknown keys, nothing validated yet.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::counting::{CountKind, MediaCosts, TokenizerFiles};
use crate::flavor::Flavor;
use crate::reasoning::ThinkTagsSpec;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    pub aliases: BTreeMap<String, RawAlias>,
    /// Named clients: keys, allowed aliases, priority, limits.
    #[serde(default)]
    pub clients: BTreeMap<String, super::clients::RawClient>,
    /// The queue's classes: how long a request of each may wait before it is lifted a class.
    #[serde(default)]
    pub priority: super::clients::RawPriorities,
    /// Spans exported over OTLP: where, how many.
    #[serde(default)]
    pub tracing: super::tracing::RawTracing,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub reasoning_field: Option<String>,
    pub body_limit_bytes: Option<u64>,
    pub answer_limit_bytes: Option<u64>,
    pub event_limit_bytes: Option<u64>,
    pub resend_unanswered: Option<bool>,
    pub count_concurrency: Option<u64>,
    pub count_queue_timeout_ms: Option<u64>,
    pub count_limit_bytes: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub header_timeout_secs: Option<u64>,
    pub shutdown_grace_secs: Option<u64>,
    pub health_interval_secs: Option<u64>,
    pub queue_timeout_secs: Option<u64>,
    pub stream_peek_ms: Option<u64>,
    pub workers: Option<usize>,
    pub api_keys_env: Option<String>,
    pub metrics_keys_env: Option<String>,
    pub admin_keys_env: Option<String>,
    pub stream_idle_timeout_ms: Option<u64>,
    pub total_timeout_secs: Option<u64>,
    pub client_header_timeout_ms: Option<u64>,
    pub client_idle_timeout_ms: Option<u64>,
    pub client_body_timeout_ms: Option<u64>,
    pub client_body_total_timeout_ms: Option<u64>,
    pub max_connections: Option<u64>,
    pub json_depth_limit: Option<u64>,
    pub breaker_failures: Option<u32>,
    pub breaker_open_ms: Option<u64>,
    pub watch_config: Option<bool>,
    pub reload_debounce_ms: Option<u64>,
    pub reload_max_delay_ms: Option<u64>,
    pub shared_state: Option<String>,
    pub shared_state_lease_ms: Option<u64>,
    pub shared_state_timeout_ms: Option<u64>,
    pub load_interval_ms: Option<u64>,
    pub after_spill: Option<String>,
    pub spill_wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    pub url: String,
    pub flavor: Flavor,
    pub slots: Option<RawSizing>,
    pub queue: Option<u32>,
    pub api_key_env: Option<String>,
    pub connect_timeout_ms: Option<u64>,
    pub header_timeout_secs: Option<u64>,
    pub stream_idle_timeout_ms: Option<u64>,
    pub total_timeout_secs: Option<u64>,
    pub ca_file: Option<std::path::PathBuf>,
    pub apis: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlias {
    /// One backend; or `backends`, replicas (exactly one of the two).
    pub backend: Option<String>,
    pub backends: Option<Vec<String>>,
    /// Aliases tried in order when no backend of this one can take a request.
    #[serde(default)]
    pub fallbacks: Vec<String>,
    pub upstream_model: Option<String>,
    pub context_window: Option<RawSizing>,
    pub count: Option<CountKind>,
    pub tokenizer: Option<TokenizerFiles>,
    pub media_tokens: Option<MediaCosts>,
    pub clamp_max_tokens: Option<bool>,
    pub context_fallback: Option<String>,
    #[serde(default)]
    pub inputs: Option<Vec<String>>,
    /// Request fields set when the client sent none (tables: member by member).
    pub defaults: Option<serde_json::Map<String, serde_json::Value>>,
    /// Top-level request fields removed before forwarding.
    pub strip_params: Option<Vec<String>>,
    /// Cap on the output tokens a request asks for.
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub old_names: Vec<String>,
    pub reasoning_field: Option<String>,
    pub think_tags: Option<ThinkTagsSpec>,
    pub think_tags_start_open: Option<bool>,
    pub description: Option<String>,
}

impl RawAlias {
    /// The backends this alias names, `backend` or `backends`.
    pub fn backend_names(&self) -> impl Iterator<Item = &String> {
        self.backend.iter().chain(self.backends.iter().flatten())
    }
}

/// `context_window` / `slots` as written: a number, or the word `"auto"` (the backend's own
/// figure). A number written as a string (as environment overrides may give) is a number.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum RawSizing {
    Number(u64),
    Word(String),
}

impl RawSizing {
    /// The number written, if it is one.
    pub fn number(&self) -> Option<u64> {
        match self {
            RawSizing::Number(n) => Some(*n),
            RawSizing::Word(w) => w.trim().parse().ok(),
        }
    }
}
