//! One generation's hold on a slot, and the count of how it ended.
//!
//! A [`Generation`] is created once a request passed validation. It waits for a slot
//! (FIFO), holds it while tokens flow, and counts itself when it ends: completed, failed
//! on purpose (`fail_after`), or — when dropped before either, because the client went
//! away and the response future or body was dropped — cancelled. The slot frees at once.
//!
//! In GPU mode the slot is a [`Lease`] of the slot model, and the waits before the first
//! event and before each token are its prefill and decode steps instead of fixed delays.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::frame::Counts;
use super::gpu::{Lease, Start};
use super::plan::{GenRequest, Plan};
use super::recorder::{Event, GpuRun, Recorder};
use super::state::Shared;
use super::tokenize;

/// How a generation ended, when it did not end by being dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Completed,
    Failed,
}

#[derive(Debug)]
pub(crate) struct Generation {
    recorder: Recorder,
    permit: Option<OwnedSemaphorePermit>,
    lease: Option<Lease>,
    ended: bool,
}

impl Generation {
    pub(crate) fn new(recorder: Recorder) -> Self {
        Self {
            recorder,
            permit: None,
            lease: None,
            ended: false,
        }
    }

    /// Takes a slot for `req`: in GPU mode the slot model's choice, else the first free one.
    /// `None` when the slots are gone.
    pub(crate) async fn start(sh: &Shared, req: &GenRequest, plan: &Plan) -> Option<Self> {
        let mut gen = Self::new(sh.recorder.clone());
        let started = match (&sh.gpu, &req.prompt) {
            (Some(gpu), Some(prompt)) => {
                let pin = gpu.pin(req.id_slot);
                let lease =
                    match gpu.start_with(prompt.ids.as_slice().into(), pin, req.cache.clone()) {
                        Start::Now(lease) => Some(lease),
                        Start::Wait(ticket) => {
                            let _waiting = Waiting::new(&gen.recorder);
                            ticket.wait().await
                        }
                    };
                lease.map(|mut lease| {
                    lease.set_output(output_ids(&prompt.tail, plan));
                    gen.recorder.gpu_run(GpuRun {
                        id_slot: req.id_slot,
                        slot: lease.slot(),
                        cached: lease.cached(),
                        prompt_n: lease.prompt_n(),
                    });
                    gen.recorder.bump(Event::Started);
                    gen.lease = Some(lease);
                })
            }
            _ => gen.acquire(&sh.slots).await.then_some(()),
        };
        started.map(|()| gen)
    }

    /// Waits before the first event: the prefill in GPU mode, else `ttft`.
    pub(crate) async fn before_first(&mut self, ttft: Duration) {
        match &mut self.lease {
            Some(lease) => lease.prefill().await,
            None => pause(ttft).await,
        }
    }

    /// Waits before generated token `i`: one decode step in GPU mode, else `delay` before
    /// every token but the first.
    pub(crate) async fn before_token(&mut self, i: u32, delay: Duration) {
        match &mut self.lease {
            Some(lease) => lease.decode().await,
            None if i > 0 => pause(delay).await,
            None => {}
        }
    }

    /// GPU mode: runs the whole generation of `plan` (a whole answer). False outside it.
    pub(crate) async fn run_gpu(&mut self, plan: &Plan) -> bool {
        let Some(lease) = &mut self.lease else {
            return false;
        };
        lease.prefill().await;
        for _ in 0..plan.tokens {
            lease.decode().await;
        }
        true
    }

    /// GPU mode: the counts of `plan`, with the model's times and the cached prefix.
    pub(crate) fn gpu_counts(&self, plan: &Plan) -> Option<Counts> {
        let lease = self.lease.as_ref()?;
        let (prompt_ms, predicted_ms) = lease.model_ms(plan.tokens);
        Some(Counts {
            prompt: plan.prompt,
            completion: plan.tokens,
            reasoning: plan.reasoning_tokens(),
            prompt_ms,
            predicted_ms,
            cached: Some(lease.cached()),
        })
    }

    /// Waits for a free slot, first come first served. False if the slots are gone.
    pub(crate) async fn acquire(&mut self, slots: &Arc<Semaphore>) -> bool {
        let permit = match Arc::clone(slots).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let _waiting = Waiting::new(&self.recorder);
                match Arc::clone(slots).acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return false,
                }
            }
        };
        self.permit = Some(permit);
        self.recorder.bump(Event::Started);
        true
    }

    /// Records how the generation ended and frees its slot.
    pub(crate) fn end(&mut self, how: End) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.release();
        self.recorder.bump(match how {
            End::Completed => Event::Completed,
            End::Failed => Event::Failed,
        });
    }

    fn release(&mut self) {
        let permit = self.permit.take().is_some();
        let lease = self.lease.take().is_some();
        if permit || lease {
            self.recorder.bump(Event::Stopped);
        }
    }
}

async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// The ids of `plan`'s tokens as a prompt that goes on after them would tokenize them: the
/// whitespace the prompt ends with starts the first piece.
fn output_ids(tail: &str, plan: &Plan) -> Vec<u32> {
    let mut text = tail.to_owned();
    for i in 0..plan.tokens {
        plan.write_token(i, &mut text);
    }
    tokenize::ids(&text, true)
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.ended {
            self.release();
            self.recorder.bump(Event::Cancelled);
        }
    }
}

/// Counts a generation as queued while it lives.
struct Waiting<'a>(&'a Recorder);

impl<'a> Waiting<'a> {
    fn new(recorder: &'a Recorder) -> Self {
        recorder.bump(Event::Queued);
        Self(recorder)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.bump(Event::Dequeued);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropped_generation_counts_as_cancelled_and_frees_its_slot() {
        let rec = Recorder::default();
        let slots = Arc::new(Semaphore::new(1));
        let mut gen = Generation::new(rec.clone());
        assert!(gen.acquire(&slots).await);
        assert_eq!(slots.available_permits(), 0);
        assert_eq!(rec.running(), 1);
        drop(gen);
        assert_eq!(slots.available_permits(), 1);
        assert_eq!((rec.cancelled(), rec.completed(), rec.running()), (1, 0, 0));
    }

    #[tokio::test]
    async fn ended_generation_counts_once() {
        let rec = Recorder::default();
        let slots = Arc::new(Semaphore::new(1));
        let mut gen = Generation::new(rec.clone());
        assert!(gen.acquire(&slots).await);
        gen.end(End::Completed);
        gen.end(End::Failed);
        drop(gen);
        assert_eq!((rec.cancelled(), rec.completed(), rec.failed()), (0, 1, 0));
    }
}
