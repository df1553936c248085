//! Resolve: the request view of the body, the route of its `model`, the reasoning field asked for.

use axum::http::{HeaderMap, HeaderName};

use super::call::{Incoming, Routed};
use crate::clients::Caller;
use crate::config::Alias;
use crate::error::{Echo, ProxyError};
use crate::live::Snapshot;
use crate::observe::metrics::RefusalReason;
use crate::observe::record::Record;
use crate::reasoning::OutputField;
use crate::wire::request::ParsedRequest;

const REASONING_FIELD: HeaderName = HeaderName::from_static("x-reasoning-field");

/// Parse the view, resolve its model (or 404 listing the aliases) and move the record to the
/// alias's metrics.
pub(crate) fn resolve(
    snap: &Snapshot,
    rec: &mut Record,
    req: &Incoming,
) -> Result<Routed, ProxyError> {
    let view = ParsedRequest::parse(&req.body)?;
    let caller = req.caller.as_ref();
    // An alias the client may not use is answered as if it did not exist.
    let route = snap
        .routes
        .resolve(&view.model)
        .filter(|r| caller.is_none_or(|c| c.may_use(r.alias.name())))
        .ok_or_else(|| {
            if let Some(c) = caller.filter(|_| snap.routes.resolve(&view.model).is_some()) {
                c.state.metrics.refused(RefusalReason::not_allowed);
            }
            ProxyError::ModelNotFound {
                model: Echo::new(&view.model),
                known: known(snap, caller),
            }
        })?;
    rec.stream = view.stream;
    rec.route(&route.alias.metrics, &route.alias.spec.backend.name);
    let output = output_field(&req.headers, &route.alias.spec, snap)?;
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

/// The aliases `caller` may use, as a 404 lists them.
pub(crate) fn known(snap: &Snapshot, caller: Option<&Caller>) -> String {
    match caller.filter(|c| c.spec.aliases.is_some()) {
        None => snap.routes.known(),
        Some(c) => {
            let names: Vec<&str> = snap
                .routes
                .aliases()
                .iter()
                .map(|a| a.name())
                .filter(|a| c.may_use(a))
                .collect();
            names.join(", ")
        }
    }
}
