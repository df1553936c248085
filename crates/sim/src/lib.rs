//! Backend simulator: a real HTTP server speaking the llama.cpp, vLLM and SGLang dialects.
//!
//! One [`Sim`] is one backend of one [`Flavor`](switchboard_wire::flavor::Flavor): it answers chat and
//! completion requests with deterministic text (`think0 `… then `word0 `…), honours slots,
//! context windows, delays and failures, and records what it saw in a [`Recorder`]. Every
//! flavour but `openai` (chat only) also answers the Messages and Responses APIs, streamed and
//! not, in the shapes that server sends.

mod api_tokens;
mod chat;
pub mod cli;
mod config;
mod dialects;
mod embed;
mod event_steps;
mod frame;
mod generation;
mod gpu;
mod info;
mod listener;
mod llamacpp;
mod messages_stream;
mod plan;
mod recorder;
mod reply;
mod responses_stream;
mod sglang;
mod sse_body;
mod state;
pub(crate) mod tokenize;
mod tokens_api;
mod vllm;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{GpuSim, SimConfig};
pub use recorder::{GpuRun, Recorded, Recorder};
pub use tokenize::count_prompt_tokens;

use state::Shared;

/// A running simulated backend. Dropping it stops the server, like [`Sim::shutdown`].
#[derive(Debug)]
pub struct Sim {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Sim {
    /// Starts a simulator on `127.0.0.1` and a free port.
    pub async fn spawn(cfg: SimConfig) -> std::io::Result<Sim> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Self::spawn_on(cfg, listener).await
    }

    /// Starts a simulator on an already bound listener.
    pub async fn spawn_on(cfg: SimConfig, listener: TcpListener) -> std::io::Result<Sim> {
        let addr = listener.local_addr()?;
        let shared = Shared::new(cfg);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(listener::run(Arc::clone(&shared), listener, async move {
            // A dropped sender stops the server too.
            let _ = stopped.await;
        }));
        Ok(Sim {
            shared,
            addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn recorder(&self) -> &Recorder {
        &self.shared.recorder
    }

    /// GPU mode: the slot-time its slots spent busy so far (zero outside GPU mode).
    pub fn gpu_busy(&self) -> std::time::Duration {
        self.shared
            .gpu
            .as_ref()
            .map_or(std::time::Duration::ZERO, |g| g.busy())
    }

    /// Answer every generation request from now on with `status` before any byte of an
    /// answer (`None`: answer normally again).
    pub fn fail_with(&self, status: Option<u16>) {
        self.shared
            .fail_status
            .store(status.unwrap_or(0), std::sync::atomic::Ordering::SeqCst);
    }

    /// Opens the gate for every gated stream, present and future.
    pub fn release(&self) {
        self.shared.gate.send_replace(true);
    }

    /// Stops accepting, closes every connection (in-flight generations count as cancelled)
    /// and waits until the server is gone.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves `cfg` on `listener` until `shutdown` resolves (for the command line).
pub async fn serve(
    cfg: SimConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    listener::run(Shared::new(cfg), listener, shutdown).await
}
