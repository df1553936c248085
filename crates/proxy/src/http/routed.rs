//! The entry of every model-routed POST: its record, the path check, intake, then the pipeline.

use axum::http::{header, HeaderMap, HeaderValue, Method, Request};
use axum::response::Response;
use bytes::Bytes;

use super::intake::{identify, request_id, respond, routed_body, within_limits};
use crate::clients::Caller;
use crate::error::{Echo, ProxyError};
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::pipeline::{self, Incoming};
use crate::wire::{self, Endpoint};

/// Whether a request is model-routed: a POST under `/v1/` other than the fixed routes — the
/// APIs' counting endpoints (`/v1/messages/count_tokens`, `/v1/responses/input_tokens`) and
/// `/v1/models[/…]` — (chat, completions, embeddings, responses, messages, …). A path spelled
/// in a non-canonical way is routed too, and refused there ([`crate::path`]).
pub(crate) fn is_routed(method: &Method, path: &str) -> bool {
    method == Method::POST
        && path.starts_with("/v1/")
        && !wire::APIS
            .iter()
            .any(|a| a.spec().routes.count_paths().first() == Some(&path))
        && path != "/v1/models"
        && !path.starts_with("/v1/models/")
        && !is_batch_api(path)
}

/// The Files and Batch endpoints' paths (routed by the Router, not by a model).
fn is_batch_api(path: &str) -> bool {
    ["/v1/files", "/v1/batches"].iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// Every JSON POST routed by its `model`: chat, completions, embeddings, responses, messages, …
pub(crate) async fn routed_with<B>(state: &AppState, req: Request<B>) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    // The request taken whole: its headers move along instead of being copied.
    let (parts, body) = req.into_parts();
    let (uri, headers) = (parts.uri, parts.headers);
    let snap = state.live.load_full();
    // Only a canonical path is classified and forwarded: another spelling of an API's path
    // (`/v1/ch%61t/completions`) would reach that API's handler on the backend unguarded.
    // An API's own path is canonical as it is; only the others are checked.
    let endpoint = Endpoint::from_path(uri.path());
    let canonical = endpoint != Endpoint::other || crate::path::check(uri.path()).is_ok();
    let adapter = endpoint.routed_adapter();
    let mut rec = Record::start(snap.unknown_metrics(), endpoint, request_id(&headers));
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let mut limited: Option<Caller> = None;
    let result = async {
        if !canonical {
            return Err(ProxyError::NotFound {
                method: Echo::new("POST"),
                path: Echo::new(path),
            });
        }
        let caller = identify(&snap, &headers)?;
        known(&snap, &mut rec, &headers, endpoint, caller.as_ref());
        limited.clone_from(&caller);
        let body = routed_body(&snap, &headers, body).await?;
        let req = Incoming {
            adapter,
            path: path.to_string(),
            headers,
            body,
            caller,
            idle: false,
        };
        pipeline::handle(state, &snap, &mut rec, req).await
    }
    .await;
    let mut resp = respond(&mut rec, adapter, result);
    let anthropic = adapter.spec().anthropic_rate_limits;
    crate::clients::headers::of_caller(resp.headers_mut(), limited.as_ref(), anthropic);
    resp
}

/// A request its key let in is usage, answered or refused (one without is nobody's), traced
/// from here (one refused before its client is known makes no span and does not continue the
/// trace it names), and counted as its client's.
fn known(
    snap: &Snapshot,
    rec: &mut Record,
    headers: &HeaderMap,
    endpoint: Endpoint,
    caller: Option<&Caller>,
) {
    rec.ledger.clone_from(&snap.ledger);
    if let Some(tracer) = &snap.tracer {
        let id = rec.request_id.to_str().unwrap_or_default();
        rec.trace = Some(tracer.request(headers, endpoint, rec.started(), id));
    }
    if let Some(c) = caller {
        rec.client = Some(c.state.metrics.clone());
        rec.owner = Some(std::sync::Arc::clone(&c.owner));
    }
}

/// One line of a batch of `caller`'s, to `path` (its batch's endpoint): held to intake's
/// limits of a body (as they are now), then through the whole pipeline as a request of the
/// `idle` class, answered whole; and how long it waited for a slot.
pub(crate) async fn line(
    state: &AppState,
    caller: Option<Caller>,
    path: &str,
    body: Bytes,
) -> (Response, std::time::Duration) {
    let snap = state.live.load_full();
    let endpoint = Endpoint::from_path(path);
    let adapter = endpoint.routed_adapter();
    let mut rec = Record::start(
        snap.unknown_metrics(),
        endpoint,
        request_id(&HeaderMap::new()),
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    known(&snap, &mut rec, &headers, endpoint, caller.as_ref());
    let req = Incoming {
        adapter,
        path: path.to_string(),
        headers,
        body,
        caller,
        idle: true,
    };
    let result = match within_limits(&snap.config.server, &req.body) {
        Ok(()) => pipeline::handle(state, &snap, &mut rec, req).await,
        Err(e) => Err(e),
    };
    (respond(&mut rec, adapter, result), rec.queued)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "/v1/files",
            "/v1/batches",
            "/v1/batches/batch_1/cancel",
            "/tokenize",
            "/v1",
            "/v2/chat",
            "/metrics",
        ] {
            assert!(!is_routed(&Method::POST, path), "{path}");
        }
    }
}
