//! One model-routed request, top to bottom: resolve → shape → guard → choose → send → respond.
//!
//! Each step is a function of its own file. What differs between the APIs comes from the
//! request's adapter ([`crate::wire::Adapter`]), so no step names an API.

mod admit;
mod choose;
mod peek;
pub mod relay;
mod resolve;
mod respond;
mod send;
mod shape;

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;

use crate::error::ProxyError;
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::wire::Adapter;

pub use resolve::{resolve, Routed};

/// A routed request as intake hands it over: authorized, its body read whole.
pub struct Incoming {
    pub adapter: &'static dyn Adapter,
    /// Path and query as the client sent them: the backend gets the same.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Serve one routed request with the snapshot it started with.
pub async fn handle(
    state: &AppState,
    snap: &Arc<Snapshot>,
    rec: &mut Record,
    req: Incoming,
) -> Result<Response, ProxyError> {
    let routed = resolve(snap, rec, &req)?;
    let admit::Admitted { alias, body } = admit::admit(state, snap, rec, &req, &routed).await?;
    let slot = choose::slot(snap, &alias).await?;
    let answer = send::send(state, snap, rec, req.headers, &req.path, &alias, body).await?;
    let served = respond::Served {
        adapter: req.adapter,
        routed: &routed,
        alias: &alias,
        slot,
        // Set when the shape step translated the request to chat for a chat-only backend.
        from_chat: false,
    };
    respond::respond(snap, rec, served, answer).await
}
