//! The Router of the fixed routes, in one place. No business logic.

use axum::routing::{get, post};
use axum::Router;

use super::{count, handlers, status};
use crate::live::AppState;

/// The whole HTTP surface of the proxy.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/", get(status::page))
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{*id}", get(handlers::model))
        .route("/v1/messages/count_tokens", post(count::count_tokens))
        .route("/v1/responses/input_tokens", post(count::input_tokens))
        .route("/tokenize", post(count::tokenize))
        .route("/metrics", get(handlers::metrics))
        .route("/health", get(handlers::health))
        // Every other POST under /v1/ is routed by its model (see [`handlers::routed_or_not_found`]).
        .fallback(handlers::routed_or_not_found)
        .method_not_allowed_fallback(handlers::not_found)
        .with_state(state)
}

/// Only `/metrics`, for a separate metrics listener.
pub fn metrics_app(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .with_state(state)
}
