//! A backend's speeds as configured, before its answers are measured: the seeds of its cost
//! model ([`crate::fleet::cost`]).

/// A backend's rates before it is measured: its config's seeds, or the defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Seed {
    /// Prompt tokens per second read at depth 0.
    pub(crate) prefill_tps: f64,
    /// The depth at which prefill runs at half that rate (`None`: it does not slow).
    pub(crate) prefill_half_depth: Option<f64>,
    /// Tokens per second generated at depth 0.
    pub(crate) decode_tps: f64,
    /// The depth at which decode runs at half that rate.
    pub(crate) decode_half_depth: Option<f64>,
}

impl Default for Seed {
    /// A consumer GPU's middle: 1,500 prompt tokens/s halving at 128k, 40 tokens/s
    /// generated halving at 256k.
    fn default() -> Self {
        Seed {
            prefill_tps: 1_500.0,
            prefill_half_depth: Some(131_072.0),
            decode_tps: 40.0,
            decode_half_depth: Some(262_144.0),
        }
    }
}
