//! One request's context through the pipeline: the state and the config snapshot it is
//! served with, its record, the request as intake handed it over, its route and its place in
//! any queue. Each step takes the call and what is its own.

use axum::http::HeaderMap;
use bytes::Bytes;

use crate::clients::place::Place;
use crate::clients::Caller;
use crate::error::ProxyError;
use crate::fleet::conversation::Conversation;
use crate::fleet::routes::Route;
use crate::live::alias::LiveAlias;
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::reasoning::OutputField;
use crate::wire::request::ParsedRequest;
use crate::wire::Adapter;

/// A routed request as intake hands it over: authorized, its body read whole.
pub(crate) struct Incoming {
    pub(crate) adapter: &'static dyn Adapter,
    /// Path and query as the client sent them: the backend gets the same.
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// The client whose key it came with (`None`: no key is configured).
    pub(crate) caller: Option<Caller>,
    /// A line of a batch, run in the `idle` class.
    pub(crate) idle: bool,
}

/// A request whose model resolved to an alias.
pub(crate) struct Routed {
    pub(crate) view: ParsedRequest,
    pub(crate) route: Route<LiveAlias>,
    /// The field this client gets reasoning in.
    pub(crate) output: OutputField,
}

/// One request on its way: what every step reads, and the record they all write.
pub(crate) struct Call<'a> {
    pub(crate) state: &'a AppState,
    pub(crate) snap: &'a Snapshot,
    pub(crate) rec: &'a mut Record,
    pub(crate) req: Incoming,
    pub(crate) routed: Routed,
    /// Its place in any queue it waits in (the same on every replica and fallback).
    pub(crate) place: Place,
    /// Its conversation, when some alias on its way has replicas.
    pub(crate) conversation: Option<Conversation>,
    /// The client's headers, taken out of the request for the attempts.
    headers: Option<HeaderMap>,
}

impl<'a> Call<'a> {
    /// The call of `req`, routed, in `conversation`: its place made from its client and
    /// headers (a priority header that names no class is a 400).
    pub(crate) fn new(
        at: (&'a AppState, &'a Snapshot),
        rec: &'a mut Record,
        mut req: Incoming,
        routed: Routed,
        conversation: Option<Conversation>,
    ) -> Result<Call<'a>, ProxyError> {
        let (state, snap) = at;
        let place = Place::new(
            req.caller.as_ref(),
            &req.headers,
            &snap.config.clients,
            rec.started(),
            conversation.map(|c| c.key),
            req.idle,
        )?;
        let headers = Some(std::mem::take(&mut req.headers));
        Ok(Call {
            state,
            snap,
            rec,
            req,
            routed,
            place,
            conversation,
            headers,
        })
    }

    /// The client's headers for one attempt: moved when it is the `last` that can be made,
    /// else copied.
    pub(crate) fn headers(&mut self, last: bool) -> HeaderMap {
        if last {
            self.headers.take().unwrap_or_default()
        } else {
            self.headers.clone().unwrap_or_default()
        }
    }
}
