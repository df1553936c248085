//! Backend dialects: which wire flavour a backend speaks and what follows from it.

use serde::Deserialize;

/// The wire dialect of a backend (see WIRE.md in the design notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// llama.cpp `llama-server`.
    Llamacpp,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// SGLang's OpenAI-compatible server.
    Sglang,
    /// Any other OpenAI-compatible server.
    Openai,
}

impl Flavor {
    /// The name used in config files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::Llamacpp => "llamacpp",
            Flavor::Vllm => "vllm",
            Flavor::Sglang => "sglang",
            Flavor::Openai => "openai",
        }
    }
}

impl std::fmt::Display for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
