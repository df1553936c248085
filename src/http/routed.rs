//! The entry of every model-routed POST: its record, the path check, intake, then the pipeline.

use axum::http::{Method, Request};
use axum::response::Response;
use bytes::Bytes;

use super::intake::{request_id, respond, routed_body};
use crate::error::ProxyError;
use crate::live::AppState;
use crate::observe::record::Record;
use crate::pipeline::{self, Incoming};
use crate::wire::{self, Endpoint};

/// Whether a request is model-routed: a POST under `/v1/` other than the fixed routes
/// `/v1/messages/count_tokens`, `/v1/responses/input_tokens` and `/v1/models[/…]` (chat,
/// completions, embeddings,
/// responses, messages, …).
pub fn is_routed(method: &Method, path: &str) -> bool {
    method == Method::POST
        && path.starts_with("/v1/")
        && path != "/v1/messages/count_tokens"
        && path != "/v1/responses/input_tokens"
        && path != "/v1/models"
        && !path.starts_with("/v1/models/")
}

/// Every JSON POST routed by its `model`: chat, completions, embeddings, responses, messages, …
pub async fn routed_with<B>(state: &AppState, req: Request<B>) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    // The request taken whole: its headers move along instead of being copied.
    let (parts, body) = req.into_parts();
    let (uri, headers) = (parts.uri, parts.headers);
    let snap = state.live.load_full();
    let endpoint = Endpoint::from_path(uri.path());
    let adapter = wire::adapter(endpoint);
    let mut rec = Record::start(snap.metrics(None), endpoint, request_id(&headers));
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let result = async {
        if has_dot_segment(uri.path()) {
            return Err(ProxyError::NotFound {
                method: "POST".into(),
                path: path.to_string(),
            });
        }
        let body = routed_body(&snap, &headers, body).await?;
        let req = Incoming {
            adapter,
            path: path.to_string(),
            headers,
            body,
        };
        pipeline::handle(state, &snap, &mut rec, req).await
    }
    .await;
    respond(&mut rec, adapter, result)
}

/// `.` or `..` segments in `path` (the URI's path, without its query), raw or percent-encoded,
/// or an encoded `/`: they would resolve to backend paths outside the API (llama.cpp
/// `/slots`, SGLang admin endpoints) and are refused.
fn has_dot_segment(path: &str) -> bool {
    // Nearly every path has neither: skip the per-segment work for them.
    if !path.bytes().any(|b| b == b'.' || b == b'%') {
        return false;
    }
    path.split('/').any(|seg| {
        let seg = seg.to_ascii_lowercase().replace("%2e", ".");
        seg == "." || seg == ".."
    }) || path.to_ascii_lowercase().contains("%2f")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_found_raw_and_encoded() {
        for refused in [
            "/v1/../slots",
            "/v1/./chat/completions",
            "/v1/%2e%2e/slots",
            "/v1/%2E%2E/slots",
            "/v1/.%2e/slots",
            "/v1/chat%2fcompletions",
            "/v1/..",
        ] {
            assert!(has_dot_segment(refused), "{refused}");
        }
        for passed in ["/v1/chat/completions", "/v1/models/qwen3.5-27b", "/v1/a..b"] {
            assert!(!has_dot_segment(passed), "{passed}");
        }
    }

    #[test]
    fn routed_requests_are_the_posts_under_v1_but_count_tokens() {
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/messages",
            "/v1/anything/else",
            "/v1/modelsx",
        ] {
            assert!(is_routed(&Method::POST, path), "{path}");
            assert!(!is_routed(&Method::GET, path), "GET {path}");
        }
        for path in [
            "/v1/messages/count_tokens",
            "/v1/responses/input_tokens",
            "/v1/models",
            "/v1/models/frank-zealot",
            "/tokenize",
            "/v1",
            "/v2/chat",
            "/metrics",
        ] {
            assert!(!is_routed(&Method::POST, path), "{path}");
        }
    }
}
