//! The accept loop: the cap on open client connections, model-routed POSTs straight to their
//! handler, the rest through the Router; graceful shutdown. No business logic.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tower::ServiceExt;

use super::client_io::{tracked, ClientIo, Serving};
use super::routed::{is_routed, routed_with};
use super::router::app;
use crate::live::AppState;

/// Serve the proxy on `listener` until `shutdown` resolves, then stop accepting and let requests
/// in flight (streams included) finish for up to `grace`; `force` resolving ends the wait at once.
///
/// Model-routed POSTs go straight from hyper to [`routed_with`]; everything else through
/// the [`app`] Router. The routed path is every request's path and needs none of the Router's
/// matching, extractors or boxed request body.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
    force: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = app(state.clone());
    let state = Arc::new(state);
    let http = hyper::server::conn::http1::Builder::new();
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tokio::select! {
                        () = accept_failed(e) => continue,
                        () = &mut shutdown => break,
                    }
                }
            },
            () = &mut shutdown => break,
        };
        let server = &state.live.load().config.server;
        let Some(open) = Open::take(&state.metrics.client_connections, cap(server)) else {
            refuse(&tcp, cap(server));
            state.metrics.connections_refused.inc();
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (state, router) = (Arc::clone(&state), router.clone());
        let serving = Arc::new(Serving::default());
        let io = ClientIo::new(
            tcp,
            Arc::clone(&serving),
            server.client.header_timeout,
            server.client.idle_timeout,
        );
        let service = service_fn(move |req: Request<Incoming>| {
            let (state, router) = (Arc::clone(&state), router.clone());
            // Served from its head to its answer's last byte: no client limit meanwhile.
            let served = serving.start();
            async move {
                let resp = if is_routed(req.method(), req.uri().path()) {
                    routed_with(&state, req).await
                } else {
                    match router.oneshot(req.map(Body::new)).await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    }
                };
                Ok::<_, Infallible>(resp.map(|b| tracked(b, served)))
            }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            let _open = open;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => tracing::warn!("shutdown grace of {grace:?} is over; closing open streams"),
        () = force => tracing::warn!("second signal: exiting now"),
    }
    Ok(())
}

/// Most client connections open at once: `server.max_connections`, else what the process's
/// file descriptor limit leaves room for with a backend connection for each and some spare
/// (for probes, the config file and the log).
fn cap(server: &crate::config::Server) -> usize {
    static FROM_LIMIT: OnceLock<usize> = OnceLock::new();
    server.client.max_connections.unwrap_or_else(|| {
        *FROM_LIMIT.get_or_init(|| {
            let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(8192, |(soft, _)| soft);
            usize::try_from(soft.saturating_sub(SPARE_DESCRIPTORS) / 2)
                .unwrap_or(usize::MAX)
                .max(16)
        })
    })
}

/// File descriptors kept for what is not a client connection or its backend connection.
const SPARE_DESCRIPTORS: u64 = 64;

/// One open client connection, counted in the gauge it was taken from while it lives.
struct Open(Gauge);

impl Open {
    /// A place for one more connection, if fewer than `cap` are open.
    fn take(open: &Gauge, cap: usize) -> Option<Open> {
        let before = open.inc();
        if usize::try_from(before).unwrap_or(0) >= cap {
            open.dec();
            return None;
        }
        Some(Open(open.clone()))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Answer a connection past the cap at once: a 503 in OpenAI's envelope (the API is not known
/// before a request is read, and none is), then the connection closes. Written without
/// waiting: a new connection's send buffer takes it whole.
fn refuse(tcp: &tokio::net::TcpStream, cap: usize) {
    let body = crate::error::ProxyError::TooManyConnections { limit: cap }.envelope_json();
    let mut answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    let _ = tcp.try_write(&answer);
}

/// An `accept` error: one connection's trouble is skipped; anything else (out of file
/// descriptors, say) is waited out for a second rather than spun on.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept failed; retrying in a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
