//! A request's hold on a backend slot: which slot, whether it may still be preempted, whose
//! cache it may use; dropping it frees the slot.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::Inner;
use crate::shared::lease::Lease;

/// Held while a request occupies a backend slot; dropping it frees the slot (to the next
/// waiting request, if any).
#[derive(Debug)]
pub struct SlotPermit {
    pub(super) inner: Option<Arc<Inner>>,
    /// Which slot, and the grant that gave it.
    pub(super) index: u32,
    pub(super) grant: u64,
    /// Told when a request of a better class takes the slot (the request may be preempted
    /// until it sends its client a byte).
    pub(super) preempt: Option<oneshot::Receiver<()>>,
    /// The backend's shared lease, given back with the slot.
    pub(super) lease: Option<Lease>,
    /// The request may use the slot's cache ([`super::Isolation::warm`]).
    pub(super) warm: bool,
    /// The request runs on a slot its backend picks ([`SlotPermit::unplaced`]).
    pub(super) unplaced: bool,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        // The shared lease first, so that its release is on its way before the slot goes
        // to a request that will ask for it.
        drop(self.lease.take());
        if let Some(inner) = self.inner.take() {
            if self.unplaced {
                inner.lock().table.forget_groups();
            }
            inner.release(self.index as usize, self.grant);
        }
    }
}

impl SlotPermit {
    /// The slot's number (llama.cpp's `id_slot`).
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Whether the request may use what the slot's cache holds: its own cache group's
    /// prefixes, or anyone's where caches are not isolated.
    pub(crate) fn warm(&self) -> bool {
        self.warm
    }

    /// The request is sent without its slot's number: its backend runs it on a slot of its
    /// own choice, which may be any idle one. Until it ends, and once more when it ends, no
    /// slot's cache is known to be one cache group's.
    pub(crate) fn unplaced(&mut self) {
        self.unplaced = true;
        if let Some(inner) = &self.inner {
            inner.lock().table.forget_groups();
        }
    }

    /// Whether the request may still be preempted.
    pub(crate) fn preemptible(&self) -> bool {
        self.preempt.is_some()
    }

    /// Resolves when the slot is to be given up to a better class (never, for a request that
    /// may not be preempted).
    pub(crate) async fn preempted(&mut self) {
        match &mut self.preempt {
            Some(rx) => {
                if rx.await.is_err() {
                    // The scheduler let the request off: it keeps its slot.
                    self.preempt = None;
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// The request sends its client its first byte: it is preempted no more. `false` when it
    /// was told to give its slot up first.
    pub(crate) fn started(&mut self) -> bool {
        let Some(mut rx) = self.preempt.take() else {
            return true;
        };
        if let Some(inner) = &self.inner {
            let mut st = inner.lock();
            if let Some(h) = st.table.slots[self.index as usize].holder.as_mut() {
                if h.grant == self.grant {
                    h.preempt = None;
                }
            }
        }
        rx.try_recv().is_err()
    }
}
