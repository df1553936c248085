//! One model-routed request, top to bottom: resolve → shape → guard → choose → send → respond.
//!
//! Each step is a function of its own file, entered once per attempt in this order, and takes
//! the request's [`Call`] (state, snapshot, record, the request, its route and place) and what
//! is its own. What differs between the APIs comes from the request's adapter
//! ([`crate::wire::Adapter`]), so no step names an API; what a step needs of an alias or a
//! replica it holds (`crate::live::alias`), never looks up by name.
//!
//! - resolve ([`resolve`]): the body's view (model, stream) read once, the route of its model;
//! - shape ([`shape::shape`]): the body for the alias, and its view (the resolve's when
//!   nothing changed);
//! - admit ([`admit::admitted`]), the context guard: counted against the alias's window, its
//!   limit clamped, or on to the `context_fallback` alias — shaped and guarded anew — and the
//!   client's limits charged ([`limit`]);
//! - choose ([`choose`]): a replica, its slot and its breaker's leave;
//! - send ([`send`]), after the one per-replica part of shaping ([`shape::for_replica`]: a
//!   replica of another flavour or set of APIs may need another body — translated to chat,
//!   its history in its own form — and the model and usage option are spliced in); the
//!   breaker is told what the answer's head said, in one place ([`attempt`]);
//! - respond ([`respond`]).
//!
//! Choose and send run in a loop over the alias's replicas and then its fallbacks (each
//! shaped and guarded for itself), while no byte of an answer has reached the client and no
//! byte of the request may have reached a backend that gave no answer. A failed attempt is
//! answered by [`tries`] with what comes next, as a value.

mod admit;
mod cache;
mod call;
mod choose;
pub(crate) mod deadline;
mod limit;
mod peek;
mod preempt;
pub mod relay;
mod resolve;
mod respond;
mod same_shape;
mod send;
mod shape;
#[cfg(test)]
mod tests;
mod traced;
mod tries;

use std::sync::Arc;

use axum::response::Response;

use admit::Admitted;
use choose::Chosen;
use respond::Served;
use tries::{Last, Next, Tries};

use crate::error::ProxyError;
use crate::fleet::conversation::ConversationId;
use crate::fleet::timeline::Lost;
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;

pub(crate) use call::{Call, Incoming};
pub(crate) use resolve::{known, resolve};

/// Serve one routed request with the snapshot it started with: its alias's replicas, then
/// its fallbacks, until one answers; the last failure when none does.
pub(crate) async fn handle(
    state: &AppState,
    snap: &Arc<Snapshot>,
    rec: &mut Record,
    req: Incoming,
) -> Result<Response, ProxyError> {
    let routed = resolve(snap, rec, &req)?;
    let mut tries = Tries::new(snap, &routed.route.alias, &req);
    // The conversation's id read once, where its key or the trace needs it.
    let keyed = tries.keys_conversation(snap.config.server.schedule.by_work());
    let history = &routed.view.history;
    let id = (keyed || rec.traced().is_some())
        .then(|| ConversationId::read(&req.headers, &req.body, history))
        .flatten();
    traced::resolved(rec, &req, &routed, id.as_ref());
    let conversation = keyed
        .then(|| tries.conversation(&req, history, id.as_ref()))
        .flatten();
    drop(id);
    let mut call = Call::new((state, snap), rec, req, routed, conversation)?;
    while let Some(alias) = tries.alias().cloned() {
        let admitted = match admit::admitted(&mut call, alias).await {
            Ok(a) => a,
            Err(e) if tries.on_fallback() => {
                tries.not_admitted(e);
                tries.next_alias(call.rec);
                continue;
            }
            Err(e) => return Err(e),
        };
        let need = admitted.need(call.req.adapter, &call.routed.view);
        limit::charge(&mut call, &admitted, need).await?;
        loop {
            let alias = &admitted.alias;
            let chosen = match choose::choose(&call, alias, need, &mut tries.tried).await {
                Ok(c) => c,
                Err(refusal) => break tries.refused(refusal),
            };
            match attempt(&mut call, &admitted, chosen, &mut tries).await? {
                Attempt::Answered(response) => return Ok(response),
                Attempt::Next(Next::Replica) | Attempt::Preempted => {}
                Attempt::Next(Next::Alias | Next::GiveUp) => break,
                Attempt::Next(Next::Stop(e)) => return Err(e),
            }
        }
        tries.next_alias(call.rec);
    }
    match tries.give_up() {
        Last::Answer(served, answer) => respond::respond(&mut call, served, answer).await,
        Last::Error(e) => Err(e),
    }
}

/// How one attempt ended: the client's answer, what comes after its failure, or its slot
/// taken by a better class before it sent a byte (it waits for another).
enum Attempt {
    Answered(Response),
    Next(Next),
    Preempted,
}

/// The `chosen` replica's slot was taken before the attempt sent its client a byte: counted,
/// and the request goes back to its queue as it was (its place kept), once more preempted.
fn preempted(call: &mut Call<'_>, mut chosen: Chosen) -> Attempt {
    let class = call.place.ticket.class;
    call.rec.metrics().preempted(class);
    traced::preempted(call.rec, &chosen);
    call.place.ticket.preemptions += 1;
    call.rec.preempted += 1;
    lose(call.rec, &mut chosen, Lost::Preempted);
    Attempt::Preempted
}

/// The `chosen` attempt gives its slot up unanswered, `how`: its timeline mark names whose.
fn lose(rec: &Record, chosen: &mut Chosen, how: Lost) {
    if let Some(job) = chosen.job.take() {
        job.lose(rec.loss(how));
    }
}

/// One attempt at the `chosen` replica: the body made for it, sent, the breaker told what
/// its head said (the one place it is told of a head), and the answer made the client's.
async fn attempt(
    call: &mut Call<'_>,
    admitted: &Admitted,
    mut chosen: Chosen,
    tries: &mut Tries<'_>,
) -> Result<Attempt, ProxyError> {
    call.rec.backend = Some(chosen.replica.backend.name.clone());
    call.rec.queued += chosen.queued;
    let (alias, backend) = (&admitted.alias.spec, &chosen.replica.backend);
    let mut out = shape::for_replica(call, alias, &admitted.body, backend)?;
    let translated = out.translated;
    let api = translated.map_or(call.req.adapter.spec().config_name, |_| Some("chat"));
    if let Some(first) = cache::members(&mut chosen, api, call.place.ticket.group) {
        out.body = out.body.with_first_member(first);
    }
    traced::attempt(
        call.rec,
        &admitted.alias.spec,
        &chosen,
        translated.is_some(),
        tries.resent,
    );
    let headers = call.headers(tries.only_one() && !chosen.slot.preemptible());
    let sent = {
        let send = std::pin::pin!(send::send(call, &chosen.replica, headers, out));
        preempt::sent(&mut chosen.slot, send).await
    };
    let Some(sent) = sent else {
        return Ok(preempted(call, chosen));
    };
    chosen.tally.tell(send::outcome(&sent));
    match sent {
        Ok(answer) => {
            let Some(answer) = preempt::first_piece(&mut chosen.slot, answer).await else {
                return Ok(preempted(call, chosen));
            };
            call.rec.work = chosen.job.take();
            let served = Served::new(Arc::clone(&admitted.alias), chosen).translated(translated);
            respond::respond(call, served, answer)
                .await
                .map(Attempt::Answered)
        }
        Err(failed) => {
            lose(call.rec, &mut chosen, Lost::Failed);
            traced::failed(call.rec, &failed);
            Ok(Attempt::Next(tries.failed(
                chosen.index,
                translated,
                failed,
            )))
        }
    }
}
