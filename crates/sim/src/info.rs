//! Discovery endpoints: `/health`, `/v1/models`, `/metrics`, llama.cpp's `/props` and `/slots`,
//! SGLang's `/server_info` and `/model_info` (and their older `/get_…` names).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use http::{Method, StatusCode, Uri};
use serde_json::{json, Value};

use super::dialects::dialect;
use super::llamacpp::{self, FINGERPRINT};
use super::reply;
use super::state::Shared;
use super::tokenize::SPECIALS;
use switchboard_wire::flavor::Flavor;

/// The ChatML template the simulator renders, as llama.cpp would report it in `/props`.
const CHAT_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

pub(crate) async fn health(State(sh): State<Arc<Shared>>) -> Response {
    match sh.flavor() {
        Flavor::Llamacpp if sh.loading() => reply::json(
            sh.flavor(),
            StatusCode::SERVICE_UNAVAILABLE,
            &llamacpp::loading_body(),
        ),
        Flavor::Llamacpp => reply::json(sh.flavor(), StatusCode::OK, &json!({"status": "ok"})),
        other => reply::empty(other, StatusCode::OK),
    }
}

pub(crate) async fn models(State(sh): State<Arc<Shared>>) -> Response {
    let cfg = &sh.cfg;
    let body = match cfg.flavor {
        Flavor::Llamacpp => llama_models(&sh),
        Flavor::Vllm => json!({"object": "list", "data": [{
            "id": cfg.model,
            "object": "model",
            "created": sh.created,
            "owned_by": "vllm",
            "root": cfg.model,
            "parent": null,
            "max_model_len": cfg.slot_ctx,
            "permission": [{
                "id": format!("modelperm-{}", sh.next_id()),
                "object": "model_permission",
                "created": sh.created,
                "allow_create_engine": false,
                "allow_sampling": true,
                "allow_logprobs": true,
                "allow_search_indices": false,
                "allow_view": true,
                "allow_fine_tuning": false,
                "organization": "*",
                "group": null,
                "is_blocking": false,
            }],
        }]}),
        Flavor::Sglang => json!({"object": "list", "data": [{
            "id": cfg.model,
            "object": "model",
            "created": sh.created,
            "owned_by": "sglang",
            "root": cfg.model,
            "parent": null,
            "max_model_len": cfg.slot_ctx,
        }]}),
        Flavor::Openai => json!({"object": "list", "data": [{
            "id": cfg.model,
            "object": "model",
            "created": sh.created,
            "owned_by": "system",
        }]}),
    };
    reply::json(cfg.flavor, StatusCode::OK, &body)
}

fn llama_models(sh: &Shared) -> Value {
    let m = &sh.cfg.model;
    let meta = if sh.loading() {
        Value::Null
    } else {
        json!({
            "vocab_type": 2,
            "n_vocab": 151_936,
            "n_ctx": sh.cfg.slot_ctx,
            "n_ctx_train": 40_960,
            "n_embd": 64,
            "n_params": 9_806_208,
            "size": 19_613_184,
            "ftype": "F16",
        })
    };
    json!({
        "models": [{
            "name": m, "model": m, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }],
        "object": "list",
        "data": [{
            "id": m, "aliases": [m], "tags": [], "object": "model",
            "architecture": {"input_modalities": input_kinds(&sh.cfg), "output_modalities": ["text"]},
            "created": sh.created, "owned_by": "llamacpp", "meta": meta,
        }],
    })
}

/// The input kinds of the simulated model, as llama.cpp's `/v1/models` lists them.
fn input_kinds(cfg: &super::SimConfig) -> Vec<&'static str> {
    let mut kinds = vec!["text"];
    if cfg.image {
        kinds.push("image");
    }
    if cfg.audio {
        kinds.push("audio");
    }
    kinds
}

/// SGLang's server info: its server args (`max_running_requests` as set by
/// `--max-running-requests`, `context_length` null when not overridden), the scheduler's
/// figures, and one internal state per data-parallel worker.
pub(crate) async fn sglang_server_info(State(sh): State<Arc<Shared>>) -> Response {
    let cfg = &sh.cfg;
    let slots = cfg.slots.max(1);
    let tokens = u64::from(cfg.slot_ctx) * u64::from(slots);
    let body = json!({
        "model_path": format!("models/{}", cfg.model),
        "tokenizer_path": format!("models/{}", cfg.model),
        "served_model_name": cfg.model,
        "context_length": null,
        "max_running_requests": slots,
        "max_total_tokens": null,
        "chunked_prefill_size": 8192,
        "tp_size": 1,
        "dp_size": 1,
        "status": "ready",
        "max_total_num_tokens": tokens,
        "max_req_input_len": cfg.slot_ctx.saturating_sub(1),
        "internal_states": [{
            "max_running_requests": slots,
            "last_gen_throughput": 0.0,
            "memory_usage": {"kvcache": 0.01, "token_capacity": tokens},
        }],
        "version": "0.5.4",
    });
    reply::json(cfg.flavor, StatusCode::OK, &body)
}

/// SGLang's model info, with the input kinds the model takes.
pub(crate) async fn sglang_model_info(State(sh): State<Arc<Shared>>) -> Response {
    let cfg = &sh.cfg;
    let body = json!({
        "model_path": format!("models/{}", cfg.model),
        "tokenizer_path": format!("models/{}", cfg.model),
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": cfg.image,
        "has_audio_understanding": cfg.audio,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
    });
    reply::json(cfg.flavor, StatusCode::OK, &body)
}

fn params(n_predict: i64) -> Value {
    json!({
        "seed": 4_294_967_295u32, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
        "max_tokens": n_predict, "n_predict": n_predict, "n_keep": 0, "stream": false,
        "chat_format": "Content-only", "reasoning_format": "deepseek",
    })
}

pub(crate) async fn props(State(sh): State<Arc<Shared>>) -> Response {
    let cfg = &sh.cfg;
    let token = |id: u32| {
        SPECIALS
            .iter()
            .find(|(_, s)| *s == id)
            .map_or("", |(p, _)| *p)
    };
    let body = json!({
        "default_generation_settings": {"params": params(-1), "n_ctx": cfg.slot_ctx},
        "total_slots": cfg.slots.max(1),
        "model_alias": cfg.model,
        "model_path": format!("models/{}.gguf", cfg.model),
        "modalities": {"vision": cfg.image, "video": false, "audio": cfg.audio},
        "endpoint_slots": true,
        "endpoint_props": false,
        "endpoint_metrics": true,
        "chat_template": CHAT_TEMPLATE,
        "bos_token": token(151_643),
        "eos_token": token(151_645),
        "build_info": FINGERPRINT,
        "is_sleeping": false,
    });
    reply::json(cfg.flavor, StatusCode::OK, &body)
}

pub(crate) async fn slots(State(sh): State<Arc<Shared>>) -> Response {
    let running = sh.recorder.running();
    let gpu = sh.gpu.as_ref().map(|g| g.slots());
    let list: Vec<Value> = (0..sh.cfg.slots.max(1))
        .map(|i| {
            // GPU mode: each slot's own state (`n_past`, as older llama-server builds show it).
            let view = gpu.as_ref().and_then(|v| v.get(i as usize));
            let busy = view.map_or(i < running, |v| v.busy);
            let mut slot = json!({
                "id": i, "n_ctx": sh.cfg.slot_ctx, "speculative": false, "is_processing": busy,
                "id_task": -1, "params": params(-1),
                "next_token": [{"has_next_token": busy, "has_new_line": false, "n_remain": -1, "n_decoded": 0}],
            });
            if let Some(v) = view {
                slot["n_past"] = json!(v.cached_tokens);
            }
            slot
        })
        .collect();
    reply::json(sh.flavor(), StatusCode::OK, &Value::Array(list))
}

/// GPU mode's own report: `{"busy_seconds", "slots": [{"id", "cached_tokens", "busy"}]}`.
pub(crate) async fn sim_gpu(State(sh): State<Arc<Shared>>) -> Response {
    let Some(gpu) = &sh.gpu else {
        let (status, body) = dialect(sh.flavor()).not_found("GET", "/sim/gpu");
        return reply::json(sh.flavor(), status, &body);
    };
    let slots: Vec<Value> = gpu
        .slots()
        .iter()
        .map(|s| json!({"id": s.id, "cached_tokens": s.cached_tokens, "busy": s.busy}))
        .collect();
    let body = json!({"busy_seconds": gpu.busy().as_secs_f64(), "slots": slots});
    reply::json(sh.flavor(), StatusCode::OK, &body)
}

/// What a flavour's `/metrics` reads from: slot use, token and request counts.
struct Readings {
    running: u64,
    queued: u64,
    prompt: u64,
    predicted: u64,
    requests: u64,
    kv_usage: f64,
}

/// A family: name, type, help, value.
type Family = (&'static str, &'static str, &'static str, String);

fn llamacpp_families(r: &Readings) -> Vec<Family> {
    let Readings {
        running,
        queued,
        prompt,
        predicted,
        ..
    } = r;
    vec![
        (
            "llamacpp:prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed, excluding cached tokens",
            prompt.to_string(),
        ),
        (
            "llamacpp:tokens_predicted_total",
            "counter",
            "Number of generation tokens processed",
            predicted.to_string(),
        ),
        (
            "llamacpp:requests_processing",
            "gauge",
            "Number of requests processing",
            running.to_string(),
        ),
        (
            "llamacpp:requests_deferred",
            "gauge",
            "Number of requests deferred",
            queued.to_string(),
        ),
    ]
}

fn vllm_families(r: &Readings) -> Vec<Family> {
    let Readings {
        running,
        queued,
        prompt,
        predicted,
        requests,
        kv_usage,
    } = r;
    vec![
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            running.to_string(),
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            queued.to_string(),
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            kv_usage.to_string(),
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            prompt.to_string(),
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            predicted.to_string(),
        ),
        (
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            requests.to_string(),
        ),
    ]
}

fn sglang_families(r: &Readings) -> Vec<Family> {
    let Readings {
        running,
        queued,
        prompt,
        predicted,
        requests,
        ..
    } = r;
    vec![
        (
            "sglang:num_running_reqs",
            "gauge",
            "The number of running requests.",
            running.to_string(),
        ),
        (
            "sglang:num_queue_reqs",
            "gauge",
            "The number of requests in the waiting queue.",
            queued.to_string(),
        ),
        (
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            prompt.to_string(),
        ),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            predicted.to_string(),
        ),
        (
            "sglang:num_requests_total",
            "counter",
            "Number of requests processed.",
            requests.to_string(),
        ),
    ]
}

pub(crate) async fn metrics(State(sh): State<Arc<Shared>>) -> Response {
    let running = u64::from(sh.recorder.running());
    let r = Readings {
        running,
        queued: u64::from(sh.recorder.queued()),
        prompt: sh.stats.prompt_tokens.load(Ordering::Relaxed),
        predicted: sh.stats.predicted_tokens.load(Ordering::Relaxed),
        requests: sh.stats.requests.load(Ordering::Relaxed),
        kv_usage: running as f64 / f64::from(sh.cfg.slots.max(1)),
    };
    let (families, labels) = match sh.flavor() {
        // llama.cpp's families carry no labels; vLLM's and SGLang's the model name.
        Flavor::Llamacpp => (llamacpp_families(&r), String::new()),
        Flavor::Vllm | Flavor::Openai => (vllm_families(&r), model_label(&sh)),
        Flavor::Sglang => (sglang_families(&r), model_label(&sh)),
    };
    let mut out = String::with_capacity(1024);
    for (name, kind, help, value) in families {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value}"
        );
    }
    reply::text(sh.flavor(), out)
}

fn model_label(sh: &Shared) -> String {
    format!("{{model_name={}}}", sh.model_json)
}

/// Unknown routes and methods, in the flavour's own shape.
pub(crate) async fn not_found(State(sh): State<Arc<Shared>>, method: Method, uri: Uri) -> Response {
    let (status, body) = dialect(sh.flavor()).not_found(method.as_str(), uri.path());
    reply::json(sh.flavor(), status, &body)
}
