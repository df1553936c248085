//! A client's request admitted against its limits: a place among its requests in flight, its
//! tokens reserved (prompt and `max_tokens`) and its GPU time (as predicted), settled from the
//! usage and the work measured when it ends.

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
    /// GPU-milliseconds reserved.
    gpu: u64,
    /// Its place among the client's requests in flight in the shared store, if any.
    _place: Option<crate::shared::lease::Lease>,
}

impl Charge {
    /// Admit a request of `caller` whose prompt is `prompt` tokens, which asks room for
    /// `output` more and is predicted at `gpu` GPU-milliseconds: its place in flight, then one
    /// request and the tokens of its limits, then its GPU time.
    pub async fn admit(
        caller: &Caller,
        prompt: u64,
        output: u64,
        gpu: u64,
    ) -> Result<Charge, ProxyError> {
        let state = &caller.state;
        let spec = &caller.spec;
        let n = state.inflight.fetch_add(1, Ordering::AcqRel);
        let mut charge = Charge {
            caller: caller.clone(),
            reserved: 0,
            prompt,
            most: spec.counts_tokens().then_some(prompt + output),
            gpu: 0,
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
        let refused = |r: Refusal, gpu: bool| {
            let reason = match r.which {
                Which::Day => RefusalReason::quota,
                _ => RefusalReason::rate_limit,
            };
            state.metrics.refused(reason);
            refusal(&spec.name, r, gpu)
        };
        state
            .limiter
            .reserve(cost, Instant::now())
            .await
            .map_err(|r| refused(r, false))?;
        charge.reserved = cost;
        if spec.counts_gpu() {
            state
                .gpu
                .reserve(gpu, Instant::now())
                .await
                .map_err(|r| refused(r, true))?;
            charge.gpu = gpu;
        }
        Ok(charge)
    }
}

/// The 429 of a refusal, saying which limit and whether waiting helps; `gpu`: of the GPU
/// budgets (counted in milliseconds, told in seconds).
fn refusal(client: &str, r: Refusal, gpu: bool) -> ProxyError {
    let what = match (r.which, gpu) {
        (Which::Requests, _) => "requests per minute",
        (Which::Tokens, false) => "tokens per minute",
        (Which::Day, false) => "tokens per day",
        (Which::Tokens, true) => "GPU-seconds per minute",
        (Which::Day, true) => "GPU-seconds per day",
    };
    let amount = |n: u64| match gpu {
        true => format!("{:.3}", n as f64 / 1000.0),
        false => n.to_string(),
    };
    let (needed, limit) = (amount(r.needed), amount(r.limit));
    let unit = if gpu { "GPU-seconds" } else { "tokens" };
    let detail = match r.retry_after {
        None => format!(
            "the request needs {needed} {unit}, more than the limit of {limit} {what}: it can never fit, do not retry it"
        ),
        Some(s) => format!("limit of {limit} {what} reached, retry in {s}s"),
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
    fn settle(&mut self, usage: Option<Usage>, generated: u64, sent: bool, gpu: Option<u64>) {
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
        if self.gpu > 0 {
            // Measured, else (no answer came) nothing when it never went to a backend, else
            // what was reserved.
            let used = gpu.unwrap_or(if sent { self.gpu } else { 0 });
            self.caller.state.gpu.settle(self.gpu, used, now);
            self.gpu = 0;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let state = &self.caller.state;
        state.inflight.fetch_sub(1, Ordering::AcqRel);
        state.metrics.inflight.dec();
    }
}
