//! One generation's hold on a slot, and the count of how it ended.
//!
//! A [`Generation`] is created once a request passed validation. It waits for a slot
//! (FIFO), holds it while tokens flow, and counts itself when it ends: completed, failed
//! on purpose (`fail_after`), or — when dropped before either, because the client went
//! away and the response future or body was dropped — cancelled. The slot frees at once.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::recorder::{Event, Recorder};

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
    ended: bool,
}

impl Generation {
    pub fn new(recorder: Recorder) -> Self {
        Self {
            recorder,
            permit: None,
            ended: false,
        }
    }

    /// Waits for a free slot, first come first served. False if the slots are gone.
    pub async fn acquire(&mut self, slots: &Arc<Semaphore>) -> bool {
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
    pub fn end(&mut self, how: End) {
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
        if self.permit.take().is_some() {
            self.recorder.bump(Event::Stopped);
        }
    }
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
