//! Where a request may still go: the alias and its fallbacks in order, the replicas of the
//! current one already tried, and the last failure — the client's answer when nothing serves.

use std::borrow::Cow;
use std::sync::Arc;

use axum::http::HeaderMap;

use super::choose::{Chosen, Refusal};
use super::send::Failed;
use super::Incoming;
use crate::config::{Alias, Backend};
use crate::error::ProxyError;
use crate::fleet::balance::{conversation_key, Conversation};
use crate::fleet::breaker::Tally;
use crate::fleet::routes::FallbackReason;
use crate::live::Snapshot;
use crate::observe::record::Record;
use crate::upstream::exchange::Answer;
use crate::upstream::failure::Kind;

/// What the client gets when no alias could serve the request.
pub enum Last {
    Error(ProxyError),
    /// A 5xx answer of a backend of the alias, nothing sent of it yet.
    Answer(Arc<Alias>, Arc<Backend>, Answer),
}

/// The request's way through its aliases and their replicas.
pub struct Tries<'s> {
    /// The alias and the fallbacks its client may use (a fallback it may not use is absent).
    order: Cow<'s, [Arc<Alias>]>,
    at: usize,
    /// The conversation, when some alias on the way has replicas.
    pub conversation: Option<Conversation>,
    /// Replicas of the current alias (by their place in `backends`) tried already.
    pub tried: Vec<usize>,
    /// Why the current alias did not serve (the fallback's reason label).
    why: Option<FallbackReason>,
    last: Option<Last>,
    /// A request a backend dropped unanswered may go on once more (`server.resend_unanswered`,
    /// or by default for the APIs whose adapter says so); spent by the first such resend, so a
    /// request that makes backends hang up on it reaches two of them at most.
    resend: bool,
    /// The resend was spent: the attempts from now on carry a request sent before.
    pub resent: bool,
}

impl<'s> Tries<'s> {
    pub fn new(snap: &'s Snapshot, alias: &Arc<Alias>, req: &Incoming) -> Tries<'s> {
        let order = match req.caller.as_ref().filter(|c| c.spec.aliases.is_some()) {
            Some(c) => snap.routes.order_for(&alias.name, &|a| c.may_use(a)),
            None => Cow::Borrowed(snap.routes.order(&alias.name)),
        };
        let conversation = order
            .iter()
            .any(|a| a.backends.len() > 1)
            .then(|| conversation_key(&alias.name, &req.headers, &req.body))
            .flatten();
        let resend = snap
            .config
            .server
            .resend_unanswered
            .unwrap_or_else(|| req.adapter.spec().resent_by_default);
        Tries {
            order,
            at: 0,
            conversation,
            tried: Vec::new(),
            why: None,
            last: None,
            resend,
            resent: false,
        }
    }

    /// The alias to try now, `None` once none is left.
    pub fn alias(&self) -> Option<&Arc<Alias>> {
        self.order.get(self.at)
    }

    /// The current alias is one of the fallbacks (not the alias asked for).
    pub fn on_fallback(&self) -> bool {
        self.at > 0
    }

    /// The client's headers for this attempt: moved when no other attempt can follow.
    pub fn headers(&self, kept: &mut Option<HeaderMap>) -> HeaderMap {
        let only = self.order.len() == 1 && self.order[0].backends.len() == 1;
        if only {
            kept.take().unwrap_or_default()
        } else {
            kept.clone().unwrap_or_default()
        }
    }

    /// Sending to `chosen` failed before any byte reached the client: its breaker is told
    /// what the backend did on its own ([`Failed::outcome`]), and the next replica is tried —
    /// unless some of the request may be running on the backend, which gave no head
    /// (`UpstreamError::held_by_backend`): then its error is the client's answer (`Err`),
    /// but for one hang-up (`UpstreamError::dropped`) while a resend is left. The proxy's
    /// own want of descriptors is the client's answer at once: no backend would fare better.
    pub fn failed(&mut self, chosen: Chosen, failed: Failed) -> Result<(), ProxyError> {
        let why = failed.reason();
        Tally::new(chosen.pass, None).tell(failed.outcome());
        self.tried.push(chosen.index);
        self.why = Some(why);
        self.last = Some(match failed {
            Failed::Error(e, _) if e.kind == Kind::Local => return Err(e.to_client()),
            Failed::Error(e, _) if e.dropped() && self.resend => {
                self.resend = false;
                self.resent = true;
                Last::Error(e.to_client())
            }
            Failed::Error(e, _) if e.held_by_backend() => return Err(e.to_client()),
            Failed::Error(e, _) => Last::Error(e.to_client()),
            Failed::Answer(answer, _) => {
                Last::Answer(self.order[self.at].clone(), chosen.backend.clone(), answer)
            }
        });
        Ok(())
    }

    /// No replica of the current alias can take the request.
    pub fn refused(&mut self, refusal: Refusal) {
        if let Some((why, e)) = refusal {
            self.why = Some(why);
            self.last = Some(Last::Error(e));
        }
    }

    /// A fallback alias would not admit the request (its guard, say): skip it.
    pub fn not_admitted(&mut self, e: ProxyError) {
        tracing::debug!(error = %e, "fallback alias skipped");
        if self.last.is_none() {
            self.last = Some(Last::Error(e));
        }
    }

    /// On to the next alias; the request's record and the fallback counter follow.
    pub fn next_alias(&mut self, snap: &Snapshot, rec: &mut Record) {
        let from = self.order.get(self.at);
        self.at += 1;
        self.tried.clear();
        if let (Some(from), Some(to)) = (from, self.order.get(self.at)) {
            let why = self.why.unwrap_or(FallbackReason::connect);
            let to_m = snap.metrics(Some(&to.name));
            snap.metrics(Some(&from.name)).fallback(to_m, why);
            tracing::debug!(alias = %from.name, to = %to.name, reason = ?why, "fallback");
            if let Some(t) = rec.traced() {
                t.fallback(&from.name, &to.name, &format!("{why:?}"));
                t.alias(&to.name);
            }
            rec.route(to_m, &to.backend.name);
        }
        self.why = None;
    }

    /// Nothing served: the last failure.
    pub fn give_up(self) -> Last {
        self.last.unwrap_or(Last::Error(ProxyError::NoBackend {
            alias: self
                .order
                .first()
                .map(|a| a.name.clone())
                .unwrap_or_default(),
            why: "no backend left to try",
            retry_after: 1,
        }))
    }
}
