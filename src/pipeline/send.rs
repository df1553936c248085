//! Send: the client's headers made the backend's, the body posted, the answer's head awaited.

use axum::http::HeaderMap;
use bytes::Bytes;

use crate::config::Alias;
use crate::error::ProxyError;
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::upstream::exchange::{self, Answer, UpstreamReason};

/// Post `body` to the alias's backend at `path`; failures are counted by reason.
pub async fn send(
    state: &AppState,
    snap: &Snapshot,
    rec: &mut Record,
    headers: HeaderMap,
    path: &str,
    alias: &Alias,
    body: Vec<u8>,
) -> Result<Answer, ProxyError> {
    let server = &snap.config.server;
    let backend = &alias.backend;
    let m = snap.metrics(Some(&alias.name));
    let headers = exchange::upstream_headers(headers, backend, server.api_keys.is_some());
    rec.sending();
    let sent = exchange::send(
        &state.client,
        backend,
        path,
        headers,
        Bytes::from(body),
        server.header_timeout,
    )
    .await;
    let answer = sent.inspect_err(|e| {
        if let Some(reason) = exchange::reason_of(e) {
            m.upstream_error(reason);
        }
    })?;
    rec.headers_received();
    if answer.status.is_server_error() {
        m.upstream_error(UpstreamReason::status_5xx);
    }
    Ok(answer)
}
