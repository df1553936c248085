//! State shared by every connection of one simulated backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{watch, Semaphore};

use super::config::SimConfig;
use super::gpu::Gpu;
use super::recorder::Recorder;
use switchboard_sync::Locked;
use switchboard_wire::flavor::Flavor;

/// Pieces remembered for `/detokenize`; later pieces are not remembered.
const VOCAB_LIMIT: usize = 1 << 16;

/// One simulated backend's configuration, counters and synchronisation.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) cfg: SimConfig,
    pub(crate) recorder: Recorder,
    pub(crate) slots: Arc<Semaphore>,
    /// GPU mode's slots and KV caches (they replace `slots` for generations).
    pub(crate) gpu: Option<Arc<Gpu>>,
    /// `true` once [`super::Sim::release`] opened the gate (always `true` without a gate).
    pub(crate) gate: watch::Sender<bool>,
    /// When the simulated model finishes loading; `None` when it never loads.
    pub(crate) ready_at: Option<Instant>,
    /// Unix seconds at start, echoed as `created`.
    pub(crate) created: u64,
    /// The model name as a JSON string literal, quotes included.
    pub(crate) model_json: String,
    pub(crate) stats: Stats,
    /// The status every generation request is answered with; 0 = answer normally.
    pub(crate) fail_status: std::sync::atomic::AtomicU16,
    ids: AtomicU64,
    vocab: Mutex<HashMap<u32, Box<str>>>,
}

/// Totals reported by `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) predicted_tokens: AtomicU64,
    pub(crate) requests: AtomicU64,
}

impl Shared {
    pub(crate) fn new(cfg: SimConfig) -> Arc<Self> {
        let now = Instant::now();
        let ready_at = (!cfg.loading.is_zero()).then(|| now + cfg.loading);
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let created = since_epoch.as_secs();
        let model_json = serde_json::Value::from(cfg.model.as_str()).to_string();
        let (gate, _) = watch::channel(!cfg.gate);
        let slots = Arc::new(Semaphore::new(cfg.slots.max(1) as usize));
        let gpu = cfg.gpu.map(|g| Gpu::new(g, cfg.flavor, cfg.slots));
        Arc::new(Self {
            recorder: Recorder::default(),
            slots,
            gpu,
            gate,
            ready_at,
            created,
            model_json,
            stats: Stats::default(),
            fail_status: std::sync::atomic::AtomicU16::new(cfg.fail_status.unwrap_or(0)),
            ids: AtomicU64::new(since_epoch.as_nanos() as u64),
            vocab: Mutex::new(HashMap::new()),
            cfg,
        })
    }

    pub(crate) fn flavor(&self) -> Flavor {
        self.cfg.flavor
    }

    /// Whether the simulated model is still loading.
    pub(crate) fn loading(&self) -> bool {
        self.ready_at.is_some_and(|t| Instant::now() < t)
    }

    /// A fresh 32-hex-digit identifier.
    pub(crate) fn next_id(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:016x}", mix(n), mix(n ^ 0x9e37_79b9_7f4a_7c15))
    }

    /// Remembers token pieces so `/detokenize` can give them back.
    pub(crate) fn learn(&self, id: u32, piece: &str) {
        let mut vocab = self.vocab.locked();
        if vocab.len() < VOCAB_LIMIT {
            vocab.entry(id).or_insert_with(|| piece.into());
        }
    }

    /// The text of remembered token ids (unknown ids give nothing).
    pub(crate) fn detokenize(&self, ids: &[u32]) -> String {
        let vocab = self.vocab.locked();
        let mut out = String::new();
        for id in ids {
            if let Some((piece, _)) = super::tokenize::SPECIALS.iter().find(|(_, s)| s == id) {
                out.push_str(piece);
            } else if let Some(piece) = vocab.get(id) {
                out.push_str(piece);
            }
        }
        out
    }
}

/// SplitMix64 finaliser: spreads a counter into random-looking bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
