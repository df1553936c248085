//! The Messages and Responses requests in the chat form each flavour makes of them (the same
//! converters the proxy counts with), and their counting endpoints as the real servers answer
//! them: `/v1/messages/count_tokens` (llama.cpp, vLLM, SGLang) and llama.cpp's
//! `/v1/responses/input_tokens`, each counting the converted prompt.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::dialects::dialect;
use super::frame::{Failure, Kind};
use super::plan;
use super::reply;
use super::state::Shared;
use switchboard_wire::chat_form::{Conversion as ToChat, Converter};
use switchboard_wire::flavor::Flavor;

/// The request in the chat form the flavour makes of it.
pub(super) fn converted(flavor: Flavor, raw: &[u8], convert: ToChat) -> Result<Value, Failure> {
    let req: Value = serde_json::from_slice(raw).map_err(|e| Failure::Json {
        line: e.line(),
        column: e.column(),
        detail: e.to_string(),
    })?;
    let Value::Object(req) = req else {
        return Err(Failure::Invalid(
            "the request body must be a JSON object".into(),
        ));
    };
    let chat =
        convert(req, Converter::native(flavor)).map_err(|e| Failure::Invalid(e.to_string()))?;
    Ok(Value::Object(chat))
}

/// The prompt tokens of a chat-form request.
fn prompt_tokens(sh: &Shared, chat: &Value) -> Result<u32, Failure> {
    let d = dialect(sh.flavor());
    let raw = serde_json::to_vec(chat).map_err(|e| Failure::Invalid(e.to_string()))?;
    Ok(plan::parse(false, sh.flavor(), d, Kind::Chat, &raw)?.prompt_tokens)
}

pub(crate) async fn count_tokens(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    let flavor = sh.flavor();
    let counted = converted(flavor, &body, switchboard_wire::messages::to_chat::to_chat)
        .and_then(|chat| prompt_tokens(&sh, &chat));
    match counted {
        Ok(n) => reply::json(flavor, StatusCode::OK, &json!({"input_tokens": n})),
        Err(f) => reply::failure(&sh, &f),
    }
}

pub(crate) async fn input_tokens(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    let flavor = sh.flavor();
    let counted = converted(flavor, &body, switchboard_wire::responses::to_chat::to_chat)
        .and_then(|chat| prompt_tokens(&sh, &chat));
    match counted {
        Ok(n) => reply::json(
            flavor,
            StatusCode::OK,
            &json!({"input_tokens": n, "object": "response.input_tokens"}),
        ),
        Err(f) => reply::failure(&sh, &f),
    }
}
