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
    Simulate(switchboard_sim::cli::SimArgs),
    /// Validate a config and print every error; with --probe, compare it with what the
    /// backends report (exit code 1 when anything disagrees).
    Check {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
        /// Ask every backend what it serves and report each disagreement with the config.
        #[arg(long)]
        probe: bool,
    },
    /// Print every alias as harness configs take it (models.yml or JSON).
    Export {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = switchboard_proxy::export::Format::ModelsYml)]
        format: switchboard_proxy::export::Format,
        /// Take windows and input kinds from what the backends report.
        #[arg(long)]
        probe: bool,
        /// The proxy's URL as clients reach it (default: server.listen, 0.0.0.0 as 127.0.0.1).
        #[arg(long)]
        base_url: Option<String>,
        /// The provider's name in the harness config.
        #[arg(long, default_value = "switchboard")]
        provider: String,
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
    /// Print usage from the ledger's database (`[ledger]`): totals per group, from the hourly
    /// roll-ups since a time.
    Usage {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
        /// How far back, as a duration (`7d`, `24h`, `90m`): the hours that began since then.
        #[arg(long, default_value = "7d")]
        since: humantime::Duration,
        /// What to group by, comma-separated: client, alias, day, hour (UTC).
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "client,alias"
        )]
        by: Vec<UsageBy>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = switchboard_proxy::ledger::report::Format::Table)]
        format: switchboard_proxy::ledger::report::Format,
    },
    /// Print the alias table with each backend's health.
    Routes {
        #[arg(long, default_value = "routes.toml")]
        config: PathBuf,
    },
}

/// What `usage` groups by.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum UsageBy {
    Client,
    Alias,
    Day,
    Hour,
}

impl UsageBy {
    pub fn dim(self) -> switchboard_proxy::ledger::Dim {
        use switchboard_proxy::ledger::Dim;
        match self {
            UsageBy::Client => Dim::Client,
            UsageBy::Alias => Dim::Alias,
            UsageBy::Day => Dim::Day,
            UsageBy::Hour => Dim::Hour,
        }
    }
}
