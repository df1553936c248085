//! Which API a request is for, by its path: a closed set, also the `endpoint` metric label.

use prometheus_client::encoding::EncodeLabelValue;

/// Which API a request was for (a closed set).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Endpoint {
    chat_completions,
    completions,
    embeddings,
    responses,
    messages,
    tokenize,
    count_tokens,
    input_tokens,
    models,
    other,
}

impl Endpoint {
    /// How many endpoints there are (for tables indexed by `self as usize`).
    pub const COUNT: usize = Endpoint::other as usize + 1;

    pub fn from_path(path: &str) -> Endpoint {
        match path {
            "/v1/chat/completions" => Endpoint::chat_completions,
            "/v1/completions" => Endpoint::completions,
            "/v1/embeddings" => Endpoint::embeddings,
            "/v1/responses" => Endpoint::responses,
            "/v1/messages" => Endpoint::messages,
            "/tokenize" | "/v1/tokenize" => Endpoint::tokenize,
            "/v1/messages/count_tokens" => Endpoint::count_tokens,
            "/v1/responses/input_tokens" => Endpoint::input_tokens,
            "/v1/models" => Endpoint::models,
            _ => Endpoint::other,
        }
    }
}
