//! The Responses API (`/v1/responses`, `/v1/responses/input_tokens`): routed by `model`,
//! OpenAI's error envelope, the request in chat form per backend ([`to_chat`]) and its output
//! limit `max_output_tokens`.

pub mod history;
pub mod to_chat;

use std::borrow::Cow;

use super::{Adapter, Api, Converter};
use crate::error::ProxyError;
use crate::wire::chat_form;

/// The Responses adapter.
pub struct Responses;

impl Adapter for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn api(&self) -> Api {
        Api::Responses
    }

    fn guarded(&self) -> bool {
        true
    }

    fn to_chat<'a>(
        &self,
        body: &'a [u8],
        converter: Converter,
    ) -> Result<Cow<'a, [u8]>, ProxyError> {
        let req = chat_form::object(body)?;
        let chat = to_chat::to_chat(req, converter)?;
        Ok(Cow::Owned(chat_form::to_bytes(&chat)?))
    }

    fn output_limit(&self) -> &'static [&'static str] {
        &["max_output_tokens"]
    }
}
