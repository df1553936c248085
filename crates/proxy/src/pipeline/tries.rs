//! Where a request may still go: the alias and its fallbacks in order, the replicas of the
//! current one already tried, and the last failure — the client's answer when nothing serves.
//!
//! A failed attempt is answered with what comes next, as a value ([`Next`]): another replica
//! of the alias, the next alias, nothing left (the last failure is the client's answer), or the
//! client's error at once. What a failure allows is one pure decision ([`verdict`]) over where
//! it failed, how, whether the request may have reached the backend and whether a resend is
//! left; its tests are a table of those.

use std::borrow::Cow;
use std::sync::Arc;

use super::call::Incoming;
use super::choose::Refusal;
use super::respond::Served;
use super::send::Failed;
use crate::error::ProxyError;
use crate::fleet::conversation::{conversation_key, Conversation, ConversationId};
use crate::fleet::routes::FallbackReason;
use crate::live::alias::LiveAlias;
use crate::live::Snapshot;
use crate::observe::record::Record;
use crate::upstream::exchange::Answer;
use crate::upstream::failure::{Kind, UpstreamError};
use crate::wire::request::History;
use crate::wire::Adapter;

/// What the client gets when no alias could serve the request.
pub(crate) enum Last {
    Error(ProxyError),
    /// A 5xx answer of a replica, nothing sent of it yet, with what it is for.
    Answer(Served, Answer),
}

/// What a failure allows, whatever is left to try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The request goes on to another replica or alias.
    GoOn,
    /// It goes on, once: the backend hung up on a request it took, and a resend is left.
    Resend,
    /// Its error is the client's answer now: the request may be running on the backend, or
    /// the proxy itself is out of descriptors (no backend would fare better).
    Stop,
}

/// What a failure allows: `error` is the failed exchange (`None`: a 5xx answer, read whole),
/// `resend_left` whether this request may still be sent on after a hang-up.
pub(crate) fn verdict(error: Option<&UpstreamError>, resend_left: bool) -> Verdict {
    let Some(e) = error else {
        return Verdict::GoOn;
    };
    if e.kind == Kind::Local {
        Verdict::Stop
    } else if e.dropped() && resend_left {
        Verdict::Resend
    } else if e.held_by_backend() {
        Verdict::Stop
    } else {
        Verdict::GoOn
    }
}

/// What a request does after a failed attempt.
#[derive(Debug)]
pub(crate) enum Next {
    /// Another replica of the current alias (one is left untried).
    Replica,
    /// The next alias of its order (every replica of this one was tried).
    Alias,
    /// Nothing is left: the last failure is the client's answer ([`Tries::give_up`]).
    GiveUp,
    /// This error is the client's answer now.
    Stop(ProxyError),
}

/// The request's way through its aliases and their replicas.
pub(crate) struct Tries<'s> {
    /// The alias and the fallbacks its client may use (a fallback it may not use is absent).
    order: Cow<'s, [Arc<LiveAlias>]>,
    at: usize,
    /// Replicas of the current alias (by their place in its `replicas`) tried already.
    pub(crate) tried: Vec<usize>,
    /// Why the current alias did not serve (the fallback's reason label).
    why: Option<FallbackReason>,
    last: Option<Last>,
    /// A request a backend dropped unanswered may go on once more (`server.resend_unanswered`,
    /// or by default for the APIs whose adapter says so); spent by the first such resend, so a
    /// request that makes backends hang up on it reaches two of them at most.
    resend: bool,
    /// The resend was spent: the attempts from now on carry a request sent before.
    pub(crate) resent: bool,
}

impl<'s> Tries<'s> {
    pub(crate) fn new(snap: &'s Snapshot, alias: &LiveAlias, req: &Incoming) -> Tries<'s> {
        let order = match req.caller.as_ref().filter(|c| c.spec.aliases.is_some()) {
            Some(c) => snap.routes.order_for(alias, &|a| c.may_use(a)),
            None => Cow::Borrowed(snap.routes.order(alias)),
        };
        let resend = snap
            .config
            .server
            .resend_unanswered
            .unwrap_or_else(|| req.adapter.spec().resent_by_default);
        Tries {
            order,
            at: 0,
            tried: Vec::new(),
            why: None,
            last: None,
            resend,
            resent: false,
        }
    }

    /// The request's conversation matters on its way: some alias has replicas (it keeps to its
    /// own), or slots are scheduled by work (its slot and cached prefix).
    pub(crate) fn keys_conversation(&self, by_work: bool) -> bool {
        by_work || self.order.iter().any(|a| a.replicas.len() > 1)
    }

    /// The request's conversation, keyed for the alias asked for; `id`: the id the request
    /// carries, read once.
    pub(crate) fn conversation(
        &self,
        req: &Incoming,
        history: &History,
        id: Option<&ConversationId>,
    ) -> Option<Conversation> {
        let first = self.order.first()?;
        let client = req.caller.as_ref().map_or(0, |c| c.owner_id());
        conversation_key(first.name(), client, id, &req.body, history)
    }

    /// The alias to try now, `None` once none is left.
    pub(crate) fn alias(&self) -> Option<&Arc<LiveAlias>> {
        self.order.get(self.at)
    }

    /// The current alias is one of the fallbacks (not the alias asked for).
    pub(crate) fn on_fallback(&self) -> bool {
        self.at > 0
    }

    /// No other attempt can follow this one: one alias with one replica.
    pub(crate) fn only_one(&self) -> bool {
        self.order.len() == 1 && self.order[0].replicas.len() == 1
    }

    /// The attempt at replica `index` of the current alias failed before any byte reached
    /// the client (`translated`: its request was translated to chat for this API): what comes
    /// next, by the failure's [`verdict`] and what is left to try.
    pub(crate) fn failed(
        &mut self,
        index: usize,
        translated: Option<&'static dyn Adapter>,
        failed: Failed,
    ) -> Next {
        self.tried.push(index);
        self.why = Some(failed.reason());
        let verdict = verdict(failed.error(), self.resend);
        self.last = Some(match failed {
            Failed::Error(e, _) if verdict == Verdict::Stop => return Next::Stop(e.to_client()),
            Failed::Error(e, _) => Last::Error(e.to_client()),
            Failed::Answer(answer, _) => {
                let alias = Arc::clone(&self.order[self.at]);
                let served = Served::unsettled(alias, index).translated(translated);
                Last::Answer(served, answer)
            }
        });
        if verdict == Verdict::Resend {
            self.resend = false;
            self.resent = true;
        }
        self.next()
    }

    /// Where a request goes on to: an untried replica, else the next alias, else nowhere.
    fn next(&self) -> Next {
        let alias = &self.order[self.at];
        if self.tried.len() < alias.replicas.len() {
            Next::Replica
        } else if self.at + 1 < self.order.len() {
            Next::Alias
        } else {
            Next::GiveUp
        }
    }

    /// No replica of the current alias can take the request.
    pub(crate) fn refused(&mut self, refusal: Refusal) {
        if let Some((why, e)) = refusal {
            self.why = Some(why);
            self.last = Some(Last::Error(e));
        }
    }

    /// A fallback alias would not admit the request (its guard, say): skip it.
    pub(crate) fn not_admitted(&mut self, e: ProxyError) {
        tracing::debug!(error = %e, "fallback alias skipped");
        if self.last.is_none() {
            self.last = Some(Last::Error(e));
        }
    }

    /// On to the next alias; the request's record and the fallback counter follow.
    pub(crate) fn next_alias(&mut self, rec: &mut Record) {
        let from = self.order.get(self.at);
        self.at += 1;
        self.tried.clear();
        if let (Some(from), Some(to)) = (from, self.order.get(self.at)) {
            let why = self.why.unwrap_or(FallbackReason::connect);
            from.metrics.fallback(&to.metrics, why);
            tracing::debug!(alias = %from.name(), to = %to.name(), reason = ?why, "fallback");
            if let Some(t) = rec.traced() {
                t.fallback(from.name(), to.name(), &format!("{why:?}"));
                t.alias(to.name());
            }
            rec.route(&to.metrics, to.spec.backend.name.as_str());
            rec.fell_back = true;
        }
        self.why = None;
    }

    /// Nothing served: the last failure.
    pub(crate) fn give_up(self) -> Last {
        self.last.unwrap_or(Last::Error(ProxyError::NoBackend {
            alias: self
                .order
                .first()
                .map(|a| a.name().to_string())
                .unwrap_or_default(),
            why: "no backend left to try",
            retry_after: 1,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::upstream::failure::{Limit, Stage};

    fn failure(stage: Stage, kind: Kind, reached: bool) -> UpstreamError {
        UpstreamError {
            backend: "b".into(),
            stage,
            kind,
            reached,
            detail: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    use Kind::{Broken, Local, Malformed, TimedOut, Tls, Unreachable};
    use Stage::{Body, Connect, Head, Write};
    use Verdict::{GoOn, Resend, Stop};

    /// Every failure an exchange can give ([`UpstreamError::unanswered`] and
    /// [`UpstreamError::body`] make no others), whether it may have reached the backend, and
    /// what it allows with a resend left and without one.
    const TABLE: &[(Stage, Kind, bool, Verdict, Verdict)] = &[
        // Nothing of the request reached the backend: on to the next.
        (Connect, Unreachable, false, GoOn, GoOn),
        (Connect, Tls, false, GoOn, GoOn),
        (Connect, TimedOut(Limit::Connect), false, GoOn, GoOn),
        (Connect, TimedOut(Limit::FirstByte), false, GoOn, GoOn),
        // The proxy's own want of descriptors: no backend would fare better.
        (Connect, Local, false, Stop, Stop),
        // A write that failed before the kernel took a byte: never reached.
        (Write, Broken, false, GoOn, GoOn),
        (Head, Broken, false, GoOn, GoOn),
        (Head, Malformed, false, GoOn, GoOn),
        // The backend took the request and hung up: sent on once, where allowed.
        (Write, Broken, true, Resend, Stop),
        (Head, Broken, true, Resend, Stop),
        // It took the request and answered badly or not in time: it may be running there.
        (Head, Malformed, true, Stop, Stop),
        (Head, TimedOut(Limit::FirstByte), true, Stop, Stop),
        // A 5xx whose body broke off: its head was an answer; the next may serve.
        (Body, Broken, true, GoOn, GoOn),
        (Body, Malformed, true, GoOn, GoOn),
        (Body, TimedOut(Limit::Idle), true, GoOn, GoOn),
        (Body, TimedOut(Limit::Total), true, GoOn, GoOn),
    ];

    #[test]
    fn a_failure_allows_what_its_stage_kind_reach_and_resend_say() {
        for &(stage, kind, reached, with_resend, without) in TABLE {
            let e = failure(stage, kind, reached);
            let row = format!("{stage:?} {kind:?} reached={reached}");
            assert_eq!(verdict(Some(&e), true), with_resend, "{row}, resend left");
            assert_eq!(verdict(Some(&e), false), without, "{row}, no resend left");
        }
    }

    #[test]
    fn the_table_has_every_failure_an_exchange_can_give() {
        use crate::upstream::{FramingError, SendError};
        let x = || String::from("x");
        let sends = || {
            [
                SendError::Connect(x()),
                SendError::ConnectTimeout,
                SendError::Unsent(x()),
                SendError::Tls(x()),
                SendError::Local(x()),
                SendError::Write(x()),
                SendError::Head(x()),
                SendError::Malformed(FramingError::ChunkSize),
                SendError::Timeout,
            ]
        };
        let listed = |e: &UpstreamError| {
            TABLE
                .iter()
                .any(|r| (r.0, r.1, r.2) == (e.stage, e.kind, e.reached))
        };
        for reached in [false, true] {
            for s in sends() {
                let e = UpstreamError::unanswered("b", s, reached, Duration::ZERO);
                assert!(listed(&e), "{:?} {:?} {}", e.stage, e.kind, e.reached);
            }
        }
    }

    #[test]
    fn a_5xx_answer_goes_on_whatever_is_left() {
        assert_eq!(verdict(None, true), GoOn);
        assert_eq!(verdict(None, false), GoOn);
    }
}
