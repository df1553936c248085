//! The registry of the APIs clients speak: [`APIS`], one line each, and the lookups by it.

use super::{chat, messages, passthrough, responses, Adapter, Endpoint};

/// The APIs clients speak, one line each: where each is served and everything that differs
/// is its adapter's ([`Endpoint`] numbers their endpoints by their place here).
pub const APIS: &[&dyn Adapter] = &[
    &chat::Chat,
    &passthrough::COMPLETIONS,
    &messages::Messages,
    &responses::Responses,
    &passthrough::EMBEDDINGS,
];

/// The adapter of an endpoint.
pub fn adapter(endpoint: Endpoint) -> &'static dyn Adapter {
    endpoint.adapter()
}

/// The registered API whose `apis` name is `name`.
pub fn by_config_name(name: &str) -> Option<&'static dyn Adapter> {
    APIS.iter()
        .copied()
        .find(|a| a.spec().config_name == Some(name))
}
