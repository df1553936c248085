//! The backend strategy: the backend applies its own template and tokenizer and says the count.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue};
use serde_json::{json, Map, Value};

use super::{saturate, CountError, MediaCosts};
use crate::flavor::Flavor;
use crate::upstream::{Client, Origin};

/// How long one counting round trip may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Counts through a backend's endpoints: llama.cpp `/apply-template` then `/tokenize`
/// (`add_special: false`, `parse_special: true`, which equals its `usage.prompt_tokens`);
/// vLLM `/tokenize` and SGLang `/v1/tokenize` in their messages form.
#[derive(Debug, Clone)]
pub struct BackendCounter {
    flavor: Flavor,
    /// `host:port` of the backend.
    authority: String,
    /// The base URL's path, put before the endpoints' paths.
    path_prefix: String,
    /// https: the TLS session is made with the backend's settings, found by `name`.
    tls: bool,
    upstream_model: String,
    /// The backend's config name: what errors show clients (never its address).
    name: String,
    /// The backend's own key, sent as `Authorization: Bearer`.
    api_key: Option<String>,
}

impl BackendCounter {
    pub fn new(flavor: Flavor, url: &str, upstream_model: &str) -> Result<Self, String> {
        if flavor == Flavor::Openai {
            return Err(
                "count = \"backend\" needs a llamacpp, vllm or sglang backend: flavor openai has no tokenize endpoint"
                    .into(),
            );
        }
        let parsed = url::Url::parse(url).map_err(|e| format!("backend url {url:?}: {e}"))?;
        let address =
            crate::upstream::address(&parsed).map_err(|e| format!("backend url {url:?}: {e}"))?;
        Ok(BackendCounter {
            flavor,
            authority: address.authority,
            path_prefix: address.path_prefix,
            tls: address.server_name.is_some(),
            upstream_model: upstream_model.to_string(),
            name: parsed.host_str().unwrap_or("backend").to_string(),
            api_key: None,
        })
    }

    /// Name the backend in errors and authenticate with its key.
    pub fn identify(&mut self, name: &str, api_key: Option<&str>) {
        self.name = name.to_string();
        self.api_key = api_key.map(String::from);
    }

    pub async fn count(
        &self,
        client: &Client,
        body: &[u8],
        media: &MediaCosts,
    ) -> Result<u32, CountError> {
        let mut req: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|e| CountError::Invalid(format!("invalid JSON body: {e}")))?;
        let (images, audio) = strip_media(&mut req);
        req.insert("model".into(), Value::from(self.upstream_model.as_str()));
        let text = match self.flavor {
            Flavor::Llamacpp => {
                let applied = self
                    .post(client, "/apply-template", &Value::Object(req))
                    .await?;
                let prompt = applied
                    .get("prompt")
                    .and_then(Value::as_str)
                    .ok_or_else(|| self.shape("/apply-template gave no prompt"))?;
                let tokens = self
                    .post(
                        client,
                        "/tokenize",
                        &json!({"content": prompt, "add_special": false, "parse_special": true}),
                    )
                    .await?;
                tokens
                    .get("tokens")
                    .and_then(Value::as_array)
                    .map(Vec::len)
                    .ok_or_else(|| self.shape("/tokenize gave no tokens"))?
            }
            Flavor::Vllm | Flavor::Sglang | Flavor::Openai => {
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
                if self.flavor == Flavor::Vllm {
                    tok.entry("add_generation_prompt")
                        .or_insert(Value::Bool(true));
                }
                let path = if self.flavor == Flavor::Vllm {
                    "/tokenize"
                } else {
                    "/v1/tokenize"
                };
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

    async fn post(&self, client: &Client, path: &str, body: &Value) -> Result<Value, CountError> {
        let fail = |status: Option<u16>, detail: String| CountError::Backend {
            backend: self.name.clone(),
            status,
            detail,
        };
        let bytes = serde_json::to_vec(body).map_err(|e| fail(None, e.to_string()))?;
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(key) = &self.api_key {
            if let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {key}")) {
                v.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, v);
            }
        }
        let to = Origin {
            name: &self.name,
            authority: &self.authority,
            tls: self.tls,
        };
        let path = format!("{}{path}", self.path_prefix);
        let exchange = async {
            let resp = client
                .post(to, &path, headers, Bytes::from(bytes))
                .await
                .map_err(|e| fail(None, e.to_string()))?;
            let status = resp.status.as_u16();
            let text = crate::upstream::read_all(resp.body)
                .await
                .map_err(|e| fail(Some(status), crate::upstream::chain(e.as_ref())))?;
            Ok((status, text))
        };
        let (status, text) = tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| fail(None, format!("no answer within {TIMEOUT:?}")))??;
        if !(200..300).contains(&status) {
            let detail = String::from_utf8_lossy(&text[..text.len().min(300)]).into_owned();
            return Err(fail(Some(status), detail));
        }
        serde_json::from_slice(&text).map_err(|e| fail(Some(status), format!("not JSON: {e}")))
    }

    fn shape(&self, detail: &str) -> CountError {
        CountError::Backend {
            backend: self.name.clone(),
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
