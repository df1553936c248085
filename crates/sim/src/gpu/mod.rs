//! The simulated GPU: slots that keep a KV cache, which request runs on which slot, and the
//! slot-time it spent busy.
//!
//! llama.cpp (`server-context.cpp`, `get_available_slot`): a request naming `id_slot` runs on
//! that slot (wrapped modulo the slot count, as the real server does) and waits while it is
//! busy; otherwise it takes the idle slot whose cache shares the longest common prefix with
//! its prompt, when that prefix is over a tenth of the prompt (`--slot-prompt-similarity`'s
//! default), else the least recently used idle slot. With no slot for it, it waits; as slots
//! free, waiting requests take them first come, first served by the same rule.
//!
//! vLLM and SGLang share one prefix cache across their slots (automatic prefix caching): a
//! request's cached prefix is its longest common prefix with any sequence processed
//! recently, and it takes any idle slot, first come first served. vLLM caches whole blocks of
//! 16 tokens.
//!
//! What a request says of the cache ([`CacheUse`]): llama.cpp's `"cache_prompt": false`
//! processes the whole prompt whatever its slot holds; vLLM's and SGLang's `cache_salt` meets
//! only prefixes processed under the same salt. The simulated llama.cpp keeps no prompts
//! beyond its slots (as `llama-server --cache-ram 0`).
//!
//! The work itself (prefill in chunks, decode steps) is a [`Lease`]'s.

mod lease;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::config::GpuSim;
use switchboard_sync::Locked;
use switchboard_wire::flavor::Flavor;

pub(crate) use lease::Lease;

/// Recently processed sequences kept for a shared prefix cache.
const RECENT: usize = 64;
/// llama.cpp's default `--slot-prompt-similarity`.
const SIMILARITY: f64 = 0.1;

/// One simulated GPU and its slots.
#[derive(Debug)]
pub(crate) struct Gpu {
    cfg: GpuSim,
    /// vLLM and SGLang: one prefix cache for every slot.
    shared: bool,
    /// The prefix cache's granularity in tokens.
    block: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: Vec<Slot>,
    waiting: VecDeque<Waiter>,
    tick: u64,
    next_waiter: u64,
    /// Slot-time of leases already ended.
    busy_done: Duration,
    /// Shared mode: sequences processed recently with their salt, the most recent last.
    recent: VecDeque<Salted>,
}

/// A processed sequence and the `cache_salt` it was processed under.
type Salted = (Option<Arc<str>>, Arc<[u32]>);

/// What a request says of the prompt cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CacheUse {
    /// llama.cpp's `"cache_prompt": false`: nothing cached is reused.
    pub(crate) off: bool,
    /// vLLM's and SGLang's `cache_salt`: the namespace of the prefixes it meets.
    pub(crate) salt: Option<Arc<str>>,
}

impl CacheUse {
    /// As a request body says it.
    pub(crate) fn of(body: &serde_json::Value) -> CacheUse {
        CacheUse {
            off: body.get("cache_prompt") == Some(&serde_json::Value::Bool(false)),
            salt: body
                .get("cache_salt")
                .and_then(|s| s.as_str())
                .map(Arc::from),
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// The tokens it last processed (while busy: what it started from).
    cache: Vec<u32>,
    /// Tokens in its KV cache right now (kept current while busy).
    n_past: usize,
    busy_since: Option<Instant>,
    last_used: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    pin: Option<usize>,
    prompt: Arc<[u32]>,
    cache: CacheUse,
    tx: oneshot::Sender<Lease>,
}

/// A request waiting for a slot. Dropping it leaves the queue (or frees the slot it was
/// just given).
#[derive(Debug)]
pub(crate) struct Ticket {
    gpu: Arc<Gpu>,
    id: u64,
    rx: oneshot::Receiver<Lease>,
}

/// Where a request starts: on a slot now, or in the queue.
#[derive(Debug)]
pub(crate) enum Start {
    Now(Lease),
    Wait(Ticket),
}

/// One slot as `/sim/gpu` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotView {
    pub(crate) id: usize,
    pub(crate) cached_tokens: usize,
    pub(crate) busy: bool,
}

impl Gpu {
    pub(crate) fn new(cfg: GpuSim, flavor: Flavor, slots: u32) -> Arc<Self> {
        let slots = (0..slots.max(1)).map(|_| Slot::default()).collect();
        Arc::new(Self {
            cfg,
            shared: flavor != Flavor::Llamacpp,
            block: if flavor == Flavor::Vllm { 16 } else { 1 },
            inner: Mutex::new(Inner {
                slots,
                ..Inner::default()
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// The slot a request's `id_slot` names (llama.cpp wraps it; -1 names none; vLLM and
    /// SGLang ignore it).
    pub(crate) fn pin(&self, id_slot: Option<i64>) -> Option<usize> {
        let id = id_slot.filter(|&n| n != -1 && !self.shared)?;
        let n = self.lock().slots.len() as u64;
        // `int % size_t` in C++: the int converted to unsigned first.
        Some(((id as u64) % n) as usize)
    }

    /// Starts `prompt` on a slot, or queues it behind the requests already waiting.
    #[cfg(test)]
    pub(crate) fn start(self: &Arc<Self>, prompt: Arc<[u32]>, pin: Option<usize>) -> Start {
        self.start_with(prompt, pin, CacheUse::default())
    }

    /// [`Gpu::start`] of a request saying `cache` of the prompt cache.
    pub(crate) fn start_with(
        self: &Arc<Self>,
        prompt: Arc<[u32]>,
        pin: Option<usize>,
        cache: CacheUse,
    ) -> Start {
        let mut inner = self.lock();
        if inner
            .waiting
            .iter()
            .all(|w| w.pin.is_some() && w.pin != pin)
        {
            if let Some(slot) = self.choose(&inner, &prompt, pin) {
                return Start::Now(self.assign(&mut inner, slot, prompt, &cache));
            }
        }
        let (tx, rx) = oneshot::channel();
        let id = inner.next_waiter;
        inner.next_waiter += 1;
        inner.waiting.push_back(Waiter {
            id,
            pin,
            prompt,
            cache,
            tx,
        });
        Start::Wait(Ticket {
            gpu: Arc::clone(self),
            id,
            rx,
        })
    }

    /// The idle slot `prompt` would take now, if any.
    fn choose(&self, inner: &Inner, prompt: &[u32], pin: Option<usize>) -> Option<usize> {
        let idle = |i: &usize| inner.slots[*i].busy_since.is_none();
        if let Some(p) = pin {
            return Some(p).filter(idle);
        }
        let lru = (0..inner.slots.len())
            .filter(idle)
            .min_by_key(|&i| inner.slots[i].last_used)?;
        if self.shared {
            return Some(lru);
        }
        let best = (0..inner.slots.len())
            .filter(idle)
            .map(|i| (lcp(&inner.slots[i].cache, prompt), i))
            .filter(|&(n, _)| n as f64 > SIMILARITY * prompt.len() as f64)
            .max_by(|a, b| {
                let by_use = inner.slots[b.1].last_used.cmp(&inner.slots[a.1].last_used);
                a.0.cmp(&b.0).then(by_use)
            });
        Some(best.map_or(lru, |(_, i)| i))
    }

    /// Gives `slot` to `prompt`: its cached prefix is decided here.
    fn assign(
        self: &Arc<Self>,
        inner: &mut Inner,
        slot: usize,
        prompt: Arc<[u32]>,
        cache: &CacheUse,
    ) -> Lease {
        let s = &mut inner.slots[slot];
        let mut seq = std::mem::take(&mut s.cache);
        let limit = if cache.off {
            0
        } else {
            prompt.len().saturating_sub(1)
        };
        let cached = if self.shared {
            let salted = inner.recent.iter().filter(|(salt, _)| *salt == cache.salt);
            let best = salted.map(|(_, r)| lcp(r, &prompt)).max();
            let n = best.unwrap_or(0).min(limit);
            seq.clear();
            seq.extend_from_slice(&prompt[..n - n % self.block]);
            seq.len()
        } else {
            let n = lcp(&seq, &prompt).min(limit);
            seq.truncate(n);
            n
        };
        let s = &mut inner.slots[slot];
        s.n_past = cached;
        s.busy_since = Some(Instant::now());
        Lease::new(
            Arc::clone(self),
            slot,
            seq,
            prompt,
            cached,
            cache.salt.clone(),
        )
    }

    /// A lease ended: its slot keeps what was processed, and waiting requests move up.
    fn release(self: &Arc<Self>, slot: usize, seq: Vec<u32>, salt: Option<Arc<str>>) {
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let s = &mut inner.slots[slot];
        if let Some(since) = s.busy_since.take() {
            let held = since.elapsed();
            inner.busy_done += held;
        }
        let s = &mut inner.slots[slot];
        s.last_used = tick;
        s.n_past = seq.len();
        if self.shared && !seq.is_empty() {
            if inner.recent.len() == RECENT {
                inner.recent.pop_front();
            }
            inner.recent.push_back((salt, seq.as_slice().into()));
        }
        inner.slots[slot].cache = seq;
        self.dispatch(&mut inner);
    }

    /// Hands idle slots to waiting requests, first come first served.
    fn dispatch(self: &Arc<Self>, inner: &mut Inner) {
        let mut i = 0;
        while i < inner.waiting.len() {
            let w = &inner.waiting[i];
            let Some(slot) = self.choose(inner, &w.prompt, w.pin) else {
                i += 1;
                continue;
            };
            let Some(w) = inner.waiting.remove(i) else {
                break;
            };
            let lease = self.assign(inner, slot, w.prompt, &w.cache);
            if let Err(lease) = w.tx.send(lease) {
                // Its request went away meanwhile: the slot is free again.
                lease.forget(inner);
            }
        }
    }

    /// Slot-time spent busy so far (ongoing leases included).
    pub(crate) fn busy(&self) -> Duration {
        let inner = self.lock();
        let now = Instant::now();
        let ongoing = inner
            .slots
            .iter()
            .filter_map(|s| s.busy_since.map(|t| now - t))
            .sum::<Duration>();
        inner.busy_done + ongoing
    }

    /// Every slot: tokens in its cache and whether it is busy.
    pub(crate) fn slots(&self) -> Vec<SlotView> {
        let inner = self.lock();
        let view = |(id, s): (usize, &Slot)| SlotView {
            id,
            cached_tokens: s.n_past,
            busy: s.busy_since.is_some(),
        };
        inner.slots.iter().enumerate().map(view).collect()
    }

    fn progress(&self, slot: usize, n_past: usize) {
        self.lock().slots[slot].n_past = n_past;
    }

    pub(crate) fn cfg(&self) -> &GpuSim {
        &self.cfg
    }
}

impl Ticket {
    /// Waits for a slot.
    pub(crate) async fn wait(mut self) -> Option<Lease> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.gpu.lock();
        if let Some(at) = inner.waiting.iter().position(|w| w.id == self.id) {
            inner.waiting.remove(at);
            // A pinned waiter ahead of others may have blocked them: look again.
            self.gpu.dispatch(&mut inner);
        } else if let Ok(lease) = self.rx.try_recv() {
            lease.forget(&mut inner);
            self.gpu.dispatch(&mut inner);
        }
    }
}

/// The length of the longest common prefix of `a` and `b`.
pub(crate) fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
