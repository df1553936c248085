//! What a command fails with: one error, printed after `switchboard: ` with exit code 2.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use switchboard_proxy::config::ConfigErrors;
use switchboard_proxy::http::workers::ServeError;
use switchboard_proxy::tokens::bound::ViewError;
use switchboard_proxy::tokens::CountError;
use switchboard_wire::error::ProxyError;

use switchboard::demo::DemoError;

/// Why a command failed, in the words it is printed with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The config at `path` (when there is one to name) was refused.
    #[error("invalid config{}:\n{errors}", shown(path))]
    Config {
        path: Option<PathBuf>,
        errors: ConfigErrors,
    },
    /// `what`: what the address is for, after it (` for metrics`), or nothing.
    #[error("cannot listen on {addr}{what}: {error}")]
    Listen {
        addr: SocketAddr,
        what: &'static str,
        error: io::Error,
    },
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Demo(#[from] DemoError),
    #[error("simulator error: {0}")]
    Simulator(io::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{}: {error}", path.display())]
    Read { path: PathBuf, error: io::Error },
    #[error("unknown alias {alias:?}; known: {known}")]
    UnknownAlias { alias: String, known: String },
    #[error("alias {0} has no context_window: nothing to count against")]
    NoWindow(String),
    #[error("{0}")]
    Request(#[from] ProxyError),
    #[error("invalid request: {0:?}")]
    View(ViewError),
    #[error("{0}")]
    Count(#[from] CountError),
    #[error("no [ledger] in the config: usage is not recorded")]
    NoLedger,
    #[error("{0}")]
    Ledger(Box<dyn std::error::Error + Send + Sync>),
}

/// ` path`, or nothing without one.
fn shown(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}
