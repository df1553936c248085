//! Builds the Router and runs it: routes, layer order, graceful shutdown. No business logic.

use std::future::Future;
use std::time::Duration;

use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;

use crate::api;
use crate::state::AppState;

/// The whole HTTP surface of the proxy.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/models", get(api::models))
        .route("/v1/models/{*id}", get(api::model))
        .route("/v1/messages/count_tokens", post(api::count_tokens))
        .route("/tokenize", post(api::tokenize))
        .route("/metrics", get(api::metrics))
        .route("/health", get(api::health))
        // Every other POST under /v1/ is routed by its model (see `api::routed_or_not_found`).
        .fallback(api::routed_or_not_found)
        .method_not_allowed_fallback(api::not_found)
        .with_state(state)
}

/// Only `/metrics`, for a separate metrics listener.
pub fn metrics_app(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(api::metrics))
        .fallback(api::not_found)
        .with_state(state)
}

/// Serve `app` on `listener` until `shutdown` resolves, then stop accepting and let requests in
/// flight (streams included) finish for up to `grace`; `force` resolving ends the wait at once.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
    force: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (began_tx, began_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        let _ = began_tx.send(());
    };
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, app(state)).with_graceful_shutdown(signal);
    let deadline = async move {
        if began_rx.await.is_err() {
            return std::future::pending::<()>().await;
        }
        tokio::select! {
            _ = tokio::time::sleep(grace) => tracing::warn!("shutdown grace of {grace:?} is over; closing open streams"),
            _ = force => tracing::warn!("second signal: exiting now"),
        }
    };
    tokio::select! {
        r = server => r,
        _ = deadline => Ok(()),
    }
}
