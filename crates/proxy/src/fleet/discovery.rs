//! Fleet discovery: what a backend says it serves (per-slot window, slots, input kinds, model
//! names), parsed from each flavour's own answers, and the one fetch that asks for them.
//!
//! - llama.cpp: `GET /props` → `default_generation_settings.n_ctx` (the per-slot window),
//!   `total_slots`, `modalities.{vision,audio}`; `GET /slots` → each slot's `n_ctx`;
//!   `GET /v1/models` → `data[].id` and `aliases`.
//! - vLLM: `GET /v1/models` → `data[].id`, `max_model_len`. vLLM reports no slot count and no
//!   input kinds over HTTP.
//! - SGLang: `GET /v1/models` → `data[].id`, `max_model_len`; `GET /server_info` (older:
//!   `/get_server_info`) → `max_running_requests` (null unless the server was started with
//!   `--max-running-requests`); `GET /model_info` (older: `/get_model_info`) →
//!   `has_image_understanding`, `has_audio_understanding`.
//! - Any other OpenAI-compatible server: `GET /v1/models` → `data[].id`.

use crate::upstream::{chain, read_all, BoxError, Client, SendError, SMALL_ANSWER_LIMIT};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Deserialize;

use crate::config::{Backend, Input};
use crate::runtime::Discovery;

/// One model a backend lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServedModel {
    pub(crate) id: String,
    /// Its window, where the listing gives one (`max_model_len`).
    pub(crate) window: Option<u32>,
}

/// What one backend reported about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// Tokens one conversation may hold, for every model of the server (llama.cpp's per-slot
    /// `n_ctx`); `None` where only the model listing gives windows.
    pub window_per_slot: Option<u32>,
    /// Requests the backend runs at once; `None` when it does not say.
    pub(crate) slots: Option<u32>,
    /// Input kinds the model takes; `None` when the backend does not say.
    pub(crate) inputs: Option<Input>,
    /// Every model name it answers to.
    pub(crate) models: Vec<ServedModel>,
    /// Unix seconds when it answered.
    pub when: u64,
}

impl Discovered {
    /// The window a request for `model` gets: the server's per-slot window, else the listed
    /// model's, else (a server listing one model) that model's.
    pub(crate) fn window_for(&self, model: &str) -> Option<u32> {
        let only = match self.models.as_slice() {
            [only] => only.window,
            _ => None,
        };
        self.window_per_slot
            .or_else(|| self.models.iter().find(|m| m.id == model)?.window)
            .or(only)
            .filter(|w| *w > 0)
    }

    /// Whether the backend answers to `model`; `None` when it lists no models.
    pub(crate) fn serves(&self, model: &str) -> Option<bool> {
        (!self.models.is_empty()).then(|| self.models.iter().any(|m| m.id == model))
    }

    /// The model names, comma-separated, for messages.
    pub(crate) fn model_names(&self) -> String {
        let names: Vec<&str> = self.models.iter().map(|m| m.id.as_str()).collect();
        names.join(", ")
    }

    /// Every figure on one line, for logs: `window 4096 per slot, 2 slots, inputs text+image,
    /// models m (4096)`.
    pub(crate) fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(w) = self.window_per_slot {
            parts.push(format!("window {w} per slot"));
        }
        parts.push(
            self.slots
                .map_or("slots not reported".into(), |s| format!("{s} slots")),
        );
        parts.push(self.inputs.map_or("inputs not reported".into(), |i| {
            format!("inputs {}", i.names().join("+"))
        }));
        let models: Vec<String> = self
            .models
            .iter()
            .map(|m| match m.window {
                Some(w) => format!("{} ({w})", m.id),
                None => m.id.clone(),
            })
            .collect();
        parts.push(format!("models {}", models.join(", ")));
        parts.join(", ")
    }
}

/// Why a backend could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("GET {path} answered {status}")]
    Status { path: String, status: u16 },
    #[error("GET {path} answered something unreadable: {reason}")]
    BadAnswer { path: String, reason: String },
}

/// Why a GET to a backend brought no whole answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoAnswer {
    #[error("{0}")]
    Send(SendError),
    #[error("{}", chain(.0.as_ref()))]
    Body(BoxError),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// GET `path` of `backend` within `timeout`: the status and the body. The one place where
/// discovery does HTTP.
pub(crate) async fn get(
    client: &Client,
    backend: &Backend,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Bytes), NoAnswer> {
    let exchange = async {
        let resp = client
            .get(backend.origin(), path, timeout)
            .await
            .map_err(NoAnswer::Send)?;
        let status = resp.status.as_u16();
        let body = read_all(resp.body, SMALL_ANSWER_LIMIT)
            .await
            .map_err(NoAnswer::Body)?;
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| NoAnswer::TimedOut(timeout))?
}

/// The body of `path`; an error unless it answers 2xx.
async fn required(
    client: &Client,
    backend: &Backend,
    path: &str,
    timeout: Duration,
) -> Result<Bytes, DiscoveryError> {
    match get(client, backend, path, timeout).await {
        Ok((status, body)) if (200..300).contains(&status) => Ok(body),
        Ok((status, _)) => Err(DiscoveryError::Status {
            path: path.into(),
            status,
        }),
        Err(e) => Err(DiscoveryError::Unreachable(e.to_string())),
    }
}

/// The body of the first of `paths` that answers 2xx; `None` when none does.
async fn optional(
    client: &Client,
    backend: &Backend,
    paths: &[&str],
    timeout: Duration,
) -> Result<Option<Bytes>, DiscoveryError> {
    for path in paths {
        match get(client, backend, path, timeout).await {
            Ok((status, body)) if (200..300).contains(&status) => return Ok(Some(body)),
            Ok(_) => {}
            Err(e) => return Err(DiscoveryError::Unreachable(e.to_string())),
        }
    }
    Ok(None)
}

/// Ask `backend` what it serves, at its runtime's own endpoints.
pub(crate) async fn discover(
    client: &Client,
    backend: &Backend,
    timeout: Duration,
) -> Result<Discovered, DiscoveryError> {
    let (c, b, t) = (client, backend, timeout);
    let mut found = match backend.flavor.runtime().discovery {
        Discovery::Props => {
            let props = required(c, b, "/props", t).await?;
            let slots = optional(c, b, &["/slots"], t).await?;
            let models = optional(c, b, &["/v1/models"], t).await?;
            parse::llamacpp(&props, slots.as_deref(), models.as_deref())?
        }
        Discovery::Models => parse::models_only(&required(c, b, "/v1/models", t).await?)?,
        Discovery::ServerInfo => {
            let models = required(c, b, "/v1/models", t).await?;
            let info = optional(c, b, &["/server_info", "/get_server_info"], t).await?;
            let model = optional(c, b, &["/model_info", "/get_model_info"], t).await?;
            parse::sglang(&models, info.as_deref(), model.as_deref())?
        }
    };
    found.when = unix_now();
    Ok(found)
}

/// Pure parsing of each flavour's answers (bodies in, figures out).
pub(crate) mod parse {
    use super::*;

    fn bad(path: &str, e: serde_json::Error) -> DiscoveryError {
        DiscoveryError::BadAnswer {
            path: path.into(),
            reason: e.to_string(),
        }
    }

    /// A figure as a `u32`, when it is a positive number that fits.
    fn figure(v: Option<u64>) -> Option<u32> {
        v.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0)
    }

    #[derive(Deserialize)]
    struct Props {
        default_generation_settings: Option<GenerationSettings>,
        total_slots: Option<u64>,
        modalities: Option<Modalities>,
    }

    #[derive(Deserialize)]
    struct GenerationSettings {
        n_ctx: Option<u64>,
    }

    #[derive(Deserialize)]
    struct Modalities {
        #[serde(default)]
        vision: bool,
        #[serde(default)]
        audio: bool,
    }

    #[derive(Deserialize)]
    struct Slot {
        n_ctx: Option<u64>,
    }

    #[derive(Deserialize)]
    struct ModelList {
        #[serde(default)]
        data: Vec<ModelEntry>,
    }

    #[derive(Deserialize)]
    struct ModelEntry {
        id: String,
        #[serde(default)]
        aliases: Vec<String>,
        max_model_len: Option<u64>,
        architecture: Option<Architecture>,
    }

    #[derive(Deserialize)]
    struct Architecture {
        #[serde(default)]
        input_modalities: Vec<String>,
    }

    fn model_list(body: &[u8]) -> Result<ModelList, DiscoveryError> {
        serde_json::from_slice(body).map_err(|e| bad("/v1/models", e))
    }

    fn served(list: &ModelList) -> Vec<ServedModel> {
        let mut models: Vec<ServedModel> = Vec::new();
        for entry in &list.data {
            let window = figure(entry.max_model_len);
            for id in std::iter::once(&entry.id).chain(&entry.aliases) {
                if !models.iter().any(|m| &m.id == id) {
                    models.push(ServedModel {
                        id: id.clone(),
                        window,
                    });
                }
            }
        }
        models
    }

    /// llama.cpp: `/props`, and `/slots` and `/v1/models` where they answered. The window is
    /// the smallest per-slot `n_ctx` either reports.
    pub(crate) fn llamacpp(
        props: &[u8],
        slots: Option<&[u8]>,
        models: Option<&[u8]>,
    ) -> Result<Discovered, DiscoveryError> {
        let props: Props = serde_json::from_slice(props).map_err(|e| bad("/props", e))?;
        let slot_list: Vec<Slot> = match slots {
            Some(body) => serde_json::from_slice(body).map_err(|e| bad("/slots", e))?,
            None => Vec::new(),
        };
        let list = models.map(model_list).transpose()?;
        let from_props = figure(props.default_generation_settings.and_then(|g| g.n_ctx));
        let from_slots = slot_list.iter().filter_map(|s| figure(s.n_ctx)).min();
        let window_per_slot = match (from_props, from_slots) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let slots = figure(props.total_slots)
            .or_else(|| u32::try_from(slot_list.len()).ok().filter(|n| *n > 0));
        let listed_kinds = list
            .as_ref()
            .and_then(|l| l.data.first()?.architecture.as_ref())
            .map(|a| Input {
                image: a.input_modalities.iter().any(|k| k == "image"),
                audio: a.input_modalities.iter().any(|k| k == "audio"),
            });
        let inputs = props
            .modalities
            .map(|m| Input {
                image: m.vision,
                audio: m.audio,
            })
            .or(listed_kinds);
        Ok(Discovered {
            window_per_slot,
            slots,
            inputs,
            models: list.as_ref().map(served).unwrap_or_default(),
            when: 0,
        })
    }

    /// vLLM and other OpenAI-compatible servers: the model listing only.
    pub(crate) fn models_only(models: &[u8]) -> Result<Discovered, DiscoveryError> {
        Ok(Discovered {
            window_per_slot: None,
            slots: None,
            inputs: None,
            models: served(&model_list(models)?),
            when: 0,
        })
    }

    #[derive(Deserialize)]
    struct ServerInfo {
        max_running_requests: Option<u64>,
        #[serde(default)]
        internal_states: Vec<InternalState>,
    }

    #[derive(Deserialize)]
    struct InternalState {
        max_running_requests: Option<u64>,
    }

    #[derive(Deserialize)]
    struct ModelInfo {
        has_image_understanding: Option<bool>,
        has_audio_understanding: Option<bool>,
    }

    /// SGLang: `/v1/models`, and the server and model info where they answered.
    pub(crate) fn sglang(
        models: &[u8],
        server_info: Option<&[u8]>,
        model_info: Option<&[u8]>,
    ) -> Result<Discovered, DiscoveryError> {
        let mut found = models_only(models)?;
        if let Some(body) = server_info {
            let info: ServerInfo =
                serde_json::from_slice(body).map_err(|e| bad("/server_info", e))?;
            let per_worker = info
                .internal_states
                .first()
                .and_then(|s| figure(s.max_running_requests));
            found.slots = per_worker.or_else(|| figure(info.max_running_requests));
        }
        if let Some(body) = model_info {
            let info: ModelInfo =
                serde_json::from_slice(body).map_err(|e| bad("/model_info", e))?;
            if let (Some(image), Some(audio)) =
                (info.has_image_understanding, info.has_audio_understanding)
            {
                found.inputs = Some(Input { image, audio });
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::parse;
    use crate::config::Input;

    /// The body of a captured llama-server answer (headers dropped).
    fn capture(name: &str) -> String {
        let text = std::fs::read_to_string(format!(
            "{}/../../tests/fixtures/discovery/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        text.split_once("\r\n\r\n")
            .or_else(|| text.split_once("\n\n"))
            .map_or(text.clone(), |(_, body)| body.to_string())
    }

    #[test]
    fn llamacpp_capture_gives_per_slot_window_slots_and_kinds() {
        let found = parse::llamacpp(
            capture("llamacpp_props.txt").as_bytes(),
            Some(capture("llamacpp_slots.txt").as_bytes()),
            Some(capture("llamacpp_v1_models.txt").as_bytes()),
        )
        .unwrap();
        assert_eq!(found.window_per_slot, Some(4096));
        assert_eq!(found.slots, Some(2));
        assert_eq!(found.inputs, Some(Input::default()));
        assert_eq!(found.serves("tiny-qwen3"), Some(true));
        assert_eq!(found.serves("other"), Some(false));
        assert_eq!(found.window_for("anything"), Some(4096));
    }

    #[test]
    fn llamacpp_smallest_slot_window_wins_and_slots_count_when_props_lacks_it() {
        let props = br#"{"default_generation_settings":{"n_ctx":8192},"modalities":{"vision":true,"audio":false}}"#;
        let slots = br#"[{"id":0,"n_ctx":8192},{"id":1,"n_ctx":4096},{"id":2,"n_ctx":8192}]"#;
        let found = parse::llamacpp(props, Some(slots), None).unwrap();
        assert_eq!(found.window_per_slot, Some(4096));
        assert_eq!(found.slots, Some(3));
        assert_eq!(
            found.inputs,
            Some(Input {
                image: true,
                audio: false
            })
        );
        assert_eq!(found.serves("x"), None);
    }

    #[test]
    fn vllm_listing_gives_the_served_models_window() {
        let body = br#"{"object":"list","data":[{"id":"qwen","object":"model","root":"/m/qwen","max_model_len":32768}]}"#;
        let found = parse::models_only(body).unwrap();
        assert_eq!(found.window_for("qwen"), Some(32768));
        assert_eq!(found.window_for("not-served"), Some(32768));
        assert_eq!((found.slots, found.inputs), (None, None));
    }

    #[test]
    fn sglang_server_and_model_info_give_slots_and_kinds() {
        let models = br#"{"object":"list","data":[{"id":"q","max_model_len":8192}]}"#;
        let info = br#"{"max_running_requests":null,"context_length":null,"internal_states":[{"max_running_requests":48}]}"#;
        let model = br#"{"model_path":"/m","has_image_understanding":true,"has_audio_understanding":false}"#;
        let found = parse::sglang(models, Some(info), Some(model)).unwrap();
        assert_eq!(found.slots, Some(48));
        assert_eq!(found.window_for("q"), Some(8192));
        assert_eq!(
            found.inputs,
            Some(Input {
                image: true,
                audio: false
            })
        );
        let unset = br#"{"max_running_requests":null,"internal_states":[{}]}"#;
        let found = parse::sglang(models, Some(unset), None).unwrap();
        assert_eq!((found.slots, found.inputs), (None, None));
    }

    #[test]
    fn unreadable_answers_name_the_path() {
        let e = parse::llamacpp(b"<html>", None, None).unwrap_err();
        assert!(e.to_string().contains("GET /props"), "{e}");
    }
}
