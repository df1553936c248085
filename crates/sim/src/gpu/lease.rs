//! One request's hold on a simulated GPU slot: the prefill in chunks, the decode steps, and
//! what the slot keeps when it ends (completed or dropped midway).
//!
//! Times follow the model exactly: each step sleeps until the model's clock, measured from
//! the lease's start, says it is done, so timer slack never accumulates, and the times an
//! answer reports are the model's (the same on a loaded machine or tokio's paused clock).

use std::sync::Arc;

use tokio::time::Instant;

use super::{Gpu, Inner};

/// A slot held by one request. Dropping it frees the slot; the slot keeps the prompt as far
/// as it was prefilled and the tokens decoded.
#[derive(Debug)]
pub(crate) struct Lease {
    gpu: Arc<Gpu>,
    slot: usize,
    /// The slot's KV cache: the cached prefix, then what this request processed.
    seq: Vec<u32>,
    prompt: Arc<[u32]>,
    cached: usize,
    /// The generated tokens' ids, as the next prompt would render them.
    output: Vec<u32>,
    /// The token sampled last, evaluated by the next decode step.
    pending: Option<u32>,
    decoded: u32,
    start: Instant,
    /// Seconds of modelled work done since `start`.
    clock: f64,
    /// Set once the slot was handed back another way (see [`Lease::forget`]).
    gone: bool,
    /// The `cache_salt` its prefixes are kept under (shared prefix caches).
    salt: Option<Arc<str>>,
}

impl Lease {
    pub(super) fn new(
        gpu: Arc<Gpu>,
        slot: usize,
        seq: Vec<u32>,
        prompt: Arc<[u32]>,
        cached: usize,
        salt: Option<Arc<str>>,
    ) -> Self {
        Self {
            gpu,
            slot,
            seq,
            prompt,
            cached,
            output: Vec::new(),
            pending: None,
            decoded: 0,
            start: Instant::now(),
            clock: 0.0,
            gone: false,
            salt,
        }
    }

    /// The slot it runs on.
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// Prompt tokens found in the cache.
    pub(crate) fn cached(&self) -> u32 {
        u32::try_from(self.cached).unwrap_or(u32::MAX)
    }

    /// Prompt tokens to evaluate.
    pub(crate) fn prompt_n(&self) -> u32 {
        u32::try_from(self.prompt.len() - self.cached).unwrap_or(u32::MAX)
    }

    /// The ids of the tokens it will generate (later tokens get made-up ids).
    pub(crate) fn set_output(&mut self, ids: Vec<u32>) {
        self.output = ids;
    }

    /// The modelled milliseconds of the prefill and of `n` decode steps.
    pub(crate) fn model_ms(&self, n: u32) -> (f64, f64) {
        let cfg = self.gpu.cfg();
        let (mut depth, mut prefill) = (self.cached, 0.0);
        let batch = cfg.batch.max(1) as usize;
        while depth < self.prompt.len() {
            let chunk = batch.min(self.prompt.len() - depth);
            prefill += cfg.prefill_secs(depth, chunk);
            depth += chunk;
        }
        let mut decode = 0.0;
        for i in 0..n as usize {
            // Step i evaluates the token sampled before it (none before the first).
            decode += cfg.decode_secs(depth + i.saturating_sub(1));
        }
        (prefill * 1000.0, decode * 1000.0)
    }

    /// Evaluates the prompt past the cached prefix, `batch` tokens per step; after each step
    /// the slot holds the prompt as far as it went.
    pub(crate) async fn prefill(&mut self) {
        let cfg = *self.gpu.cfg();
        let batch = cfg.batch.max(1) as usize;
        while self.seq.len() < self.prompt.len() {
            let depth = self.seq.len();
            let chunk = batch.min(self.prompt.len() - depth);
            self.step(cfg.prefill_secs(depth, chunk)).await;
            self.seq
                .extend_from_slice(&self.prompt[depth..depth + chunk]);
            self.gpu.progress(self.slot, self.seq.len());
        }
    }

    /// One decode step: it evaluates the token sampled last (into the cache) and samples
    /// the next. A generation of `n` tokens takes `n` steps and leaves `n - 1` of them in the
    /// cache, as llama.cpp does (the last one is never evaluated).
    pub(crate) async fn decode(&mut self) {
        let cfg = *self.gpu.cfg();
        self.step(cfg.decode_secs(self.seq.len())).await;
        if let Some(t) = self.pending.take() {
            self.seq.push(t);
            self.gpu.progress(self.slot, self.seq.len());
        }
        let n = self.decoded;
        let made_up = 0x4000_0000 | (n & 0xffff);
        self.pending = Some(self.output.get(n as usize).copied().unwrap_or(made_up));
        self.decoded += 1;
    }

    async fn step(&mut self, secs: f64) {
        self.clock += secs;
        let due = self.start + std::time::Duration::from_secs_f64(self.clock);
        tokio::time::sleep_until(due).await;
    }

    /// Hands the slot back under a lock already held (a lease nobody will run).
    pub(super) fn forget(mut self, inner: &mut Inner) {
        self.gone = true;
        let s = &mut inner.slots[self.slot];
        s.busy_since = None;
        s.n_past = self.seq.len();
        s.cache = std::mem::take(&mut self.seq);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.gone {
            let seq = std::mem::take(&mut self.seq);
            self.gpu.release(self.slot, seq, self.salt.take());
        }
    }
}
