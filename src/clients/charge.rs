//! A client's request admitted against its limits: a place among its requests in flight and
//! its tokens reserved (prompt and `max_tokens`), settled from the usage when it ends.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::limiter::{Refusal, Which};
use super::Caller;
use crate::error::ProxyError;
use crate::observe::metrics::RefusalReason;
use crate::observe::record::Settle;
use crate::wire::usage::Usage;

/// Held (in the request's record) from admission to the end of the answer.
#[derive(Debug)]
pub struct Charge {
    caller: Caller,
    reserved: u64,
    prompt: u64,
    /// The most it may be charged when its tokens count (its prompt and output reserved).
    most: Option<u64>,
    /// Its place among the client's requests in flight in the shared store, if any.
    _place: Option<crate::shared::lease::Lease>,
}

impl Charge {
    /// Admit a request of `caller` whose prompt is `prompt` tokens and which asks room for
    /// `output` more: its place in flight, then one request and the tokens of its limits.
    pub async fn admit(caller: &Caller, prompt: u64, output: u64) -> Result<Charge, ProxyError> {
        let state = &caller.state;
        let spec = &caller.spec;
        let n = state.inflight.fetch_add(1, Ordering::AcqRel);
        let mut charge = Charge {
            caller: caller.clone(),
            reserved: 0,
            prompt,
            most: spec.counts_tokens().then_some(prompt + output),
            _place: None,
        };
        state.metrics.inflight.inc();
        if let Some(max) = spec.max_concurrent {
            match state.limiter.enter(max.get(), n).await {
                Ok(place) => charge._place = place,
                Err(()) => {
                    state.metrics.refused(RefusalReason::concurrency);
                    return Err(ProxyError::RateLimited {
                        client: spec.name.clone(),
                        detail: format!("{max} requests in flight, the most this client may have"),
                        quota: false,
                        retry_after: Some(1),
                    });
                }
            }
        }
        let cost = prompt + output;
        match state.limiter.reserve(cost, Instant::now()).await {
            Ok(_) => {
                charge.reserved = cost;
                Ok(charge)
            }
            Err(r) => {
                let reason = match r.which {
                    Which::Day => RefusalReason::quota,
                    _ => RefusalReason::rate_limit,
                };
                state.metrics.refused(reason);
                Err(refusal(&spec.name, r))
            }
        }
    }
}

/// The 429 of a refusal, saying which limit and whether waiting helps.
fn refusal(client: &str, r: Refusal) -> ProxyError {
    let what = match r.which {
        Which::Requests => "requests per minute",
        Which::Tokens => "tokens per minute",
        Which::Day => "tokens per day",
    };
    let detail = match r.retry_after {
        None => format!(
            "the request needs {} tokens, more than the limit of {} {what}: it can never fit, do not retry it",
            r.needed, r.limit
        ),
        Some(s) => format!("limit of {} {what} reached, retry in {s}s", r.limit),
    };
    ProxyError::RateLimited {
        client: client.to_string(),
        detail,
        quota: r.which == Which::Day,
        retry_after: r.retry_after,
    }
}

impl Settle for Charge {
    /// What it used: nothing when it never went to a backend (refused by a full queue, its
    /// wait run out, cancelled while it waited: the request still counts as one); else the
    /// usage reported, else (a stream cut short, an answer without usage) its prompt and the
    /// tokens seen generated. A usage is believed up to what the request could cost: its
    /// prompt and output reserved, or its prompt and the tokens relayed, whichever is more.
    fn settle(&mut self, usage: Option<Usage>, generated: u64, sent: bool) {
        let seen = self.prompt + generated;
        let used = match usage {
            _ if !sent => 0,
            Some(u) => {
                let reported = u.prompt.saturating_add(u.completion);
                self.most
                    .map_or(reported, |most| reported.min(most.max(seen)))
            }
            None => seen,
        };
        let m = &self.caller.state.metrics;
        if let Some(u) = usage {
            m.prompt_tokens.inc_by(u.prompt);
            m.completion_tokens.inc_by(u.completion);
        }
        let now = Instant::now();
        self.caller.state.limiter.settle(self.reserved, used, now);
        self.caller.state.recent.add(now, used);
        self.reserved = 0;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let state = &self.caller.state;
        state.inflight.fetch_sub(1, Ordering::AcqRel);
        state.metrics.inflight.dec();
    }
}
