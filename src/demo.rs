//! `switchboard demo`: the proxy in front of one simulated backend per configured backend.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::TcpListener;

use switchboard_proxy::config::{Config, ConfigErrors};
use switchboard_proxy::live::AppState;
use switchboard_sim::{Sim, SimConfig};

/// Why the demo could not start or ended early.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("invalid config {}:\n{errors}", path.display())]
    Config { path: PathBuf, errors: ConfigErrors },
    #[error("cannot start a simulator for {backend}: {error}")]
    Simulator { backend: String, error: io::Error },
    #[error("cannot make {}: {error}", dir.display())]
    Dir { dir: PathBuf, error: io::Error },
    #[error("cannot listen on {addr}: {error}")]
    Listen { addr: SocketAddr, error: io::Error },
    #[error("server error: {0}")]
    Server(io::Error),
}

/// The config at `path` with every backend pointed at a simulator started for it (on a
/// loopback port), and the simulators by backend name. Dropping a simulator stops it.
pub async fn simulated(path: &Path) -> Result<(Config, Vec<(String, Sim)>), DemoError> {
    let invalid = |errors| DemoError::Config {
        path: path.to_path_buf(),
        errors,
    };
    let mut raw = switchboard_proxy::config::load_raw(path).map_err(invalid)?;
    let mut sims = Vec::new();
    for (name, backend) in raw.backends.iter_mut() {
        let model = raw
            .aliases
            .iter()
            .find(|(_, a)| a.backend_names().any(|b| b == name))
            .map(|(alias, a)| a.upstream_model.clone().unwrap_or_else(|| alias.clone()))
            .unwrap_or_else(|| name.clone());
        let slot_ctx = raw
            .aliases
            .values()
            .filter(|a| a.backend_names().any(|b| b == name))
            .filter_map(|a| a.context_window.as_ref()?.number())
            .max()
            .and_then(|w| u32::try_from(w).ok())
            .unwrap_or(32768);
        // `slots = "auto"`: the simulator has 4, and the proxy discovers them.
        let slots = match &backend.slots {
            None => 1,
            Some(s) => s.number().and_then(|n| u32::try_from(n).ok()).unwrap_or(4),
        };
        let takes = |kind: &str| {
            raw.aliases
                .values()
                .filter(|a| a.backend_names().any(|b| b == name))
                .any(|a| {
                    a.inputs
                        .as_ref()
                        .is_some_and(|i| i.iter().any(|k| k == kind))
                })
        };
        let cfg = SimConfig {
            flavor: backend.flavor,
            model,
            slot_ctx,
            slots,
            image: takes("image"),
            audio: takes("audio"),
            reasoning: true,
            reasoning_tokens: 3,
            token_delay: std::time::Duration::from_millis(20),
            ttft: std::time::Duration::from_millis(150),
            ..SimConfig::default()
        };
        let sim = Sim::spawn(cfg)
            .await
            .map_err(|error| DemoError::Simulator {
                backend: name.clone(),
                error,
            })?;
        backend.url = sim.url();
        backend.api_key_env = None;
        backend.ca_file = None;
        sims.push((name.clone(), sim));
    }
    let cfg = switchboard_proxy::config::validate(raw).map_err(invalid)?;
    Ok((cfg, sims))
}

/// Start a simulator for every backend of the config, point the backends at them, and serve
/// the proxy on the configured address until ctrl-c.
pub async fn run(path: &Path) -> Result<(), DemoError> {
    let (mut cfg, sims) = simulated(path).await?;
    // Usage is recorded where the config keeps it, else in a temp dir of the demo's own.
    let own_dir = match cfg.ledger {
        Some(_) => None,
        None => {
            let dir = std::env::temp_dir().join(format!("switchboard-demo-{}", std::process::id()));
            if let Err(error) = std::fs::create_dir_all(&dir) {
                return Err(DemoError::Dir { dir, error });
            }
            let url = switchboard_proxy::config::LedgerUrl::Sqlite(dir.join("usage.db"));
            eprintln!("demo: usage ledger at {}", url.shown());
            cfg.ledger = Some(switchboard_proxy::config::Ledger::at(url));
            Some(dir)
        }
    };
    for (name, sim) in &sims {
        let flavor = cfg.backends.get(name).map_or("", |b| b.flavor.as_str());
        eprintln!("demo: backend {name} ({flavor}) simulated at {}", sim.url());
    }
    let listen = cfg.server.listen;
    let state = AppState::new(cfg, None).map_err(|errors| DemoError::Config {
        path: path.to_path_buf(),
        errors,
    })?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|error| DemoError::Listen {
            addr: listen,
            error,
        })?;
    // The address bound, so a listen port of 0 prints the port the system chose.
    let listen = listener.local_addr().unwrap_or(listen);
    tokio::spawn(switchboard_proxy::live::probes::run(state.clone()));
    switchboard_proxy::http::batches::spawn_runner(&state);
    eprintln!(
        "demo: switchboard listening on http://{listen}  (status page: http://localhost:{port}/, \
         try: curl localhost:{port}/v1/models)",
        port = listen.port()
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let grace = state.live.load().config.server.shutdown_grace;
    switchboard_proxy::http::server::run(listener, state, shutdown, grace, std::future::pending())
        .await
        .map_err(DemoError::Server)?;
    for (_, sim) in sims {
        sim.shutdown().await;
    }
    if let Some(dir) = own_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}
