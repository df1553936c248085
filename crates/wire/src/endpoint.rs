//! Which endpoint a request is for, by its path: the registered APIs' own endpoints and their
//! counting endpoints ([`super::APIS`]), the model list, and the rest; a closed set, also the
//! `endpoint` metric label.

use std::fmt;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

use super::{passthrough, Adapter, APIS};

/// Which endpoint a request was for: an API's own (`2 * i` for [`APIS`]`[i]`), its counting
/// endpoint (`2 * i + 1`), the model list or anything else.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
pub struct Endpoint(u8);

const MODELS: u8 = 2 * APIS.len() as u8;
const OTHER: u8 = MODELS + 1;

/// The endpoints the code names itself (by their label: these keep their place in [`APIS`]).
#[allow(non_upper_case_globals)]
impl Endpoint {
    pub const chat_completions: Endpoint = Endpoint(0);
    pub const tokenize: Endpoint = Endpoint(1);
    pub const models: Endpoint = Endpoint(MODELS);
    pub const other: Endpoint = Endpoint(OTHER);
}

impl Endpoint {
    /// How many endpoints there are (for tables indexed by [`Endpoint::index`]).
    pub const COUNT: usize = OTHER as usize + 1;

    /// Its place among the endpoints, below [`Endpoint::COUNT`].
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The endpoint of `path` (a counting endpoint's other spellings included).
    pub fn from_path(path: &str) -> Endpoint {
        if path == "/v1/models" {
            return Endpoint::models;
        }
        for (i, api) in (0u8..).zip(APIS) {
            if api.spec().routes.paths.contains(&path) {
                return Endpoint(2 * i);
            }
            if api.spec().routes.count_paths().contains(&path) {
                return Endpoint(2 * i + 1);
            }
        }
        Endpoint::other
    }

    /// The endpoint of `adapter`'s API itself (the passthrough's for an unregistered one).
    pub(crate) fn of(adapter: &dyn Adapter) -> Endpoint {
        (0u8..)
            .zip(APIS)
            .find(|(_, a)| a.spec().routes.label == adapter.spec().routes.label)
            .map_or(Endpoint::other, |(i, _)| Endpoint(2 * i))
    }

    /// The counting endpoint of `adapter`'s API.
    pub fn count_of(adapter: &dyn Adapter) -> Endpoint {
        Endpoint(Endpoint::of(adapter).0 | 1)
    }

    /// The API registered at this endpoint, and whether the endpoint is its counting one.
    fn api(self) -> Option<(&'static dyn Adapter, bool)> {
        APIS.get(usize::from(self.0 / 2))
            .map(|a| (*a, self.0 % 2 == 1))
    }

    /// The adapter of a request to this endpoint: its API's (the counting endpoints' too).
    pub fn adapter(self) -> &'static dyn Adapter {
        self.api().map_or(&passthrough::OTHER, |(a, _)| a)
    }

    /// The adapter of a request routed by its model at this endpoint: its API's, but a
    /// counting path routed (a spelling the router does not serve) passes through.
    pub fn routed_adapter(self) -> &'static dyn Adapter {
        match self.api() {
            Some((a, false)) => a,
            _ => &passthrough::OTHER,
        }
    }

    /// The label value: `chat_completions`, `count_tokens`, `models`, `other`, …
    pub fn label(self) -> &'static str {
        match (self.0, self.api()) {
            (MODELS, _) => "models",
            (_, Some((a, false))) => a.spec().routes.label,
            (_, Some((a, true))) => a.spec().routes.count.as_ref().map_or("other", |c| c.label),
            _ => "other",
        }
    }

    /// `gen_ai.operation.name` of a request to this endpoint.
    pub fn operation(self) -> &'static str {
        self.adapter().spec().operation
    }

    /// The path of this endpoint as a span tells it: an API's own path, the others as one
    /// value (not the client's).
    pub fn span_path(self) -> &'static str {
        match self.api() {
            Some((a, false)) => a.spec().routes.paths.first().copied().unwrap_or("/v1/*"),
            _ => "/v1/*",
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl EncodeLabelValue for Endpoint {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        EncodeLabelValue::encode(&self.label(), encoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_path_has_its_endpoint_and_label() {
        for (path, label, adapter) in [
            ("/v1/chat/completions", "chat_completions", "chat"),
            ("/v1/completions", "completions", "completions"),
            ("/v1/embeddings", "embeddings", "passthrough"),
            ("/v1/responses", "responses", "responses"),
            ("/v1/messages", "messages", "messages"),
            ("/tokenize", "tokenize", "chat"),
            ("/v1/tokenize", "tokenize", "chat"),
            ("/v1/messages/count_tokens", "count_tokens", "messages"),
            ("/v1/responses/input_tokens", "input_tokens", "responses"),
            ("/v1/models", "models", "passthrough"),
            ("/v1/other", "other", "passthrough"),
        ] {
            let e = Endpoint::from_path(path);
            assert_eq!(e.label(), label, "{path}");
            assert_eq!(format!("{e:?}"), label);
            assert_eq!(e.adapter().spec().name, adapter, "{path}");
            assert!(e.index() < Endpoint::COUNT);
        }
        assert_eq!(Endpoint::from_path("/tokenize"), Endpoint::tokenize);
        assert_eq!(Endpoint::chat_completions.label(), "chat_completions");
        assert_eq!(
            Endpoint::from_path("/v1/tokenize")
                .routed_adapter()
                .spec()
                .name,
            "passthrough"
        );
        assert_eq!(
            Endpoint::from_path("/v1/messages").span_path(),
            "/v1/messages"
        );
        assert_eq!(Endpoint::tokenize.span_path(), "/v1/*");
        assert_eq!(
            Endpoint::from_path("/v1/embeddings").operation(),
            "embeddings"
        );
    }
}
