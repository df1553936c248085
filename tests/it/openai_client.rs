//! The proxy driven by `async-openai`, a real OpenAI client written by others.
use crate::common;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use async_openai::Client;
use common::*;
use futures_util::StreamExt;
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;

fn request(model: &str) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model(model)
        .max_tokens(5u32)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("Say hello")
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap()
}

async fn setup() -> (switchboard_sim::Sim, Proxy, Client<OpenAIConfig>) {
    let sim = sim(SimConfig {
        flavor: Flavor::Llamacpp,
        model: "up-model".into(),
        ..SimConfig::default()
    })
    .await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_base(p.url("/v1"))
            .with_api_key("sk-test"),
    );
    (sim, p, client)
}

#[tokio::test]
async fn async_openai_chat_call_gets_text_and_usage() {
    let (_sim, _p, client) = setup().await;
    let resp = within("chat", client.chat().create(request("a")))
        .await
        .unwrap();
    let text = resp.choices[0].message.content.clone().unwrap();
    assert!(!text.is_empty());
    assert!(resp.usage.unwrap().completion_tokens > 0);
}

#[tokio::test]
async fn async_openai_stream_reads_to_its_finish_reason() {
    let (_sim, _p, client) = setup().await;
    let mut stream = within("stream", client.chat().create_stream(request("a")))
        .await
        .unwrap();
    let mut text = String::new();
    let mut finished = false;
    while let Some(chunk) = within("chunk", stream.next()).await {
        let chunk = chunk.unwrap();
        for choice in chunk.choices {
            if let Some(t) = choice.delta.content {
                text.push_str(&t);
            }
            finished |= choice.finish_reason.is_some();
        }
    }
    assert!(finished);
    assert!(!text.is_empty());
}

#[tokio::test]
async fn async_openai_unknown_alias_is_model_not_found() {
    let (_sim, _p, client) = setup().await;
    let err = within("chat", client.chat().create(request("no-such-model")))
        .await
        .unwrap_err();
    match err {
        OpenAIError::ApiError(e) => {
            assert_eq!(e.status_code.as_u16(), 404);
            assert_eq!(e.api_error.code.as_deref(), Some("model_not_found"));
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}
