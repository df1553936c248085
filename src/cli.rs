//! Command-line interface: subcommands and their arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "switchboard",
    version,
    about = "OpenAI-compatible reverse proxy and alias router for a self-hosted LLM fleet"
)]
pub struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SWITCHBOARD_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy.
    Serve {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
    },
    /// Run the proxy with a simulated backend for every backend of the config (no GPU needed).
    Demo {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
    },
    /// Run one simulated backend.
    Simulate(switchboard::sim::cli::SimArgs),
    /// Validate a config and print every error.
    Check {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
    },
    /// Count a chat request's prompt tokens for an alias, as the context guard would.
    Tokens {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
        /// The alias (or old name) whose window and counting method apply.
        #[arg(long)]
        alias: String,
        /// A chat completions request body (JSON); `-` reads standard input.
        request: PathBuf,
    },
    /// Print the alias table with each backend's health.
    Routes {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
    },
}
