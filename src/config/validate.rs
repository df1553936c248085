//! Turns raw config into typed config, collecting every error with the key and value it concerns.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use url::Url;

use super::raw::{RawAlias, RawBackend, RawConfig, RawServer};
use crate::flavor::Flavor;
use crate::reasoning::{OutputField, ThinkTags, ThinkTagsSpec};
use crate::tokens::{CountKind, MediaCosts, TokenizerFiles};

/// A validated configuration: every reference resolved, every value in range.
#[derive(Debug)]
pub struct Config {
    pub server: Server,
    pub backends: BTreeMap<String, Arc<Backend>>,
    pub aliases: BTreeMap<String, Arc<Alias>>,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub reasoning_field: OutputField,
    pub body_limit: usize,
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
}

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    /// Base URL without a trailing slash, e.g. `http://dankclaw:7771`.
    pub url: String,
    pub flavor: Flavor,
    /// `host:port` of a plain-http backend (served by the in-task pool); `None` for https.
    pub authority: Option<String>,
    /// The URL's path, put before every request path (empty for a server root).
    pub path_prefix: String,
    pub slots: NonZeroU32,
    pub queue: u32,
    /// The backend's own key; replaces the client's Authorization when set. Never logged.
    pub api_key: Option<String>,
    /// The wire APIs it serves itself; the others are translated to chat completions.
    pub apis: Apis,
}

/// Which wire APIs a backend serves itself (config key `apis`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Apis {
    pub messages: bool,
    pub responses: bool,
}

impl Apis {
    /// llama.cpp, vLLM and SGLang serve all three; any other OpenAI-style server chat only.
    pub fn default_for(flavor: Flavor) -> Apis {
        let all = flavor != Flavor::Openai;
        Apis {
            messages: all,
            responses: all,
        }
    }
}

/// `apis = ["chat", "messages", "responses"]`: chat completions must be among them.
fn apis(name: &str, raw: Option<Vec<String>>, flavor: Flavor, errs: &mut Vec<ConfigError>) -> Apis {
    let Some(list) = raw else {
        return Apis::default_for(flavor);
    };
    let key = format!("backends.{name}.apis");
    let mut out = Apis {
        messages: false,
        responses: false,
    };
    let mut chat = false;
    for v in list {
        match v.as_str() {
            "chat" => chat = true,
            "messages" => out.messages = true,
            "responses" => out.responses = true,
            _ => errs.push(ConfigError::BadValue {
                key: key.clone(),
                value: v,
                reason: "is not an API: expected \"chat\", \"messages\" or \"responses\"".into(),
            }),
        }
    }
    if !chat {
        errs.push(ConfigError::BadValue {
            key,
            value: "[…]".into(),
            reason: "must include \"chat\": the other APIs are translated to it".into(),
        });
    }
    out
}

/// Input kinds an alias accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Input {
    pub image: bool,
    pub audio: bool,
}

#[derive(Debug)]
pub struct Alias {
    pub name: String,
    /// `name` as the `X-Switchboard-Alias` value of every answer (made once, here).
    pub served_as: HeaderValue,
    pub backend: Arc<Backend>,
    pub upstream_model: String,
    pub context_window: Option<NonZeroU32>,
    /// The context guard's settings; present when `context_window` is set. Its counter is
    /// built with the snapshot (`crate::live`), which loads the tokenizer.
    pub guard: Option<GuardConfig>,
    /// Where over-window requests go instead of being rejected (an alias with a larger window).
    pub context_fallback: Option<String>,
    pub inputs: Input,
    pub old_names: Vec<String>,
    pub reasoning_field: Option<OutputField>,
    /// Inline reasoning markers to split out of `content` (opt-in per alias).
    pub think_tags: Option<Arc<ThinkTags>>,
    pub description: Option<String>,
}

/// How an alias's prompts are counted and judged (`context_window`, `count`, `tokenizer`,
/// `media_tokens`, `clamp_max_tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardConfig {
    pub window: u32,
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
    let mut backends = BTreeMap::new();
    for (name, b) in raw.backends {
        if let Some(b) = backend(&name, b, &mut errs) {
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
    fallbacks(&aliases, &mut errs);
    if errs.is_empty() {
        Ok(Config {
            server,
            backends,
            aliases,
        })
    } else {
        Err(ConfigErrors(errs))
    }
}

/// A fallback must be another alias whose window is larger.
fn fallbacks(aliases: &BTreeMap<String, Arc<Alias>>, errs: &mut Vec<ConfigError>) {
    for a in aliases.values() {
        let Some(fb) = &a.context_fallback else {
            continue;
        };
        let key = format!("aliases.{}.context_fallback", a.name);
        let reason = match (aliases.get(fb), a.context_window) {
            (None, _) => Some("is not a defined alias".to_string()),
            (Some(_), _) if fb == &a.name => Some("is the alias itself".to_string()),
            (_, None) => Some("needs context_window on this alias".to_string()),
            (Some(f), Some(w)) if f.context_window.is_some_and(|fw| fw <= w) => Some(format!(
                "has a window no larger than this alias's {w} tokens"
            )),
            _ => None,
        };
        if let Some(reason) = reason {
            errs.push(ConfigError::BadValue {
                key,
                value: fb.clone(),
                reason,
            });
        }
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
    let api_keys = raw
        .api_keys_env
        .as_deref()
        .and_then(|var| match std::env::var(var) {
            Ok(v) => {
                let keys: Vec<String> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(String::from)
                    .collect();
                if keys.is_empty() {
                    errs.push(ConfigError::BadValue {
                        key: "server.api_keys_env".into(),
                        value: var.into(),
                        reason: "holds no keys".into(),
                    });
                }
                Some(keys)
            }
            Err(_) => {
                errs.push(ConfigError::BadValue {
                    key: "server.api_keys_env".into(),
                    value: var.into(),
                    reason: "is not set in the environment".into(),
                });
                None
            }
        });
    let secs = |key: &str, v: Option<u64>, default: u64, errs: &mut Vec<ConfigError>| {
        Duration::from_secs(nonzero(key, v.unwrap_or(default), errs))
    };
    Server {
        listen,
        metrics_listen,
        reasoning_field: reasoning_field("server.reasoning_field", reasoning, errs),
        body_limit: nonzero(
            "server.body_limit_bytes",
            raw.body_limit_bytes.unwrap_or(64 << 20),
            errs,
        ) as usize,
        connect_timeout: Duration::from_millis(nonzero(
            "server.connect_timeout_ms",
            raw.connect_timeout_ms.unwrap_or(3000),
            errs,
        )),
        header_timeout: secs(
            "server.header_timeout_secs",
            raw.header_timeout_secs,
            900,
            errs,
        ),
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
            raw.workers.map_or_else(
                || std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
                |w| w as u64,
            ),
            errs,
        ) as usize,
        api_keys,
    }
}

fn backend(name: &str, raw: RawBackend, errs: &mut Vec<ConfigError>) -> Option<Backend> {
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
    let url = match url {
        Ok(u) => u,
        Err(reason) => {
            errs.push(ConfigError::BadUrl {
                key,
                value: raw.url,
                reason,
            });
            return None;
        }
    };
    let slots = raw.slots.unwrap_or(1);
    let Some(slots) = NonZeroU32::new(slots) else {
        errs.push(ConfigError::Zero {
            key: format!("backends.{name}.slots"),
        });
        return None;
    };
    let api_key = match raw.api_key_env {
        Some(var) => match std::env::var(&var) {
            Ok(k) => Some(k),
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
    let authority = (url.scheme() == "http")
        .then(|| {
            Some(format!(
                "{}:{}",
                url.host_str()?,
                url.port_or_known_default()?
            ))
        })
        .flatten();
    let path_prefix = url.path().trim_end_matches('/').to_string();
    let apis = apis(name, raw.apis, raw.flavor, errs);
    Some(Backend {
        name: name.to_string(),
        url: url.as_str().trim_end_matches('/').to_string(),
        authority,
        path_prefix,
        flavor: raw.flavor,
        slots,
        queue: raw.queue.unwrap_or(64),
        api_key,
        apis,
    })
}

fn alias(
    name: &str,
    raw: RawAlias,
    backends: &BTreeMap<String, Arc<Backend>>,
    errs: &mut Vec<ConfigError>,
) -> Option<Alias> {
    let Some(backend) = backends.get(&raw.backend) else {
        errs.push(ConfigError::UnknownBackend {
            alias: name.to_string(),
            name: raw.backend,
        });
        return None;
    };
    let context_window = match raw.context_window {
        Some(0) => {
            errs.push(ConfigError::Zero {
                key: format!("aliases.{name}.context_window"),
            });
            None
        }
        w => w.and_then(NonZeroU32::new),
    };
    let mut inputs = Input::default();
    for (i, kind) in raw
        .inputs
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
    let think_tags = raw.think_tags.as_ref().and_then(|spec| {
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
    let upstream_model = raw.upstream_model.unwrap_or_else(|| name.to_string());
    let guard = match context_window {
        Some(window) => {
            let count = raw.count.unwrap_or(if raw.tokenizer.is_some() {
                CountKind::Local
            } else {
                CountKind::Estimate
            });
            if count == CountKind::Local && raw.tokenizer.is_none() {
                errs.push(ConfigError::BadValue {
                    key: format!("aliases.{name}.count"),
                    value: "local".into(),
                    reason: "needs tokenizer = { file, config } (tokenizer.json and tokenizer_config.json)".into(),
                });
            }
            Some(GuardConfig {
                window: window.get(),
                count,
                tokenizer: raw.tokenizer,
                media: raw.media_tokens.unwrap_or_default(),
                clamp_max_tokens: raw.clamp_max_tokens.unwrap_or(false),
            })
        }
        None => {
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
            None
        }
    };
    Some(Alias {
        name: name.to_string(),
        served_as: HeaderValue::from_str(name).unwrap_or(HeaderValue::from_static("invalid")),
        backend: Arc::clone(backend),
        upstream_model,
        context_window,
        guard,
        context_fallback: raw.context_fallback,
        inputs,
        old_names: raw.old_names,
        reasoning_field: reasoning,
        think_tags,
        description: raw.description,
    })
}

#[cfg(test)]
mod tests {
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
    fn every_error_is_reported_not_just_the_first() {
        let e = errors(
            "[aliases.x]\nbackend = \"nope\"\n[aliases.w]\nbackend = \"gpu\"\ncontext_window = 0",
        );
        assert_eq!(e.lines().count(), 2, "{e}");
    }
}
