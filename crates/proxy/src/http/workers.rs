//! Thread-per-core serving: one current-thread runtime and one `SO_REUSEPORT` listener per worker.
//!
//! The kernel spreads connections over the workers' listeners; a request is then served start
//! to end on one thread (its upstream connection pool included), with no work stealing and no
//! cross-thread wake-ups on the hot path. Config snapshots, metrics, slots and health are shared.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, oneshot, watch};

use crate::live::AppState;

/// What the control loop tells the workers: keep serving, drain, or stop now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stop {
    Serve,
    Drain,
    Now,
}

/// Why serving ended early or could not begin. Cloned as a worker both reports it at once and
/// ends with it, hence its I/O errors in an `Arc`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {error}")]
    Listen {
        addr: SocketAddr,
        error: Arc<io::Error>,
    },
    #[error("cannot start worker {worker}: {error}")]
    Start {
        worker: usize,
        error: Arc<io::Error>,
    },
    #[error("cannot spawn worker {worker}: {error}")]
    Spawn {
        worker: usize,
        error: Arc<io::Error>,
    },
    #[error("worker {worker}: {error}")]
    Worker {
        worker: usize,
        error: Arc<io::Error>,
    },
    #[error("a worker exited before listening")]
    Exited,
    #[error("a worker panicked")]
    Panicked,
}

/// Bind `addr` so that several listeners (one per worker) can share it.
pub(crate) fn bind_shared(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Resolves once `stop` reaches `level`.
async fn reached(mut stop: watch::Receiver<Stop>, level: Stop) {
    let _ = stop.wait_for(|s| *s >= level).await;
}

/// A tick a second for the life of the worker. Tokio wakes its driver (a write to an eventfd
/// and an early return from `epoll_wait`) whenever a timer is armed that is earlier than the
/// driver's next planned wake-up, which with no timers at all is every timer: without this
/// tick, each request's header deadline would cost that wake-up. With it, the planned wake-up
/// is at most a second away and a request's deadline (seconds or more) never comes first.
async fn heartbeat() {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// Run `workers` threads serving `state` on `addr` until `stop` says so. Returns once every
/// worker has finished; the first error (e.g. the address is taken) ends it early.
pub async fn serve(
    state: AppState,
    addr: SocketAddr,
    workers: usize,
    grace: Duration,
    stop: watch::Receiver<Stop>,
) -> Result<(), ServeError> {
    let listen = move |e: io::Error| ServeError::Listen {
        addr,
        error: Arc::new(e),
    };
    // SO_REUSEPORT would let a second instance share the port silently: make sure it is
    // free first with an exclusive bind.
    drop(std::net::TcpListener::bind(addr).map_err(listen)?);
    let (ready_tx, mut ready_rx) = mpsc::channel::<Result<(), ServeError>>(workers);
    let mut done = Vec::with_capacity(workers);
    for i in 0..workers {
        let state = state.with_own_client();
        let stop = stop.clone();
        let ready = ready_tx.clone();
        let failed = ready_tx.clone();
        let (done_tx, done_rx) = oneshot::channel::<Result<(), ServeError>>();
        let spawned = std::thread::Builder::new()
            .name(format!("switchboard-{i}"))
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| ServeError::Start {
                        worker: i,
                        error: Arc::new(e),
                    })
                    .and_then(|rt| {
                        rt.block_on(async move {
                            tokio::spawn(heartbeat());
                            let listener = bind_shared(addr).map_err(listen)?;
                            let _ = ready.send(Ok(())).await;
                            crate::http::server::run(
                                listener,
                                state,
                                reached(stop.clone(), Stop::Drain),
                                grace,
                                reached(stop, Stop::Now),
                            )
                            .await
                            .map_err(|e| ServeError::Worker {
                                worker: i,
                                error: Arc::new(e),
                            })
                        })
                    });
                if let Err(e) = &result {
                    let _ = failed.try_send(Err(e.clone()));
                }
                let _ = done_tx.send(result);
            });
        if let Err(e) = spawned {
            return Err(ServeError::Spawn {
                worker: i,
                error: Arc::new(e),
            });
        }
        done.push(done_rx);
    }
    drop(ready_tx);
    for _ in 0..workers {
        match ready_rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => return Err(ServeError::Exited),
        }
    }
    tracing::info!(%addr, workers, "switchboard listening");
    for d in done {
        d.await.map_err(|_| ServeError::Panicked)??;
    }
    Ok(())
}
