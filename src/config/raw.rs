//! The config file as written: serde structs that reject unknown keys, nothing validated yet.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::flavor::Flavor;
use crate::reasoning::ThinkTagsSpec;
use crate::tokens::{CountKind, MediaCosts, TokenizerFiles};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub backends: BTreeMap<String, RawBackend>,
    #[serde(default)]
    pub aliases: BTreeMap<String, RawAlias>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub reasoning_field: Option<String>,
    pub body_limit_bytes: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub header_timeout_secs: Option<u64>,
    pub shutdown_grace_secs: Option<u64>,
    pub health_interval_secs: Option<u64>,
    pub queue_timeout_secs: Option<u64>,
    pub stream_peek_ms: Option<u64>,
    pub workers: Option<usize>,
    pub api_keys_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    pub url: String,
    pub flavor: Flavor,
    pub slots: Option<u32>,
    pub queue: Option<u32>,
    pub api_key_env: Option<String>,
    pub apis: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlias {
    pub backend: String,
    pub upstream_model: Option<String>,
    pub context_window: Option<u32>,
    pub count: Option<CountKind>,
    pub tokenizer: Option<TokenizerFiles>,
    pub media_tokens: Option<MediaCosts>,
    pub clamp_max_tokens: Option<bool>,
    pub context_fallback: Option<String>,
    #[serde(default)]
    pub inputs: Option<Vec<String>>,
    #[serde(default)]
    pub old_names: Vec<String>,
    pub reasoning_field: Option<String>,
    pub think_tags: Option<ThinkTagsSpec>,
    pub think_tags_start_open: Option<bool>,
    pub description: Option<String>,
}
