//! The `switchboard` binary: parse the CLI, set up logging, run a subcommand, map errors to exit code 2.

mod alloc;
mod cli;
mod failure;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio::net::TcpListener;

use cli::{Cli, Command, LogFormat};
use failure::Failure;
use switchboard_proxy::config::{self, Config};
use switchboard_proxy::live::AppState;

/// mimalloc rather than glibc's malloc: the request path allocates and frees a few dozen small
/// buffers per request, which take glibc 6 % more instructions per whole answer and 3.5 % more
/// per stream (docs/PERFORMANCE.md, "The allocator"). Built without transparent huge pages (`no_thp`), which would add
/// some 10 MB of resident memory to an idle proxy.
#[global_allocator]
static GLOBAL: alloc::MiMalloc = alloc::MiMalloc;

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// Resolves on the first SIGTERM or ctrl-c; the returned second future on the next one.
fn shutdown_signals() -> (
    impl std::future::Future<Output = ()> + Send + 'static,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let (second_tx, second_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        wait_signal().await;
        tracing::info!("shutting down: no new connections, letting requests in flight finish");
        let _ = first_tx.send(());
        wait_signal().await;
        let _ = second_tx.send(());
    });
    (
        async move {
            let _ = first_rx.await;
        },
        async move {
            let _ = second_rx.await;
        },
    )
}

async fn wait_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Spawn health probing, reload and the workers; serve until signalled.
async fn serve(cfg: Config, path: Option<std::path::PathBuf>) -> Result<(), Failure> {
    use switchboard_proxy::http::workers::{self, Stop};
    let listen = cfg.server.listen;
    let grace = cfg.server.shutdown_grace;
    let n = cfg.server.workers;
    let metrics_listen = cfg.server.metrics_listen;
    // Each client connection takes a descriptor and its backend connection another: the soft
    // limit (often 1024) is raised to the hard one, as far as the system lets it.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(descriptors = n, "file descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the file descriptor limit"),
    }
    let state = new_state(cfg, path)?;
    if let Some(addr) = metrics_listen {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|error| Failure::Listen {
                addr,
                what: " for metrics",
                error,
            })?;
        let app = switchboard_proxy::http::router::metrics_app(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        tracing::info!(%addr, "metrics listening");
    }
    tokio::spawn(switchboard_proxy::live::probes::run(state.clone()));
    tokio::spawn(switchboard_proxy::live::reload::on_sighup(state.clone()));
    switchboard_proxy::http::batches::spawn_runner(&state);
    if state.live.load().config.server.watch_config {
        tokio::spawn(switchboard_proxy::live::watch::run(state.clone()));
    }
    let live = std::sync::Arc::clone(&state.live);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(Stop::Serve);
    let (first, second) = shutdown_signals();
    tokio::spawn(async move {
        first.await;
        let _ = stop_tx.send(Stop::Drain);
        second.await;
        let _ = stop_tx.send(Stop::Now);
    });
    let served = workers::serve(state, listen, n, grace, stop_rx).await;
    // The requests have ended: the ledger writes the rows that wait before the process does.
    if let Some(ledger) = live.load_full().ledger.clone() {
        let _ = tokio::task::spawn_blocking(move || ledger.close()).await;
    }
    Ok(served?)
}

/// The config error of the file at `path`.
fn invalid(path: &std::path::Path) -> impl FnOnce(config::ConfigErrors) -> Failure + '_ {
    move |errors| Failure::Config {
        path: Some(path.to_path_buf()),
        errors,
    }
}

fn load(path: &std::path::Path) -> Result<Config, Failure> {
    config::load(path).map_err(invalid(path))
}

/// The state of a loaded config; its CA files are read here.
fn new_state(cfg: Config, path: Option<std::path::PathBuf>) -> Result<AppState, Failure> {
    let shown = path.clone();
    AppState::new(cfg, path).map_err(|errors| Failure::Config {
        path: shown,
        errors,
    })
}

/// `switchboard routes`: the alias table after one round of health probes (which also
/// discovers `"auto"` figures), each window and slot count with where it comes from.
async fn routes(cfg: Config) -> Result<(), Failure> {
    let state = new_state(cfg, None)?;
    switchboard_proxy::live::probes::probe_all(&state).await;
    let snap = state.live.load_full();
    println!(
        "{:<24} {:<20} {:<9} {:<32} {:>10} {:<10} {:>5} {:<10} {:<12} old names / fallbacks",
        "alias", "backend", "flavor", "url", "window", "from", "slots", "from", "state"
    );
    for a in snap.routes.aliases() {
        let a = &*a.spec;
        let f = snap.figures(&a.name);
        let window_from = f.and_then(|f| f.window_source).map_or("-", |s| s.as_str());
        let slots_from = f.map_or("-", |f| f.slots_source.as_str());
        for (i, b) in a.backends.iter().enumerate() {
            let (name, window, window_from, extra) = if i == 0 {
                let mut extra = a.old_names.join(", ");
                if !a.fallbacks.is_empty() {
                    extra.push_str(&format!(" / fallbacks: {}", a.fallbacks.join(", ")));
                }
                let w = a.context_window.map_or("-".into(), |w| w.get().to_string());
                (a.name.as_str(), w, window_from, extra)
            } else {
                ("", String::new(), "", String::new())
            };
            println!(
                "{:<24} {:<20} {:<9} {:<32} {:>10} {:<10} {:>5} {:<10} {:<12} {}",
                name,
                b.name,
                b.flavor.as_str(),
                b.url,
                window,
                window_from,
                b.slots,
                if i == 0 { slots_from } else { "" },
                state.shown_state(&b.name),
                extra
            );
        }
    }
    for name in snap.config.backends.keys() {
        if let Some(d) = snap.discovered(name) {
            println!(
                "backend {name}: figures discovered at {} (unix time)",
                d.when
            );
        }
    }
    Ok(())
}

/// `switchboard check`: validate (tokenizers loaded as a snapshot would load them); with
/// `probe`, ask every backend and report each disagreement. `Ok(false)`: something disagrees.
async fn check(path: &std::path::Path, probe: bool) -> Result<bool, Failure> {
    let cfg = load(path)?;
    // The CA files and tokenizers are loaded as start-up would load them.
    switchboard_proxy::live::check(&cfg).map_err(invalid(path))?;
    println!(
        "{}: ok ({} backends, {} aliases)",
        path.display(),
        cfg.backends.len(),
        cfg.aliases.len()
    );
    if !probe {
        return Ok(true);
    }
    let state = new_state(cfg, None)?;
    let snap = state.live.load_full();
    let probed = switchboard_proxy::live::discover::ask_all(&state.client, &snap.config).await;
    let (lines, disagreements) = switchboard_proxy::fleet::drift::report(&snap.config, &probed);
    for line in lines {
        println!("{line}");
    }
    if disagreements == 0 {
        println!("the fleet agrees with {}", path.display());
    } else {
        println!(
            "{disagreements} disagreement(s) between {} and the fleet",
            path.display()
        );
    }
    Ok(disagreements == 0)
}

/// `switchboard export`: every alias as harness configs take it.
async fn export(
    path: &std::path::Path,
    format: switchboard_proxy::export::Format,
    probe: bool,
    base_url: Option<String>,
    provider: &str,
) -> Result<(), Failure> {
    use switchboard_proxy::export;
    let cfg = load(path)?;
    let probed = if probe {
        let state = new_state(cfg.clone(), None)?;
        let probed = switchboard_proxy::live::discover::ask_all(&state.client, &cfg).await;
        for (name, answer) in &probed {
            if let Err(e) = answer {
                eprintln!(
                    "switchboard: backend {name}: {e}; its aliases are exported from the config"
                );
            }
        }
        Some(probed)
    } else {
        None
    };
    if !probe {
        for a in cfg.aliases.values() {
            if a.window_setting.is_some_and(|w| w.is_auto()) {
                eprintln!(
                    "switchboard: alias {}: context_window = \"auto\" is known only to its backend; \
                     --probe exports it",
                    a.name
                );
            }
        }
    }
    let models = export::models(&cfg, probed.as_ref());
    let base_url = base_url.unwrap_or_else(|| export::default_base_url(cfg.server.listen));
    let doc = export::document(&cfg, provider, &base_url, &models);
    print!("{}", export::render(&doc, format));
    Ok(())
}

/// `switchboard tokens`: the free bound, the exact count and the verdict for one request.
async fn tokens(cfg: Config, alias: &str, request: &std::path::Path) -> Result<(), Failure> {
    use switchboard_proxy::guard::{self, Verdict};
    use switchboard_proxy::tokens::bound::PromptView;

    let body = if request.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
        buf
    } else {
        std::fs::read(request).map_err(|error| Failure::Read {
            path: request.to_path_buf(),
            error,
        })?
    };
    let state = new_state(cfg, None)?;
    let snap = state.live.load_full();
    let route = snap
        .routes
        .resolve(alias)
        .ok_or_else(|| Failure::UnknownAlias {
            alias: alias.into(),
            known: snap.routes.known(),
        })?;
    let (a, spec) = (&*route.alias.spec, route.alias.guard());
    let spec = spec.ok_or_else(|| Failure::NoWindow(a.name.clone()))?;
    let req = switchboard_wire::request::ParsedRequest::parse(&body)?;
    let body = req.upstream_body(&body, &a.upstream_model, false);
    let view = PromptView::parse(&body).map_err(Failure::View)?;
    let output = view.requested_output();
    println!("alias:        {} (window {} tokens)", a.name, spec.window);
    println!(
        "bound:        <= {} prompt tokens (free: bytes of the rendered prompt)",
        view.prompt_bound(&spec.media)
    );
    let prompt = spec
        .counter
        .count_prompt(&state.client, &body, &spec.media)
        .await?;
    println!(
        "count:        {prompt} prompt tokens ({})",
        spec.counter.kind().as_str()
    );
    println!(
        "output:       {}",
        output.map_or("not requested (max_tokens absent)".into(), |o| format!(
            "{o} tokens"
        ))
    );
    let verdict = guard::check(spec, &state.client, &body).await?;
    let text = match verdict {
        Verdict::Pass { method } => format!("fits (decided by {})", method.as_str()),
        Verdict::Clamp { max_tokens, method } => {
            format!(
                "fits with max_tokens lowered to {max_tokens} (decided by {})",
                method.as_str()
            )
        }
        Verdict::Over { method, .. } => format!(
            "over the window (decided by {}): {}",
            method.as_str(),
            verdict
                .into_error(spec.window)
                .map(|e| e.to_string())
                .unwrap_or_default()
        ),
    };
    println!("verdict:      {text}");
    Ok(())
}

/// Totals from the ledger of the config at `path` since `since` ago, grouped `by`, printed as
/// `format`.
fn usage(
    path: &std::path::Path,
    since: std::time::Duration,
    by: &[cli::UsageBy],
    format: switchboard_proxy::ledger::report::Format,
) -> Result<(), Failure> {
    let ledger = config::load_ledger(path).map_err(invalid(path))?;
    let Some(ledger) = ledger else {
        return Err(Failure::NoLedger);
    };
    let dims: Vec<_> = by.iter().map(|b| b.dim()).collect();
    let from = switchboard_proxy::ledger::now_ms() - since.as_millis() as i64;
    let groups = dims.clone();
    let totals =
        switchboard_proxy::ledger::with_store(&ledger.url, move |s| s.totals(from, &groups))
            .map_err(|e| Failure::Ledger(Box::new(e)))?;
    print!(
        "{}",
        switchboard_proxy::ledger::report::render(&totals, &dims, format)
    );
    Ok(())
}

/// How a command that did not fail ended.
enum Done {
    Ok,
    /// `check --probe` found disagreements: exit code 1.
    Disagrees,
}

async fn run(cli: Cli) -> Result<Done, Failure> {
    let done = match cli.command {
        Command::Serve { config } => serve(load(&config)?, Some(config)).await,
        Command::Demo { config } => switchboard::demo::run(&config).await.map_err(Failure::from),
        Command::Simulate(args) => {
            let addr = args.addr();
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|error| Failure::Listen {
                    addr,
                    what: "",
                    error,
                })?;
            let bound = listener.local_addr()?;
            eprintln!(
                "simulated {} backend listening on http://{bound}",
                args.flavor
            );
            let (first, _second) = shutdown_signals();
            switchboard_sim::serve(args.config(), listener, first)
                .await
                .map_err(Failure::Simulator)
        }
        Command::Check { config, probe } => {
            return Ok(match check(&config, probe).await? {
                true => Done::Ok,
                false => Done::Disagrees,
            });
        }
        Command::Export {
            config,
            format,
            probe,
            base_url,
            provider,
        } => export(&config, format, probe, base_url, &provider).await,
        Command::Routes { config } => routes(load(&config)?).await,
        Command::Tokens {
            config,
            alias,
            request,
        } => tokens(load(&config)?, &alias, &request).await,
        Command::Usage {
            config,
            since,
            by,
            format,
        } => usage(&config, *since, &by, format),
    };
    done.map(|()| Done::Ok)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("switchboard: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(run(cli));
    rt.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(Done::Ok) => ExitCode::SUCCESS,
        Ok(Done::Disagrees) => ExitCode::from(1),
        Err(e) => {
            eprintln!("switchboard: {e}");
            ExitCode::from(2)
        }
    }
}
