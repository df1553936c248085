//! Resolve: the request view of the body, the route of its `model`, the reasoning field asked for.

use axum::http::{HeaderMap, HeaderName};

use super::Incoming;
use crate::config::Alias;
use crate::error::{Echo, ProxyError};
use crate::fleet::routes::Route;
use crate::live::Snapshot;
use crate::observe::record::Record;
use crate::reasoning::OutputField;
use crate::wire::request::ParsedRequest;

const REASONING_FIELD: HeaderName = HeaderName::from_static("x-reasoning-field");

/// A request whose model resolved to an alias.
pub struct Routed {
    pub view: ParsedRequest,
    pub route: Route,
    /// The field this client gets reasoning in.
    pub output: OutputField,
}

/// Parse the view, resolve its model (or 404 listing the aliases) and move the record to the
/// alias's metrics.
pub fn resolve(snap: &Snapshot, rec: &mut Record, req: &Incoming) -> Result<Routed, ProxyError> {
    let view = ParsedRequest::parse(&req.body)?;
    let route = snap
        .routes
        .resolve(&view.model)
        .ok_or_else(|| ProxyError::ModelNotFound {
            model: Echo::new(&view.model),
            known: snap.routes.known(),
        })?;
    rec.stream = view.stream;
    rec.route(
        snap.metrics(Some(&route.alias.name)),
        &route.alias.backend.name,
    );
    let output = output_field(&req.headers, &route.alias, snap)?;
    Ok(Routed {
        view,
        route,
        output,
    })
}

/// The reasoning field this client gets: its header, else the alias's setting, else the server's.
fn output_field(
    headers: &HeaderMap,
    alias: &Alias,
    snap: &Snapshot,
) -> Result<OutputField, ProxyError> {
    match headers.get(REASONING_FIELD) {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                ProxyError::InvalidRequest(format!(
                    "invalid X-Reasoning-Field header {:?}: expected reasoning_content, reasoning or both",
                    Echo::new(&String::from_utf8_lossy(v.as_bytes()))
                ))
            }),
        None => Ok(alias
            .reasoning_field
            .unwrap_or(snap.config.server.reasoning_field)),
    }
}
