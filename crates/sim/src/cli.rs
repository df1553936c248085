//! Command-line arguments of a simulated backend (`switchboard simulate`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::config::{GpuSim, SimConfig};
use switchboard_wire::flavor::Flavor;

/// Options of one simulated backend.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Wire dialect to speak.
    #[arg(long, value_enum, default_value_t = Flavor::Llamacpp)]
    pub flavor: Flavor,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub(crate) port: u16,
    /// Address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub(crate) host: IpAddr,
    /// Served model name.
    #[arg(long, default_value = "sim-model")]
    pub(crate) model: String,
    /// Per-slot context window in tokens.
    #[arg(long, default_value_t = 4096)]
    pub(crate) slot_ctx: u32,
    /// Concurrent generations; more requests queue.
    #[arg(long, default_value_t = 4)]
    pub(crate) slots: u32,
    /// Report that the model takes images.
    #[arg(long)]
    pub(crate) image: bool,
    /// Report that the model takes audio.
    #[arg(long)]
    pub(crate) audio: bool,
    /// Delay before the first token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) ttft_ms: u64,
    /// Delay between tokens, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) token_delay_ms: u64,
    /// Generate reasoning text before the answer.
    #[arg(long)]
    pub(crate) reasoning: bool,
    /// Put reasoning inline in content as <think>…</think>.
    #[arg(long)]
    pub(crate) think_tags: bool,
    /// Behave as if loading the model for this long after start, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) loading_ms: u64,
    /// Abort each stream's connection after this many events.
    #[arg(long)]
    pub(crate) fail_after: Option<u32>,
    /// Tokens generated when a request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub(crate) completion_tokens: u32,
    /// Reasoning tokens generated when reasoning is on.
    #[arg(long, default_value_t = 8)]
    pub(crate) reasoning_tokens: u32,
    /// Write stream events with a space after every `,` and `:`, as Python's json.dumps does.
    #[arg(long)]
    pub(crate) spaced_json: bool,
    /// Close the connection after every streamed answer while announcing keep-alive, as
    /// llama-server does (at the next request on it).
    #[arg(long)]
    pub(crate) close_after_stream: bool,
    /// GPU mode: prompt tokens per second at depth 0 (slots keep a KV cache; the delays
    /// above are then unused).
    #[arg(long)]
    pub(crate) gpu_prefill_tps: Option<f64>,
    /// GPU mode: generated tokens per second at depth 0.
    #[arg(long, default_value_t = 40.0)]
    pub(crate) gpu_decode_tps: f64,
    /// GPU mode: depth at which prefill runs at half speed (0: never slows).
    #[arg(long, default_value_t = 0)]
    pub(crate) gpu_prefill_half_depth: u32,
    /// GPU mode: depth at which decode runs at half speed (0: never slows).
    #[arg(long, default_value_t = 0)]
    pub(crate) gpu_decode_half_depth: u32,
    /// GPU mode: prompt tokens evaluated per step.
    #[arg(long, default_value_t = 512)]
    pub(crate) gpu_batch: u32,
}

impl SimArgs {
    pub fn config(&self) -> SimConfig {
        SimConfig {
            flavor: self.flavor,
            model: self.model.clone(),
            slot_ctx: self.slot_ctx,
            slots: self.slots,
            image: self.image,
            audio: self.audio,
            ttft: Duration::from_millis(self.ttft_ms),
            token_delay: Duration::from_millis(self.token_delay_ms),
            reasoning: self.reasoning,
            think_tags_in_content: self.think_tags,
            loading: Duration::from_millis(self.loading_ms),
            fail_after: self.fail_after,
            completion_tokens: self.completion_tokens,
            reasoning_tokens: self.reasoning_tokens,
            spaced_json: self.spaced_json,
            close_after_stream: self.close_after_stream,
            gpu: self.gpu_prefill_tps.map(|prefill_tps| GpuSim {
                prefill_tps,
                decode_tps: self.gpu_decode_tps,
                prefill_half_depth: self.gpu_prefill_half_depth,
                decode_half_depth: self.gpu_decode_half_depth,
                batch: self.gpu_batch.max(1),
            }),
            ..SimConfig::default()
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.host, self.port)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn defaults_match_sim_config_defaults() {
        let cli = Cli::parse_from(["sim"]);
        let cfg = cli.sim.config();
        let def = SimConfig::default();
        assert_eq!(
            (cfg.flavor, cfg.slot_ctx, cfg.slots),
            (def.flavor, def.slot_ctx, def.slots)
        );
        assert_eq!(cfg.model, def.model);
        assert_eq!(cli.sim.addr().to_string(), "127.0.0.1:0");
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::parse_from([
            "sim",
            "--flavor",
            "sglang",
            "--port",
            "7001",
            "--ttft-ms",
            "5",
            "--reasoning",
            "--think-tags",
            "--fail-after",
            "3",
            "--spaced-json",
            "--slot-ctx",
            "1000",
            "--slots",
            "3",
            "--image",
        ]);
        let cfg = cli.sim.config();
        assert_eq!(cfg.flavor, Flavor::Sglang);
        assert_eq!(cfg.ttft, Duration::from_millis(5));
        assert!(cfg.reasoning && cfg.think_tags_in_content);
        assert_eq!(cfg.fail_after, Some(3));
        assert!(cfg.spaced_json);
        assert_eq!(
            (cfg.slot_ctx, cfg.slots, cfg.image, cfg.audio),
            (1000, 3, true, false)
        );
        assert_eq!(cli.sim.addr().port(), 7001);
        assert_eq!(cfg.gpu, None);
    }

    #[test]
    fn gpu_mode_is_on_with_a_prefill_rate() {
        let cli = Cli::parse_from([
            "sim",
            "--gpu-prefill-tps",
            "4000",
            "--gpu-decode-tps",
            "40",
            "--gpu-prefill-half-depth",
            "100000",
            "--gpu-batch",
            "256",
        ]);
        let gpu = cli.sim.config().gpu.expect("gpu mode");
        assert_eq!(
            gpu,
            GpuSim {
                prefill_tps: 4000.0,
                decode_tps: 40.0,
                prefill_half_depth: 100_000,
                decode_half_depth: 0,
                batch: 256,
            }
        );
    }
}
