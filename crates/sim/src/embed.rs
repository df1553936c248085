//! `/v1/embeddings`: a small fixed vector per input, derived from the input's text.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::frame::Failure;
use super::reply;
use super::state::Shared;
use super::tokenize::count;
use switchboard_wire::flavor::Flavor;

/// Dimensions of every simulated embedding.
pub(crate) const DIMS: usize = 8;

/// The embedding of one input: the same input always gives the same unit vector.
pub(crate) fn embedding(input: &str) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in input.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let raw: Vec<f32> = (0..DIMS)
        .map(|i| f32::from(((h >> (i * 8)) & 0xff) as u8) / 255.0 - 0.5)
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    raw.into_iter().map(|x| x / norm).collect()
}

fn inputs(body: &Value) -> Result<Vec<String>, Failure> {
    match body.get("input") {
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            Ok(vec![Value::Array(items.clone()).to_string()])
        }
        Some(Value::Array(items)) => Ok(items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect()),
        None | Some(Value::Null) => Err(Failure::Missing("input")),
        Some(_) => Err(Failure::Invalid(
            "'input' must be a string or an array".to_owned(),
        )),
    }
}

pub(crate) async fn embeddings(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    let parsed = serde_json::from_slice::<Value>(&raw)
        .map_err(|e| Failure::Json {
            line: e.line(),
            column: e.column(),
            detail: e.to_string(),
        })
        .and_then(|b| inputs(&b));
    let inputs = match parsed {
        Ok(i) => i,
        Err(f) => return reply::failure(&sh, &f),
    };
    let tokens: u32 = inputs
        .iter()
        .map(|i| count(i, true))
        .fold(0, u32::saturating_add);
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"index": i, "object": "embedding", "embedding": embedding(text)}))
        .collect();
    let model = &sh.cfg.model;
    let body = match sh.flavor() {
        Flavor::Llamacpp => json!({
            "model": model, "object": "list",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": data,
        }),
        _ => json!({
            "id": format!("embd-{}", sh.next_id()), "object": "list", "created": reply::unix_now(),
            "model": model, "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": null},
        }),
    };
    reply::json(sh.flavor(), StatusCode::OK, &body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embedding("hello");
        assert_eq!(a, embedding("hello"));
        assert_ne!(a, embedding("world"));
        let norm: f32 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4);
    }
}
