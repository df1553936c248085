//! `[aliases.NAME]`: replicas, the window and its guard, reasoning, and the body's shaping —
//! as written, as validated, and the validation between them.

use std::num::NonZeroU32;
use std::sync::Arc;

use http::HeaderValue;
use serde::Deserialize;

use super::backends::Backend;
use super::counting::{CountKind, MediaCosts, TokenizerFiles};
use super::error::ConfigError;
use super::sizing::{sizing, RawSizing, Sizing};
use super::values::reasoning_field;
use crate::reasoning::{OutputField, ThinkTags, ThinkTagsSpec};
use crate::wire::shape::ShapeSpec;

pub(crate) use crate::wire::shape::Input;

/// `[aliases.NAME]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlias {
    /// One backend; or `backends`, replicas (exactly one of the two).
    pub backend: Option<String>,
    pub(crate) backends: Option<Vec<String>>,
    /// Aliases tried in order when no backend of this one can take a request.
    #[serde(default)]
    pub(crate) fallbacks: Vec<String>,
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
    pub(crate) defaults: Option<serde_json::Map<String, serde_json::Value>>,
    /// Top-level request fields removed before forwarding.
    pub(crate) strip_params: Option<Vec<String>>,
    /// Cap on the output tokens a request asks for.
    pub(crate) max_output_tokens: Option<u32>,
    #[serde(default)]
    pub(crate) old_names: Vec<String>,
    pub(crate) reasoning_field: Option<String>,
    pub(crate) think_tags: Option<ThinkTagsSpec>,
    pub(crate) think_tags_start_open: Option<bool>,
    pub(crate) description: Option<String>,
}

impl RawAlias {
    /// The backends this alias names, `backend` or `backends`.
    pub fn backend_names(&self) -> impl Iterator<Item = &String> {
        self.backend.iter().chain(self.backends.iter().flatten())
    }
}

/// `[aliases.NAME]` validated.
#[derive(Debug, Clone)]
pub struct Alias {
    pub name: String,
    /// `name` as the `X-Switchboard-Alias` value of every answer (made once, here).
    pub(crate) served_as: HeaderValue,
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
    pub(crate) guard: Option<GuardConfig>,
    /// Where over-window requests go instead of being rejected (an alias with a larger window).
    pub(crate) context_fallback: Option<String>,
    /// Defaults, stripped fields, the output cap and the input kinds taken.
    pub shape: ShapeSpec,
    pub old_names: Vec<String>,
    pub(crate) reasoning_field: Option<OutputField>,
    /// Inline reasoning markers to split out of `content` (opt-in per alias).
    pub(crate) think_tags: Option<Arc<ThinkTags>>,
    pub description: Option<String>,
}

/// How an alias's prompts are counted and judged (`count`, `tokenizer`, `media_tokens`,
/// `clamp_max_tokens`) against the alias's `context_window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuardConfig {
    /// The counting strategy (the default resolved: local with a tokenizer, else estimate).
    pub(crate) count: CountKind,
    pub(crate) tokenizer: Option<TokenizerFiles>,
    pub(crate) media: MediaCosts,
    pub(crate) clamp_max_tokens: bool,
}

impl GuardConfig {
    /// The key and value to name when the counter of this guard cannot be built.
    pub(crate) fn counter_key(&self) -> (&'static str, String) {
        match &self.tokenizer {
            Some(t) if self.count != CountKind::Backend => {
                ("tokenizer", t.file.display().to_string())
            }
            _ => ("count", self.count.as_str().to_string()),
        }
    }
}

/// An alias's `context_window` (a number, or "auto" where its backend reports one) and
/// `max_output_tokens` (below a numeric window).
fn window_and_cap(
    name: &str,
    raw: &mut RawAlias,
    backend: &Backend,
    errs: &mut Vec<ConfigError>,
) -> (Option<Sizing>, Option<NonZeroU32>) {
    let window_auto_refused = backend.flavor.runtime().window_unknown;
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
                    reason: reason.to_string(),
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

/// One alias, its replicas already found ([`super::routing::replicas`]: at least one).
pub(super) fn validate(
    name: &str,
    mut raw: RawAlias,
    replicas: Vec<Arc<Backend>>,
    errs: &mut Vec<ConfigError>,
) -> Option<Alias> {
    let backend = replicas.first()?;
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
        backends: replicas,
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
