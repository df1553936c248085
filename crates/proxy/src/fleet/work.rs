//! One request's work on the backend it was sent to, in GPU-seconds: predicted before it runs
//! (its uncached prompt over the backend's prefill rate at that depth, its expected output
//! over the decode rate, [`super::cost`]), measured when it ends (the backend's `timings`, else
//! the proxy's own clock), and the measure given back: to the backend's cost model, to the
//! fair order of its slots, to what its client's answers recently took.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// foldhash: keyed by client ids the proxy gives (no untrusted keys).
use foldhash::HashMap;

use super::cost::{CostModel, Observed, Work};
use super::reported::{believed, Bounds};
use super::slots::Slots;
use super::ticket::Ticket;
use super::timeline::{Bar, Lost};
use crate::lock::Locked;
use crate::wire::usage::Usage;

/// What the request asks of a backend: its prompt's tokens (the guard's count, else an
/// estimate), its output limit, if it sets one, for each of its choices, and the context
/// window it was guarded against, where known.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Need {
    pub(crate) prompt: u64,
    pub(crate) output: Option<u32>,
    pub(crate) choices: u32,
    pub(crate) window: Option<u32>,
}

/// Output expected of a request that sets no limit, from a client with no answers yet.
const UNLIMITED_OUTPUT: u64 = 1_024;
/// Answers per client whose lengths are kept.
const RECENT: usize = 8;

/// How long each client's recent answers were (the longest of its last few caps what its
/// next one is expected to take).
#[derive(Debug, Default)]
pub(crate) struct Outputs {
    by_client: Mutex<HashMap<u64, Vec<u64>>>,
}

impl Outputs {
    /// The longest of `client`'s recent answers.
    fn recent(&self, client: u64) -> Option<u64> {
        let all = self.by_client.locked();
        all.get(&client).and_then(|v| v.iter().copied().max())
    }

    fn note(&self, client: u64, tokens: u64) {
        let mut all = self.by_client.locked();
        let v = all.entry(client).or_default();
        if v.len() >= RECENT {
            v.remove(0);
        }
        v.push(tokens);
    }
}

/// What a request is predicted to take of a replica.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Estimate {
    /// Prompt tokens the replica is known to hold for its conversation.
    pub(crate) cached: u64,
    /// Output tokens expected: its limit, capped by its client's recent answers.
    pub(crate) output: u64,
    pub(crate) predicted: Work,
}

/// The work of a request needing `need`, of `ticket`'s client and conversation, on the
/// replica of `slots` and `cost`: its uncached prompt over the prefill rate at that depth,
/// its expected output over the decode rate.
pub(crate) fn estimate(
    (slots, cost): (&Slots, &CostModel),
    outputs: &Outputs,
    ticket: &Ticket,
    need: Need,
) -> Estimate {
    let cached = cached(slots, ticket, need.prompt);
    let asked = need.output.map(u64::from);
    let recent = outputs.recent(ticket.client);
    let output = match (asked, recent) {
        (Some(a), Some(r)) => a.min(r.max(1)),
        (Some(a), None) => a.min(UNLIMITED_OUTPUT),
        (None, Some(r)) => r.max(1),
        (None, None) => UNLIMITED_OUTPUT,
    };
    Estimate {
        cached,
        output,
        predicted: cost.predict(cached, need.prompt - cached, output),
    }
}

/// The work of a request of `ticket`'s conversation with a prompt of `prompt` tokens on the
/// replica of `slots` and `cost`, were it to write `output` tokens: what a budget reserves for
/// it, with `output` the most it may write (never capped by its client's recent answers, as
/// [`estimate`]'s expected output is).
pub(crate) fn at_most(
    (slots, cost): (&Slots, &CostModel),
    ticket: &Ticket,
    prompt: u64,
    output: u64,
) -> Work {
    let cached = cached(slots, ticket, prompt);
    cost.predict(cached, prompt - cached, output)
}

/// The prompt tokens of `ticket`'s conversation the replica of `slots` is known to hold, of a
/// prompt of `prompt` tokens (one at least is read).
fn cached(slots: &Slots, ticket: &Ticket, prompt: u64) -> u64 {
    let held = ticket.conversation.map_or(0, |k| slots.cached_for(k));
    held.min(prompt.saturating_sub(1))
}

/// A request's work on one replica: predicted when it is queued there; settled once, when
/// it ends (measured), is preempted, or fails (the time it held the slot).
#[derive(Debug)]
pub(crate) struct Job {
    slots: Arc<Slots>,
    cost: Arc<CostModel>,
    outputs: Arc<Outputs>,
    client: u64,
    conversation: Option<u64>,
    /// Prompt tokens the replica is known to hold for the conversation.
    pub(crate) cached: u64,
    pub(crate) prompt: u64,
    /// Output tokens expected.
    pub(crate) output: u64,
    pub(crate) predicted: Work,
    /// What it asked, which bounds what its backend may report of it.
    need: Need,
    /// When it got its slot, and which (set once granted).
    granted: Option<(Instant, usize)>,
    settled: bool,
    /// How it lost its slot, and whose it was (told as it gives the slot up unanswered).
    loss: Option<Loss>,
}

/// A request that gives its slot up before it answered, as its timeline mark names it.
#[derive(Debug)]
pub(crate) struct Loss {
    pub(crate) how: Lost,
    pub(crate) client: Option<Arc<String>>,
    pub(crate) alias: Arc<String>,
}

/// What a request took, and what was predicted of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub work: Work,
    pub predicted: Work,
    /// The backend's own timings (else the proxy's clock).
    pub reported: bool,
}

/// The proxy's own times of an exchange.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    pub(crate) sent: Option<Instant>,
    pub(crate) first_token: Option<Instant>,
    pub(crate) last_token: Option<Instant>,
    pub(crate) ended: Instant,
}

impl Job {
    /// The work of a request needing `need`, of `ticket`'s client and conversation, on the
    /// replica of `slots` and `cost`.
    pub(crate) fn predict(
        (slots, cost): (&Arc<Slots>, &Arc<CostModel>),
        outputs: &Arc<Outputs>,
        ticket: &Ticket,
        need: Need,
    ) -> Job {
        let Estimate {
            cached,
            output,
            predicted,
        } = estimate((slots, cost), outputs, ticket, need);
        Job {
            slots: Arc::clone(slots),
            cost: Arc::clone(cost),
            outputs: Arc::clone(outputs),
            client: ticket.client,
            conversation: ticket.conversation,
            cached,
            prompt: need.prompt,
            output,
            predicted,
            need,
            granted: None,
            settled: false,
            loss: None,
        }
    }

    /// `ticket` carrying this work.
    pub(crate) fn ticket(&self, ticket: Ticket) -> Ticket {
        Ticket {
            work: self.predicted.total(),
            prefill: self.predicted.prefill,
            tokens: self.prompt + self.output,
            ..ticket
        }
    }

    /// How long it has held its slot.
    pub(crate) fn held(&self) -> Duration {
        self.granted.map(|(t, _)| t.elapsed()).unwrap_or_default()
    }

    /// It got slot `index` now.
    pub(crate) fn granted(&mut self, index: u32) {
        self.granted = Some((Instant::now(), index as usize));
    }

    /// It ended with `usage` (its backend's report) at the times of `clock`: `usage` held to
    /// what the request could have taken ([`super::reported`]; what every count after this
    /// one reads), then what it took, learned from and charged to its client's share.
    pub(crate) fn finish(mut self, usage: &mut Option<Usage>, clock: &Clock) -> Measured {
        let wall = clock
            .sent
            .map_or(Duration::ZERO, |s| clock.ended.saturating_duration_since(s));
        let need = &self.need;
        let bounds = Bounds::of(
            need.window,
            (need.output, need.choices),
            (self.slots.slots(), wall),
        );
        *usage = usage.map(|u| believed(u, &bounds));
        let usage = usage.as_ref();
        let observed = observe(usage, clock, self.cached, self.prompt, self.predicted);
        let reported = usage.and_then(|u| u.timings).is_some();
        // Learned only from a backend's timings or a stream's own (a whole answer's time
        // cannot be split between its phases).
        if reported || clock.first_token.is_some() {
            self.cost.learn(&observed);
        }
        if let Some(u) = usage {
            self.outputs.note(self.client, u.completion);
        }
        let work = observed.seconds();
        let left = self
            .granted
            .map(|(_, slot)| slot)
            .zip(self.conversation)
            .zip(usage.map(|u| u.prompt + u.completion))
            .map(|((slot, key), tokens)| (slot, key, tokens));
        self.slots
            .settle(self.client, self.predicted.total(), work.total(), left);
        self.settled = true;
        Measured {
            work,
            predicted: self.predicted,
            reported,
        }
    }
}

impl Job {
    /// The slot it was granted, and when.
    pub(crate) fn grant(&self) -> Option<(u32, Instant)> {
        self.granted.map(|(t, slot)| (slot as u32, t))
    }

    /// The slots of its backend.
    pub(crate) fn slots(&self) -> &Arc<Slots> {
        &self.slots
    }

    /// It gives its slot up unanswered, as `loss` says (its timeline mark names them).
    pub(crate) fn lose(mut self, loss: Loss) {
        self.loss = Some(loss);
    }
}

impl Drop for Job {
    /// Preempted or failed: its client is charged the time it held the slot, and the
    /// timeline marks it.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let held = self.granted.map_or(0.0, |(t, _)| t.elapsed().as_secs_f64());
        self.slots
            .settle(self.client, self.predicted.total(), held, None);
        if let Some((start, slot)) = self.granted {
            let loss = self.loss.take();
            self.slots.timeline.push(Bar {
                slot: slot as u32,
                start,
                first: None,
                end: Instant::now(),
                lost: Some(loss.as_ref().map_or(Lost::Failed, |l| l.how)),
                alias: loss
                    .as_ref()
                    .map_or_else(|| Arc::new("-".into()), |l| Arc::clone(&l.alias)),
                client: loss.and_then(|l| l.client),
                status: 0,
                error: false,
                prompt: 0,
                output: 0,
                gpu_s: held,
                requests: 1,
            });
        }
    }
}

/// What the request took: its backend's timings where it sent them, else its usage over the
/// proxy's clock (time to first token the prefill, first to last token the decode; a whole
/// answer's time split as predicted).
fn observe(
    usage: Option<&Usage>,
    clock: &Clock,
    cached: u64,
    prompt: u64,
    predicted: Work,
) -> Observed {
    if let Some(t) = usage.and_then(|u| u.timings) {
        return Observed {
            cached: t.cache_n.unwrap_or(0),
            prompt: t.prompt_n.unwrap_or(0),
            prompt_s: t.prompt_ms.map(|ms| ms / 1000.0),
            generated: t.predicted_n.unwrap_or(0),
            generated_s: t.predicted_ms.map(|ms| ms / 1000.0),
        };
    }
    let reported_cached = usage.and_then(|u| u.cached);
    let cached = reported_cached.unwrap_or(cached);
    let prompt = usage.map_or(prompt, |u| u.prompt);
    let generated = usage.map_or(0, |u| u.completion);
    let secs = |a: Option<Instant>, b: Option<Instant>| {
        Some(b?.saturating_duration_since(a?).as_secs_f64())
    };
    let (prompt_s, generated_s) = match clock.first_token {
        Some(_) => (
            secs(clock.sent, clock.first_token),
            secs(clock.first_token, clock.last_token),
        ),
        None => {
            let total = secs(clock.sent, Some(clock.ended)).unwrap_or(0.0);
            let share = predicted.prefill / predicted.total().max(f64::MIN_POSITIVE);
            (Some(total * share), Some(total * (1.0 - share)))
        }
    };
    Observed {
        cached,
        prompt: prompt.saturating_sub(cached),
        prompt_s,
        generated,
        generated_s,
    }
}
