//! The Router of the fixed routes, in one place. No business logic.

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use super::{batches, count, handlers, status, usage};
use crate::live::AppState;
use crate::wire;

/// The whole HTTP surface of the proxy: the fixed routes and each registered API's counting
/// endpoint ([`wire::APIS`]); the APIs' own paths are routed by model.
pub(crate) fn app(state: AppState) -> Router {
    let mut router = Router::new()
        .route("/", get(status::page))
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{*id}", get(handlers::model));
    for &api in wire::APIS {
        if let Some(path) = api.spec().routes.count_paths().first() {
            let counted = move |state, headers, body| count::answer(state, headers, body, api);
            router = router.route(path, post(counted));
        }
    }
    router
        .route("/metrics", get(handlers::metrics))
        .route("/health", get(handlers::health))
        .route(
            "/v1/organization/usage/completions",
            get(usage::organization),
        )
        .route("/v1/usage", get(usage::own))
        // The Batch API; an upload is bounded by `batches.max_file_bytes` as it is read.
        .route(
            "/v1/files",
            post(batches::upload)
                .get(batches::files)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/files/{id}", get(batches::file).delete(batches::delete))
        .route("/v1/files/{id}/content", get(batches::content))
        .route("/v1/batches", post(batches::create).get(batches::batches))
        .route("/v1/batches/{id}", get(batches::batch))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
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
