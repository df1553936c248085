//! The Responses API (`/v1/responses`): routed by `model`, OpenAI's error envelope.

use super::Adapter;

/// The Responses adapter.
pub struct Responses;

impl Adapter for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }
}
