//! The backend strategy: the backend applies its own template and tokenizer and says the count.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{saturate, CountError, MediaCosts};
use crate::flavor::Flavor;

/// How long one counting round trip may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Counts through a backend's endpoints: llama.cpp `/apply-template` then `/tokenize`
/// (`add_special: false`, `parse_special: true`, which equals its `usage.prompt_tokens`);
/// vLLM `/tokenize` and SGLang `/v1/tokenize` in their messages form.
#[derive(Debug, Clone)]
pub struct BackendCounter {
    flavor: Flavor,
    base: String,
    upstream_model: String,
    /// The backend's config name: what errors show clients (never its address).
    name: String,
    /// The backend's own `Authorization: Bearer` value (marked sensitive).
    authorization: Option<http::HeaderValue>,
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
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("backend url {url:?}: must be http or https"));
        }
        Ok(BackendCounter {
            flavor,
            base: url.trim_end_matches('/').to_string(),
            upstream_model: upstream_model.to_string(),
            name: parsed.host_str().unwrap_or("backend").to_string(),
            authorization: None,
        })
    }

    /// Name the backend in errors and authenticate with its key.
    pub fn identify(&mut self, name: &str, authorization: Option<&http::HeaderValue>) {
        self.name = name.to_string();
        self.authorization = authorization.cloned();
    }

    pub async fn count(
        &self,
        client: &reqwest::Client,
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

    async fn post(
        &self,
        client: &reqwest::Client,
        path: &str,
        body: &Value,
    ) -> Result<Value, CountError> {
        let url = format!("{}{}", self.base, path);
        let fail = |status: Option<u16>, detail: String| CountError::Backend {
            backend: self.name.clone(),
            status,
            detail,
        };
        let bytes = serde_json::to_vec(body).map_err(|e| fail(None, e.to_string()))?;
        let mut req = client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(TIMEOUT)
            .body(bytes);
        if let Some(auth) = &self.authorization {
            req = req.header(reqwest::header::AUTHORIZATION, auth.clone());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| fail(None, crate::proxy::without_url(&e)))?;
        let status = resp.status().as_u16();
        let text = resp
            .bytes()
            .await
            .map_err(|e| fail(Some(status), crate::proxy::without_url(&e)))?;
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
