//! The simulator's knobs: which dialect it speaks, its window, slots and input kinds (as it
//! reports them in each flavour's own discovery endpoints), and its pace.

use std::time::Duration;

use switchboard_wire::flavor::Flavor;

/// How a simulated backend behaves. Build with struct update syntax over [`Default`].
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Wire dialect spoken (shapes, errors, extra endpoints).
    pub flavor: Flavor,
    /// Served model name: what `/v1/models` lists and responses echo.
    pub model: String,
    /// Per-slot context window in tokens (`n_ctx` for llama.cpp, `max_model_len` otherwise).
    pub slot_ctx: u32,
    /// Concurrent generations; further requests queue FIFO until a slot frees. Reported as
    /// llama.cpp's `total_slots` and SGLang's `max_running_requests`.
    pub slots: u32,
    /// The model takes images: llama.cpp `/props` `modalities.vision`, SGLang `/model_info`
    /// `has_image_understanding`.
    pub image: bool,
    /// The model takes audio (`modalities.audio`, `has_audio_understanding`).
    pub audio: bool,
    /// Delay before the first generated event, or before a non-stream answer.
    pub ttft: Duration,
    /// Delay between generated tokens.
    pub token_delay: Duration,
    /// Generate reasoning text before the answer.
    pub reasoning: bool,
    /// Put reasoning inline in `content` as `<think>…</think>` (a backend without a parser).
    pub think_tags_in_content: bool,
    /// Time after start during which the backend behaves as if loading its model.
    pub loading: Duration,
    /// Abort the connection after this many SSE events (no `[DONE]`, no clean chunked end).
    pub fail_after: Option<u32>,
    /// Tokens generated when the request sets no `max_tokens`/`max_completion_tokens`.
    pub completion_tokens: u32,
    /// Reasoning tokens generated when reasoning is on (they count toward the budget).
    pub reasoning_tokens: u32,
    /// Streams send their first event, then wait for [`super::Sim::release`].
    pub gate: bool,
    /// Streams stop after this many events and hold the connection open, sending nothing more.
    pub stall_after: Option<u32>,
    /// Answer every generation request with this status (and an error body) before any byte
    /// of an answer; changed at run time with [`super::Sim::fail_with`].
    pub fail_status: Option<u16>,
    /// Write stream events as Python's `json.dumps` does, a space after every `,` and `:`
    /// (`"usage": {…}`), as any OpenAI-compatible server may.
    pub spaced_json: bool,
    /// Close the connection after every streamed answer while announcing keep-alive
    /// (`Keep-Alive: timeout=5, max=100`, no `Connection: close`), as llama.cpp's
    /// `llama-server` does. The close is made at the worst moment of the real server's timing:
    /// the connection is kept open until the next request arrives on it, then closed without
    /// reading it or answering.
    pub close_after_stream: bool,
    /// Behave like a GPU-backed server: slots keep a KV cache, prompts are prefilled and
    /// tokens decoded at these rates (`ttft` and `token_delay` are then unused). `None`: the
    /// fixed delays above.
    pub gpu: Option<GpuSim>,
}

/// The pace of a simulated GPU. A rate at depth `d` (tokens already in the slot) is
/// `tps / (1 + d / half_depth)`, or `tps` when `half_depth` is 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSim {
    /// Prompt tokens per second at depth 0.
    pub prefill_tps: f64,
    /// Generated tokens per second at depth 0.
    pub decode_tps: f64,
    /// Depth at which prefill runs at half speed (0: it never slows).
    pub prefill_half_depth: u32,
    /// Depth at which decode runs at half speed (0: it never slows).
    pub decode_half_depth: u32,
    /// Prompt tokens evaluated per step (llama.cpp's `--batch-size`).
    pub batch: u32,
}

impl Default for GpuSim {
    fn default() -> Self {
        Self {
            prefill_tps: 4000.0,
            decode_tps: 40.0,
            prefill_half_depth: 0,
            decode_half_depth: 0,
            batch: 512,
        }
    }
}

impl GpuSim {
    /// Seconds to prefill `n` tokens on top of `depth` cached ones, in one step.
    pub(crate) fn prefill_secs(&self, depth: usize, n: usize) -> f64 {
        n as f64 / rate(self.prefill_tps, self.prefill_half_depth, depth)
    }

    /// Seconds of one decode step at `depth`.
    pub(crate) fn decode_secs(&self, depth: usize) -> f64 {
        1.0 / rate(self.decode_tps, self.decode_half_depth, depth)
    }
}

fn rate(tps: f64, half_depth: u32, depth: usize) -> f64 {
    let tps = tps.max(1e-9);
    if half_depth == 0 {
        tps
    } else {
        tps / (1.0 + depth as f64 / f64::from(half_depth))
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            flavor: Flavor::Llamacpp,
            model: "sim-model".to_owned(),
            slot_ctx: 4096,
            slots: 4,
            image: false,
            audio: false,
            ttft: Duration::ZERO,
            token_delay: Duration::ZERO,
            reasoning: false,
            think_tags_in_content: false,
            loading: Duration::ZERO,
            fail_after: None,
            completion_tokens: 16,
            reasoning_tokens: 8,
            gate: false,
            stall_after: None,
            fail_status: None,
            spaced_json: false,
            close_after_stream: false,
            gpu: None,
        }
    }
}
