//! One model-routed request, top to bottom: resolve → shape → guard → choose → send → respond.
//!
//! Each step is a function of its own file, entered once per attempt in this order. What
//! differs between the APIs comes from the request's adapter ([`crate::wire::Adapter`]), so no
//! step names an API.
//!
//! - resolve ([`resolve`]): the body's view (model, stream) read once, the route of its model;
//! - shape ([`shape::shape`]): the body for the alias, and its view (the resolve's when
//!   nothing changed);
//! - admit ([`admit::admit`]), the context guard: counted against the alias's window, its
//!   limit clamped, or on to the `context_fallback` alias — shaped and guarded anew, as
//!   another attempt — and the client's limits charged ([`limit`]);
//! - choose ([`choose`]): a replica, its slot;
//! - send ([`send`]), after the one per-replica part of shaping ([`shape::for_replica`]: a
//!   replica of another flavour or set of APIs may need another body — translated to chat,
//!   its history in its own form — and the model and usage option are spliced in);
//! - respond ([`respond`]).
//!
//! Choose and send run in a loop over the alias's replicas and then its fallbacks (each
//! shaped and guarded for itself), while no byte of an answer has reached the client and no
//! byte of the request may have reached a backend that gave no answer.

mod admit;
mod choose;
pub mod deadline;
mod limit;
mod peek;
pub mod relay;
mod resolve;
mod respond;
mod same_shape;
mod send;
mod shape;
mod traced;
mod tries;

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;

use admit::Guarded;
use tries::{Last, Tries};

use crate::clients::Caller;
use crate::error::ProxyError;
use crate::fleet::ticket::Ticket;
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::wire::Adapter;

pub use resolve::{known, resolve, Routed};

/// A routed request as intake hands it over: authorized, its body read whole.
pub struct Incoming {
    pub adapter: &'static dyn Adapter,
    /// Path and query as the client sent them: the backend gets the same.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The client whose key it came with (`None`: no key is configured).
    pub caller: Option<Caller>,
}

/// Serve one routed request with the snapshot it started with: its alias's replicas, then
/// its fallbacks, until one answers; the last failure when none does.
pub async fn handle(
    state: &AppState,
    snap: &Arc<Snapshot>,
    rec: &mut Record,
    mut req: Incoming,
) -> Result<Response, ProxyError> {
    let routed = resolve(snap, rec, &req)?;
    traced::resolved(rec, &req, &routed);
    let mut tries = Tries::new(snap, &routed.route.alias, &req);
    let place = place(snap, rec, &req, tries.conversation.map(|c| c.key))?;
    let mut headers = Some(std::mem::take(&mut req.headers));
    // Whether the last failed attempt was translated to chat (its answer may be the client's).
    let mut translated = None;
    while let Some(start) = tries.alias() {
        let mut alias = Arc::clone(start);
        let admitted = loop {
            let guarded = match shape::shape(&req, &alias) {
                Ok(shaped) => admit::admit(state, snap, rec, &req, alias, shaped).await,
                Err(e) => Err(e),
            };
            match guarded {
                Ok(Guarded::Admitted(a)) => break Ok(a),
                Ok(Guarded::Over(next)) => alias = next,
                Err(e) => break Err(e),
            }
        };
        let admitted = match admitted {
            Ok(a) => a,
            Err(e) if tries.on_fallback() => {
                tries.not_admitted(e);
                tries.next_alias(snap, rec);
                continue;
            }
            Err(e) => return Err(e),
        };
        let (alias, body) = (admitted.alias, admitted.body);
        limit::charge(state, snap, rec, &req, &alias, &body.body, admitted.prompt).await?;
        loop {
            let tried = &mut tries.tried;
            let chosen = match choose::choose(
                state,
                snap,
                &alias,
                tried,
                tries.conversation,
                &place,
            )
            .await
            {
                Ok(c) => c,
                Err(refusal) => break tries.refused(refusal),
            };
            rec.backend = Some(chosen.backend.name.clone());
            let out = shape::for_replica(&req, &routed.view, &alias, &chosen.backend, &body)?;
            traced::attempt(rec, &alias, &chosen, out.translated.is_some(), tries.resent);
            let headers = tries.headers(&mut headers);
            let sent = send::send(
                state,
                snap,
                rec,
                headers,
                out.path.unwrap_or(&req.path),
                &alias,
                &chosen.backend,
                out.body,
            );
            match sent.await {
                Ok(answer) => {
                    let served = respond::Served::new(req.adapter, &routed, &alias, chosen)
                        .translated(out.translated);
                    return respond::respond(snap, rec, served, answer).await;
                }
                Err(failed) => {
                    traced::failed(rec, &failed);
                    translated = out.translated;
                    tries.failed(chosen, failed)?;
                }
            }
        }
        tries.next_alias(snap, rec);
    }
    match tries.give_up() {
        Last::Answer(alias, backend, answer) => {
            let served = respond::Served::unsettled(req.adapter, &routed, &alias, backend)
                .translated(translated);
            respond::respond(snap, rec, served, answer).await
        }
        Last::Error(e) => Err(e),
    }
}

/// The request's place in any queue it waits in: its class (its client's, or lower as its
/// header asks), its client, its arrival (kept on every replica and fallback) and its
/// `conversation`.
fn place(
    snap: &Snapshot,
    rec: &Record,
    req: &Incoming,
    conversation: Option<u64>,
) -> Result<choose::Place, ProxyError> {
    let since = rec.started();
    let caller = req.caller.as_ref();
    let own = caller.map_or(crate::config::Priority::Normal, |c| c.spec.priority);
    if caller.is_none() && !req.headers.contains_key(crate::clients::PRIORITY) {
        return Ok(choose::Place {
            ticket: Ticket {
                conversation,
                ..Ticket::plain(since)
            },
            caller: None,
        });
    }
    let class = crate::clients::class(own, &req.headers)?;
    Ok(choose::Place {
        ticket: Ticket {
            class,
            client: caller.map_or(0, |c| c.state.id),
            since,
            max_wait: snap.config.clients.max_wait(class),
            conversation,
        },
        caller: caller.cloned(),
    })
}
