//! Which dialect the simulator speaks for each backend flavour.

use super::frame::Dialect;
use super::{llamacpp, sglang, vllm};
use switchboard_wire::flavor::Flavor;

/// The dialect of `flavor`'s backend.
pub(crate) fn dialect(flavor: Flavor) -> &'static dyn Dialect {
    match flavor {
        Flavor::Llamacpp => &llamacpp::LlamaCpp,
        Flavor::Vllm => &vllm::Vllm { openai: false },
        Flavor::Openai => &vllm::Vllm { openai: true },
        Flavor::Sglang => &sglang::Sglang,
    }
}
