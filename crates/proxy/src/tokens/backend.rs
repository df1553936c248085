//! The backend strategy: the backend applies its own template and tokenizer and says the count.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use serde_json::{json, Map, Value};

use super::{saturate, CountError};
use crate::config::MediaCosts;
use crate::flavor::Flavor;
use crate::runtime::{self, Tokenize};

/// How long one counting round trip may take.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

/// Where counting requests go: the backend's config name (what errors show, and what its TLS
/// settings are found by), `host:port`, the URL's path prefix, https or not, its key.
#[derive(Debug, Clone)]
pub struct CountTarget {
    pub name: String,
    pub authority: String,
    pub path_prefix: String,
    pub(crate) tls: bool,
    /// The backend's own `Authorization: Bearer` value (marked sensitive).
    pub(crate) authorization: Option<http::HeaderValue>,
}

/// Why a counting request brought no whole answer (what a [`Transport`] gives).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Not sent, or its answer not read whole: the client's own words.
    #[error("{0}")]
    Failed(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Why an alias cannot count at its backend.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "count = \"backend\" needs a {names} backend: flavor {0} has no tokenize endpoint",
        names = runtime::names_with(|r| r.tokenize.is_some())
    )]
    NoTokenize(Flavor),
    #[error("backend url {url:?}: {error}")]
    BadUrl { url: String, error: url::ParseError },
    /// The url names no address to count at (the address module's words).
    #[error("backend url {url:?}: {reason}")]
    NoAddress { url: String, reason: String },
}

/// How counting reaches a backend: POST a JSON `body` to `path` (the prefix added) and give the
/// status and the whole answer, within `timeout`. The upstream client implements it, so this
/// module knows no HTTP client.
pub trait Transport: Sync {
    fn post_json<'a>(
        &'a self,
        to: &'a CountTarget,
        path: &'a str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(u16, Bytes), TransportError>>;
}

/// Counts through a backend's endpoints, as its runtime tokenizes ([`Tokenize`]): llama.cpp
/// templates then tokenizes the prompt; vLLM and SGLang tokenize the messages form.
#[derive(Debug, Clone)]
pub(crate) struct BackendCounter {
    tokenize: Tokenize,
    to: CountTarget,
    upstream_model: String,
}

impl BackendCounter {
    pub(crate) fn new(flavor: Flavor, url: &str, upstream_model: &str) -> Result<Self, SetupError> {
        let Some(tokenize) = flavor.runtime().tokenize else {
            return Err(SetupError::NoTokenize(flavor));
        };
        let parsed = url::Url::parse(url).map_err(|error| SetupError::BadUrl {
            url: url.into(),
            error,
        })?;
        let address = crate::address::address(&parsed).map_err(|e| SetupError::NoAddress {
            url: url.into(),
            reason: e.to_string(),
        })?;
        Ok(BackendCounter {
            tokenize,
            to: CountTarget {
                name: parsed.host_str().unwrap_or("backend").to_string(),
                authority: address.authority,
                path_prefix: address.path_prefix,
                tls: address.server_name.is_some(),
                authorization: None,
            },
            upstream_model: upstream_model.to_string(),
        })
    }

    /// Name the backend in errors and authenticate with its key.
    pub(crate) fn identify(&mut self, name: &str, authorization: Option<&http::HeaderValue>) {
        self.to.name = name.to_string();
        self.to.authorization = authorization.cloned();
    }

    pub(crate) async fn count(
        &self,
        client: &dyn Transport,
        body: &[u8],
        media: &MediaCosts,
    ) -> Result<u32, CountError> {
        let mut req: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|e| CountError::Invalid(format!("invalid JSON body: {e}")))?;
        let (images, audio) = strip_media(&mut req);
        req.insert("model".into(), Value::from(self.upstream_model.as_str()));
        let text = match self.tokenize {
            Tokenize::Templated { template, tokenize } => {
                let applied = self.post(client, template, &Value::Object(req)).await?;
                let prompt = applied
                    .get("prompt")
                    .and_then(Value::as_str)
                    .ok_or_else(|| self.shape(&format!("{template} gave no prompt")))?;
                let tokens = self
                    .post(
                        client,
                        tokenize,
                        &json!({"content": prompt, "add_special": false, "parse_special": true}),
                    )
                    .await?;
                tokens
                    .get("tokens")
                    .and_then(Value::as_array)
                    .map(Vec::len)
                    .ok_or_else(|| self.shape(&format!("{tokenize} gave no tokens")))?
            }
            Tokenize::Messages {
                path,
                generation_prompt,
            } => {
                let mut tok = Map::new();
                tok.insert("model".into(), Value::from(self.upstream_model.as_str()));
                for key in [
                    "messages",
                    "tools",
                    "chat_template_kwargs",
                    "add_generation_prompt",
                    "continue_final_message",
                ] {
                    if let Some(v) = req.remove(key) {
                        tok.insert(key.into(), v);
                    }
                }
                if generation_prompt {
                    tok.entry("add_generation_prompt")
                        .or_insert(Value::Bool(true));
                }
                let out = self.post(client, path, &Value::Object(tok)).await?;
                let count = out.get("count").and_then(Value::as_u64).or_else(|| {
                    out.get("tokens")
                        .and_then(Value::as_array)
                        .map(|t| t.len() as u64)
                });
                let count = count.ok_or_else(|| self.shape("tokenize gave no count"))?;
                usize::try_from(count).unwrap_or(usize::MAX)
            }
        };
        let media_tokens =
            u64::from(images) * u64::from(media.image) + u64::from(audio) * u64::from(media.audio);
        Ok(saturate(
            u64::try_from(text).unwrap_or(u64::MAX) + media_tokens,
        ))
    }

    async fn post(
        &self,
        client: &dyn Transport,
        path: &str,
        body: &Value,
    ) -> Result<Value, CountError> {
        let fail = |status: Option<u16>, detail: String| CountError::Backend {
            backend: self.to.name.clone(),
            status,
            detail,
        };
        let bytes = serde_json::to_vec(body).map_err(|e| fail(None, e.to_string()))?;
        let (status, text) = client
            .post_json(&self.to, path, bytes, TIMEOUT)
            .await
            .map_err(|e| fail(None, e.to_string()))?;
        if !(200..300).contains(&status) {
            let detail = String::from_utf8_lossy(&text[..text.len().min(300)]).into_owned();
            return Err(fail(Some(status), detail));
        }
        serde_json::from_slice(&text).map_err(|e| fail(Some(status), format!("not JSON: {e}")))
    }

    fn shape(&self, detail: &str) -> CountError {
        CountError::Backend {
            backend: self.to.name.clone(),
            status: Some(200),
            detail: detail.into(),
        }
    }
}

/// Removes image and audio parts from message contents; returns how many of each.
fn strip_media(req: &mut Map<String, Value>) -> (u32, u32) {
    let (mut images, mut audio) = (0u32, 0u32);
    let Some(Value::Array(messages)) = req.get_mut("messages") else {
        return (0, 0);
    };
    for m in messages {
        let Some(Value::Array(parts)) = m.get_mut("content") else {
            continue;
        };
        parts.retain(|p| match p.get("type").and_then(Value::as_str) {
            Some("image_url" | "input_image" | "image" | "video_url") => {
                images += 1;
                false
            }
            Some("input_audio" | "audio_url") => {
                audio += 1;
                false
            }
            _ => true,
        });
    }
    (images, audio)
}
