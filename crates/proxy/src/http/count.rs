//! Counting endpoints, one per API that has one (its adapter's [`crate::wire::ApiSpec::routes`]):
//! `POST /tokenize` (vLLM's shape), `POST /v1/messages/count_tokens` (Anthropic's),
//! `POST /v1/responses/input_tokens` (OpenAI's): the exact count for the alias, or the
//! backend's own answer where the alias counts with the backend and the backend has the
//! endpoint itself. A count is one request of its client's limits, and takes its turn at
//! the count gate within the client's part of `server.count_concurrency`.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::intake::{identify, request_id, respond, routed_body};
use crate::clients::charge::Charge;

use crate::error::ProxyError;
use crate::guard::{self, Counted, GuardSpec};
use crate::live::alias::Replica;
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::pipeline::{resolve, Incoming};
use crate::tokens::Method;
use crate::upstream::exchange;
use crate::wire::{Adapter, Endpoint};

/// `POST` to the counting endpoint of `adapter`'s API: the count in that API's answer.
pub(crate) async fn answer(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
    adapter: &'static dyn Adapter,
) -> Response {
    let snap = state.live.load_full();
    let endpoint = Endpoint::count_of(adapter);
    let mut rec = Record::start(snap.unknown_metrics(), endpoint, request_id(&headers));
    let mut known: Option<crate::clients::Caller> = None;
    let result = async {
        let caller = identify(&snap, &headers)?;
        if let Some(c) = &caller {
            rec.client = Some(c.state.metrics.clone());
            rec.owner = Some(std::sync::Arc::clone(&c.owner));
            known = Some(c.clone());
        }
        let body = routed_body(&snap, &headers, body).await?;
        let req = Incoming {
            adapter,
            path: String::new(),
            headers,
            body,
            caller,
            idle: false,
        };
        let routed = resolve(&snap, &mut rec, &req)?;
        if let Some(c) = &req.caller {
            // One request of the client's limits (no tokens: a count generates none).
            rec.charge = Some(Box::new(Charge::admit(c, 0, 0, 0, true).await?));
        }
        let live = &routed.route.alias;
        let alias = &*live.spec;
        let spec: &GuardSpec = live.guard().ok_or_else(|| {
            ProxyError::InvalidRequest(format!(
                "alias {} has no context_window configured, so its tokens are not counted",
                alias.name
            ))
        })?;
        let body = routed
            .view
            .upstream_body(&req.body, &alias.upstream_model, false);
        let served = alias.backend.translation(adapter).is_none();
        let native = adapter
            .spec()
            .native_count_path(alias.backend.flavor)
            .filter(|_| served);
        if let Some(path) = native.filter(|_| spec.counter.kind() == Method::Backend) {
            return forward(&state, &snap, live.first(), path, req.headers, body).await;
        }
        let counted = Counted {
            adapter,
            body: &body,
            converter: alias.backend.counting(adapter),
            who: req.caller.as_ref().map(|c| c.state.id),
        };
        let (value, fallback) = guard::count_response(spec, &state.client, counted).await?;
        if let Some(reason) = fallback {
            live.metrics.count_fallback(reason.into());
        }
        Ok(Json(value).into_response())
    }
    .await;
    let mut resp = respond(&mut rec, adapter, result);
    let anthropic = adapter.spec().anthropic_rate_limits;
    crate::clients::headers::of_caller(resp.headers_mut(), known.as_ref(), anthropic);
    resp
}

/// The backend's own count: the request posted to its endpoint (within its first-byte and
/// total limits), its JSON answer returned.
async fn forward(
    state: &AppState,
    snap: &Snapshot,
    replica: &Replica,
    path: &str,
    headers: HeaderMap,
    body: Vec<u8>,
) -> Result<Response, ProxyError> {
    let backend = &*replica.backend;
    let limits = backend.timeouts;
    let headers = exchange::upstream_headers(headers, backend.origin(), snap.clients.closed());
    let to = exchange::Outbound {
        backend: backend.origin(),
        watch: Some(&replica.conns),
        path_and_query: path,
        headers,
        body: body.into(),
        header_timeout: limits.first_byte.min(limits.total),
    };
    let sent = exchange::send(&state.client, to);
    let answer = sent.await.map_err(|u| u.to_client())?;
    let protocol = |detail: String| ProxyError::UpstreamProtocol {
        backend: backend.name.clone(),
        detail,
    };
    let bytes = match tokio::time::timeout(
        limits.total,
        exchange::read_all(answer.body, crate::upstream::SMALL_ANSWER_LIMIT),
    )
    .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(protocol(crate::upstream::chain(e.as_ref()))),
        Err(_) => {
            return Err(ProxyError::UpstreamTimeout {
                backend: backend.name.clone(),
                elapsed: limits.total,
            })
        }
    };
    if answer.status.is_client_error() {
        return Err(ProxyError::InvalidRequest(
            crate::guard::canonical::detail_of(&bytes),
        ));
    }
    if !answer.status.is_success() {
        return Err(protocol(format!(
            "token counting answered {}",
            answer.status
        )));
    }
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| protocol(format!("token counting answered invalid JSON: {e}")))?;
    Ok(Json(value).into_response())
}
