//! `switchboard export`: every alias in the shape harness configs take — a provider with a
//! `baseUrl` and `models: [{id, name, input, contextWindow, maxTokens}]` (the `models.yml` of
//! pi-style agent harnesses; `--format json` is the same document as JSON).
//!
//! From the config, or (`--probe`) with the figures the fleet will honour: the smaller of the
//! configured and the discovered window (the discovered one where the config says `"auto"` or
//! nothing), and the input kinds that both the alias and the model take. `maxTokens` is the
//! alias's `max_output_tokens` either way.

use std::fmt::Write as _;
use std::net::SocketAddr;

use serde_json::{json, Map, Value};

use crate::config::{Alias, Config, Sizing};
use crate::fleet::discovery::Discovered;

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML, as a harness's `models.yml` takes it.
    #[value(name = "models-yml")]
    ModelsYml,
    /// The same document as JSON (a `models.json`).
    Json,
}

pub(crate) use crate::fleet::drift::Probed;

/// The harness's entry of one alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub id: String,
    pub input: Vec<&'static str>,
    pub context_window: Option<u32>,
    pub(crate) max_tokens: Option<u32>,
}

/// `alias` as a harness sees it, from the config or, with `found`, from what its backend said.
pub(crate) fn model(alias: &Alias, found: Option<&Discovered>) -> Model {
    let configured = alias
        .window_setting
        .and_then(Sizing::fixed)
        .map(|w| w.get());
    let (window, input) = match found {
        None => (configured, alias.shape.inputs),
        Some(d) => {
            let discovered = d.window_for(&alias.upstream_model);
            let window = match (configured, discovered) {
                (Some(c), Some(d)) => Some(c.min(d)),
                (c, d) => c.or(d),
            };
            (
                window,
                d.inputs
                    .map_or(alias.shape.inputs, |k| alias.shape.inputs.and(k)),
            )
        }
    };
    Model {
        id: alias.name.clone(),
        input: input.names(),
        context_window: window,
        max_tokens: alias.shape.max_output_tokens.map(|m| m.get()),
    }
}

/// Every alias of `config`, sorted by name; with `probed`, from the backends' figures where
/// they answered (from the config where they did not).
pub fn models(config: &Config, probed: Option<&Probed>) -> Vec<Model> {
    config
        .aliases
        .values()
        .map(|a| {
            let found = probed.and_then(|p| p.get(&a.backend.name)?.as_ref().ok());
            model(a, found)
        })
        .collect()
}

/// The proxy's address for clients: `server.listen`, an unspecified IP read as loopback.
pub fn default_base_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{ip}:{}/v1", listen.port())
}

/// The document: `providers.<provider>` with its `baseUrl`, `api`, auth, and `models`.
pub fn document(config: &Config, provider: &str, base_url: &str, models: &[Model]) -> Value {
    let models: Vec<Value> = models
        .iter()
        .map(|m| {
            let mut v = Map::new();
            v.insert("id".into(), json!(m.id));
            v.insert("name".into(), json!(m.id));
            v.insert("input".into(), json!(m.input));
            if let Some(w) = m.context_window {
                v.insert("contextWindow".into(), json!(w));
            }
            if let Some(t) = m.max_tokens {
                v.insert("maxTokens".into(), json!(t));
            }
            Value::Object(v)
        })
        .collect();
    let mut p = Map::new();
    p.insert("baseUrl".into(), json!(base_url));
    p.insert("api".into(), json!("openai-completions"));
    // The harness reads the key from this environment variable; the proxy's own keys are
    // never printed.
    match &config.server.api_keys {
        Some(_) => p.insert("apiKey".into(), json!("SWITCHBOARD_API_KEY")),
        None => p.insert("auth".into(), json!("none")),
    };
    p.insert("models".into(), Value::Array(models));
    json!({ "providers": { provider: Value::Object(p) } })
}

/// `doc` in `format`.
pub fn render(doc: &Value, format: Format) -> String {
    match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(doc).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::ModelsYml => {
            let mut out = String::new();
            yaml::block(doc, 0, &mut out);
            out
        }
    }
}

/// A YAML emitter for the document's shape: block mappings, block sequences of mappings, and
/// flow sequences of scalars. Strings are plain where YAML reads them back as the same
/// string, else double-quoted with JSON's escapes (which are YAML's too).
mod yaml {
    use super::*;

    /// Whether `s` reads back as itself, a string, written plain.
    fn plain(s: &str) -> bool {
        const WORDS: [&str; 11] = [
            "y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf",
        ];
        let mut chars = s.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
            && !WORDS.contains(&s.to_ascii_lowercase().as_str())
    }

    fn scalar(v: &Value, out: &mut String) {
        match v {
            Value::String(s) if plain(s) => out.push_str(s),
            Value::String(s) => out.push_str(&Value::from(s.as_str()).to_string()),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    scalar(item, out);
                }
                out.push(']');
            }
            Value::Object(m) if m.is_empty() => out.push_str("{}"),
            other => out.push_str(&other.to_string()),
        }
    }

    fn nested(v: &Value) -> bool {
        match v {
            Value::Object(m) => !m.is_empty(),
            Value::Array(items) => items.iter().any(|i| i.is_object() || i.is_array()),
            _ => false,
        }
    }

    /// `v` as block content at `indent` spaces.
    pub(crate) fn block(v: &Value, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let _ = write!(out, "{pad}");
                    scalar(&Value::from(k.as_str()), out);
                    out.push(':');
                    if nested(v) {
                        out.push('\n');
                        block(v, indent + 2, out);
                    } else {
                        out.push(' ');
                        scalar(v, out);
                        out.push('\n');
                    }
                }
            }
            Value::Array(items) if items.is_empty() => out.push_str(&format!("{pad}[]\n")),
            Value::Array(items) => {
                for item in items {
                    let mut inner = String::new();
                    block(item, indent + 2, &mut inner);
                    // The first line of the item goes after its dash.
                    let _ = write!(out, "{pad}- {}", inner.trim_start());
                }
            }
            other => {
                out.push_str(&pad);
                scalar(other, out);
                out.push('\n');
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn yaml_quotes_what_would_not_read_back_as_the_same_string() {
        let doc = json!({"a": {"plain": "frank-zealot", "word": "no", "num": "123",
            "odd": "x: \"y\"\n#z", "list": ["text", "image"], "n": 5}});
        let text = render(&doc, Format::ModelsYml);
        assert_eq!(
            text,
            "a:\n  plain: frank-zealot\n  word: \"no\"\n  num: \"123\"\n  odd: \"x: \\\"y\\\"\\n#z\"\n  list: [text, image]\n  \"n\": 5\n"
        );
    }

    #[test]
    fn base_url_reads_an_unspecified_listen_address_as_loopback() {
        assert_eq!(
            default_base_url("0.0.0.0:7700".parse().unwrap()),
            "http://127.0.0.1:7700/v1"
        );
        assert_eq!(
            default_base_url("[::]:80".parse().unwrap()),
            "http://[::1]:80/v1"
        );
        assert_eq!(
            default_base_url("10.0.0.2:7700".parse().unwrap()),
            "http://10.0.0.2:7700/v1"
        );
    }
}
