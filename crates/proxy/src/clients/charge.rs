//! A client's request admitted against its limits: a place among its requests in flight (not
//! for a batch's line, which `[batches]` bounds), its tokens reserved (prompt and `max_tokens`)
//! and its GPU time (as predicted) in its budgets of the day and month and its limits of a
//! minute, settled from the usage and the work measured when it ends.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::limiter::{Refusal, Which};
use super::Caller;
use crate::budget::{Amounts, Refused};
use crate::config::{Limit, Resource, Window};
use crate::error::ProxyError;
use crate::observe::metrics::RefusalReason;
use crate::observe::record::{Charged, Settle};
use crate::wire::usage::Usage;

/// Held (in the request's record) from admission to the end of the answer.
#[derive(Debug)]
pub(crate) struct Charge {
    caller: Caller,
    reserved: u64,
    prompt: u64,
    /// The most it may be charged when its tokens count (its prompt and output reserved).
    most: Option<u64>,
    /// GPU-milliseconds reserved.
    gpu: u64,
    /// What was reserved in its budgets of the day and month.
    budgeted: Option<Amounts>,
    /// Its place among the client's requests in flight in the shared store, if any.
    _place: Option<crate::shared::lease::Lease>,
    /// Whether it is counted among the client's requests in flight (a batch's line is not).
    live: bool,
}

impl Charge {
    /// Admit a request of `caller` whose prompt is `prompt` tokens, which asks room for
    /// `output` more and is predicted at `gpu` GPU-milliseconds: its place in flight (when it is
    /// `live`, the client's own; a batch's line is not, its client's `max_concurrent` is for its
    /// people), then one request and the tokens of its limits, then its GPU time.
    pub(crate) async fn admit(
        caller: &Caller,
        prompt: u64,
        output: u64,
        gpu: u64,
        live: bool,
    ) -> Result<Charge, ProxyError> {
        let state = &caller.state;
        let spec = &caller.spec;
        let mut charge = Charge {
            caller: caller.clone(),
            reserved: 0,
            prompt,
            most: spec.counts_tokens().then_some(prompt + output),
            gpu: 0,
            budgeted: None,
            _place: None,
            live,
        };
        if live {
            let n = state.inflight.fetch_add(1, Ordering::AcqRel);
            state.metrics.inflight.inc();
            if let Some(max) = spec.max_concurrent {
                charge.enter(max.get(), n).await?;
            }
        }
        let cost = prompt + output;
        let gpu = if spec.counts_gpu() { gpu } else { 0 };
        if spec.counts_days() {
            if !state.budgets.known() {
                // Refused, not guessed: its budgets would count from zero.
                return Err(ProxyError::LedgerUnavailable {
                    detail: format!(
                        "what client {} spent of its budgets of a day and a month is not read yet",
                        spec.name
                    ),
                });
            }
            let want = amounts(cost, output, gpu);
            state.budgets.reserve(&want).map_err(|r| {
                state.metrics.refused(RefusalReason::quota);
                over_budget(&spec.name, r)
            })?;
            charge.budgeted = Some(want);
        }
        let refused = |r: Refusal, gpu: bool| {
            state.metrics.refused(RefusalReason::rate_limit);
            refusal(&spec.name, r, gpu)
        };
        let minute = state.limiter.reserve(cost, Instant::now()).await;
        if let Err(r) = minute {
            charge.undo();
            return Err(refused(r, false));
        }
        charge.reserved = cost;
        if spec.counts_gpu() {
            let minute = state.gpu.reserve(gpu, Instant::now()).await;
            if let Err(r) = minute {
                charge.undo();
                return Err(refused(r, true));
            }
            charge.gpu = gpu;
        }
        Ok(charge)
    }

    /// A place among at most `max` requests of the client in flight, `here` of them in this
    /// process already; a 429 when none is free.
    async fn enter(&mut self, max: u32, here: u32) -> Result<(), ProxyError> {
        let state = &self.caller.state;
        match state.limiter.enter(max, here).await {
            Ok(place) => {
                self._place = place;
                Ok(())
            }
            Err(()) => {
                state.metrics.refused(RefusalReason::concurrency);
                Err(ProxyError::RateLimited {
                    client: self.caller.spec.name.clone(),
                    detail: format!("{max} requests in flight, the most this client may have"),
                    quota: false,
                    retry_after: Some(1),
                })
            }
        }
    }

    /// Gives back what was reserved: the request was refused after all.
    fn undo(&mut self) {
        let state = &self.caller.state;
        if let Some(b) = self.budgeted.take() {
            state.budgets.settle(&b, &Amounts::default());
        }
        if self.reserved > 0 {
            state.limiter.settle(self.reserved, 0, Instant::now());
            self.reserved = 0;
        }
    }
}

/// One request of `tokens` tokens (`output` of them output) and `gpu_ms` GPU-milliseconds, as
/// its budgets count it.
fn amounts(tokens: u64, output: u64, gpu_ms: u64) -> Amounts {
    Amounts {
        requests: 1.0,
        tokens: tokens as f64,
        output_tokens: output as f64,
        gpu_ms: gpu_ms as f64,
    }
}

/// The 429 of a budget of the day or month that is spent (`insufficient_quota`).
fn over_budget(client: &str, r: Refused) -> ProxyError {
    let over = Over {
        kind: r.kind,
        needed: r.needed,
        limit: r.limit,
        retry_after: r.retry_after,
    };
    let period = r.kind.window.word();
    over.error(client, "budget", true, |s| {
        format!("spent; it resets at the start of the next {period}, in {s}s")
    })
}

/// The 429 of a refusal of a minute's limit, saying which and whether waiting helps; `gpu`: of
/// the GPU budget.
fn refusal(client: &str, r: Refusal, gpu: bool) -> ProxyError {
    let resource = match (r.which, gpu) {
        (Which::Requests, _) => Resource::Requests,
        (Which::Tokens, false) => Resource::Tokens,
        (Which::Tokens, true) => Resource::Gpu,
    };
    let over = Over {
        kind: Limit::new(resource, Window::Minute),
        needed: r.needed,
        limit: r.limit,
        retry_after: r.retry_after,
    };
    over.error(client, "limit", false, |s| {
        format!("reached, retry in {s}s")
    })
}

/// A request over a limit or budget of `kind`: its amounts (GPU time counted in milliseconds,
/// told in seconds).
struct Over {
    kind: Limit,
    needed: u64,
    limit: u64,
    retry_after: Option<u64>,
}

impl Over {
    /// The 429 that says so, of a `noun` (limit, budget; a `quota` or not); `wait` tells what
    /// waiting its seconds does, where it helps.
    fn error(
        &self,
        client: &str,
        noun: &str,
        quota: bool,
        wait: impl Fn(u64) -> String,
    ) -> ProxyError {
        let resource = self.kind.resource;
        let amount = |n: u64| match resource.millis() {
            true => format!("{:.3}", n as f64 / 1000.0),
            false => n.to_string(),
        };
        let (needed, limit, what) = (amount(self.needed), amount(self.limit), self.kind.words());
        let unit = resource.unit();
        let detail = match self.retry_after {
            None => format!(
                "the request needs {needed} {unit}, more than the {noun} of {limit} {what}: it can never fit, do not retry it"
            ),
            Some(s) => format!("{noun} of {limit} {what} {}", wait(s)),
        };
        ProxyError::RateLimited {
            client: client.to_string(),
            detail,
            quota,
            retry_after: self.retry_after,
        }
    }
}

impl Settle for Charge {
    /// What it used: nothing when it never went to a backend (refused by a full queue, its
    /// wait run out, cancelled while it waited: the request still counts as one); else the
    /// usage reported, else (a stream cut short, an answer without usage) its prompt and the
    /// tokens seen generated. A usage is believed up to what the request could cost: its
    /// prompt and output reserved, or its prompt and the tokens relayed, whichever is more
    /// (a backend's usage past that is no client's debt). Its GPU time: measured, else
    /// (no answer came) nothing when it never went to a backend, else what was reserved.
    fn settle(
        &mut self,
        usage: Option<Usage>,
        generated: u64,
        sent: bool,
        gpu: Option<u64>,
    ) -> Charged {
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
        let state = &self.caller.state;
        state.limiter.settle(self.reserved, used, now);
        self.reserved = 0;
        let gpu_used = gpu.unwrap_or(if sent { self.gpu } else { 0 });
        state.recent.add(now, used, gpu_used);
        if let Some(b) = self.budgeted.take() {
            let output = match usage {
                _ if !sent => 0,
                Some(u) => u.completion.min(used),
                None => generated.min(used),
            };
            state.budgets.settle(&b, &amounts(used, output, gpu_used));
        }
        if self.gpu > 0 {
            state.gpu.settle(self.gpu, gpu_used, now);
            self.gpu = 0;
        }
        Charged {
            tokens: used,
            gpu_ms: gpu_used,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let state = &self.caller.state;
        state.inflight.fetch_sub(1, Ordering::AcqRel);
        state.metrics.inflight.dec();
    }
}
