//! Reasoning normalization: field mapping both ways and inline think-tag splitting.
//!
//! Backends write reasoning as `reasoning` (vLLM ≥ 0.16), `reasoning_content` (llama.cpp,
//! SGLang), both (vLLM 0.11–0.15), or leave it inline in `content` between tags when they
//! run without a reasoning parser. Clients get it under one configured field
//! ([`OutputField`]); history sent back is renamed to what the backend reads ([`InputField`]).
//!
//! - [`StreamRewriter`] rewrites SSE events one by one; an event with nothing to rewrite is
//!   passed on as the same bytes after a byte search, without a JSON parse.
//! - [`rewrite_response_body`] does the same for a non-streaming `chat.completion`.
//! - [`rewrite_request_history`] renames reasoning in the request's assistant messages.
//! - [`TextSplitter`] splits one plain text stream (the other APIs' text blocks).
//!
//! Inline tags are opt-in per alias ([`ThinkTags`]): the splitter gives the same split for a
//! text whether it arrives whole or in any pieces.

mod body;
mod field;
mod rewriter;
mod scan;
mod split_text;
mod splitter;
mod tags;

pub(crate) use body::{rewrite_request_history, rewrite_response_body};
pub use field::{InputField, OutputField, UnknownOutputField};
pub use rewriter::StreamRewriter;
pub use split_text::{Split, TextSplitter};
pub use tags::{BadThinkTags, ThinkTags, ThinkTagsSpec, PRESETS};

#[cfg(test)]
mod tests {
    //! Whole-module properties: streamed and non-streamed output agree for any chunking.
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::splitter::Splitter;
    use super::*;

    const OUTPUTS: [OutputField; 3] = [
        OutputField::ReasoningContent,
        OutputField::Reasoning,
        OutputField::Both,
    ];

    fn event(delta: Value, finish: Value) -> String {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        .to_string()
    }

    /// Reasoning and content a client reads from the sent chunks; checks that `Both` carries
    /// the same text under both names and that no empty string appears that was not sent.
    fn read(sent: &[Vec<u8>], output: OutputField) -> (String, String) {
        let (mut reasoning, mut content) = (String::new(), String::new());
        for bytes in sent {
            let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
                continue;
            };
            for choice in v["choices"].as_array().into_iter().flatten() {
                let delta = choice["delta"].as_object().unwrap();
                let names = output_names(output);
                for other in ["reasoning", "reasoning_content"] {
                    if !names.contains(&other) {
                        assert!(
                            delta.get(other).is_none_or(Value::is_null),
                            "{other} in {delta:?}"
                        );
                    }
                }
                let first = delta.get(names[0]).and_then(Value::as_str);
                for name in &names[1..] {
                    assert_eq!(delta.get(*name).and_then(Value::as_str), first);
                }
                assert_ne!(first, Some(""));
                reasoning += first.unwrap_or_default();
                let text = delta.get("content").and_then(Value::as_str);
                content += text.unwrap_or_default();
            }
        }
        (reasoning, content)
    }

    fn output_names(output: OutputField) -> Vec<&'static str> {
        match output {
            OutputField::ReasoningContent => vec!["reasoning_content"],
            OutputField::Reasoning => vec!["reasoning"],
            OutputField::Both => vec!["reasoning_content", "reasoning"],
        }
    }

    /// Streams `pieces` as content chunks; `flush_early` flushes before the finish chunk too,
    /// as a relay may.
    fn stream(
        tags: &ThinkTags,
        output: OutputField,
        pieces: &[&str],
        flush_early: bool,
    ) -> (String, String) {
        let mut rw = StreamRewriter::new(output, Some(Arc::new(tags.clone())));
        let mut events = vec![event(
            json!({"role": "assistant", "content": null}),
            Value::Null,
        )];
        events.extend(
            pieces
                .iter()
                .map(|p| event(json!({ "content": p }), Value::Null)),
        );
        let finish = events.len();
        events.push(event(json!({}), json!("stop")));
        events.push(
            json!({"id": "chatcmpl-1", "choices": [], "usage": {"total_tokens": 3}}).to_string(),
        );
        let mut sent = Vec::new();
        for (i, e) in events.iter().enumerate() {
            if flush_early && i == finish {
                sent.extend(rw.flush());
            }
            sent.push(rw.rewrite(e.as_bytes()).into_owned());
        }
        sent.extend(rw.flush());
        assert_eq!(rw.rewrite(b"[DONE]").as_ref(), b"[DONE]");
        read(&sent, output)
    }

    fn body(tags: &ThinkTags, output: OutputField, text: &str) -> (String, String) {
        let body = json!({"choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": text}}],
                          "usage": {"total_tokens": 3}})
        .to_string();
        let out =
            rewrite_response_body(body.as_bytes(), output, Some(tags)).unwrap_or(body.into_bytes());
        let v: Value = serde_json::from_slice(&out).unwrap();
        let message = &v["choices"][0]["message"];
        let names = output_names(output);
        let reasoning = message[names[0]].as_str().unwrap_or_default().to_owned();
        for name in &names[1..] {
            assert_eq!(message[*name].as_str().unwrap_or_default(), reasoning);
        }
        assert_eq!(v["usage"], json!({"total_tokens": 3}));
        (reasoning, message["content"].as_str().unwrap().to_owned())
    }

    fn text() -> impl Strategy<Value = String> {
        let parts = prop::sample::select(vec![
            "<think>",
            "</think>",
            "<",
            "</",
            "<th",
            "ink>",
            "k>",
            "a",
            " b",
            "\n",
            "\"",
            "\\",
            "é",
            "<|channel>thought",
            "<channel|>",
            "<|end|>",
            "<|channel|>analysis<|message|>",
            "<|start|>assistant<|channel|>final<|message|>",
        ]);
        prop::collection::vec(parts, 0..20).prop_map(|v| v.concat())
    }

    fn tags() -> impl Strategy<Value = ThinkTags> {
        (
            prop::sample::select(vec!["qwen3", "gemma4", "gpt-oss"]),
            any::<bool>(),
        )
            .prop_map(|(name, open)| {
                let mut t = ThinkTags::preset(name).unwrap();
                t.starts_open = open;
                t
            })
    }

    fn cut<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
        let mut at: Vec<usize> = cuts
            .iter()
            .map(|c| {
                let mut i = c % (text.len() + 1);
                while !text.is_char_boundary(i) {
                    i -= 1;
                }
                i
            })
            .chain([0, text.len()])
            .collect();
        at.sort_unstable();
        at.dedup();
        at.windows(2).map(|w| &text[w[0]..w[1]]).collect()
    }

    proptest! {
        #[test]
        fn stream_and_body_agree_with_the_whole_text_split(
            tags in tags(),
            text in text(),
            cuts in prop::collection::vec(any::<usize>(), 0..10),
            output in prop::sample::select(OUTPUTS.to_vec()),
            flush_early in any::<bool>(),
        ) {
            let whole = Splitter::split_all(&tags, &text);
            let expected = (whole.reasoning, whole.content);
            prop_assert_eq!(&stream(&tags, output, &cut(&text, &cuts), flush_early), &expected);
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
            prop_assert_eq!(&stream(&tags, output, &pieces, flush_early), &expected);
            prop_assert_eq!(&body(&tags, output, &text), &expected);
        }

        #[test]
        fn backend_fields_reach_the_client_field(
            pieces in prop::collection::vec(("[a-z<>/ ]{0,6}", 0u8..4), 0..12),
            output in prop::sample::select(OUTPUTS.to_vec()),
        ) {
            // 0: reasoning_content, 1: reasoning, 2: both names (vLLM 0.11–0.15), 3: content.
            let mut rw = StreamRewriter::new(output, None);
            let (mut want_r, mut want_c, mut sent) = (String::new(), String::new(), Vec::new());
            for (text, kind) in &pieces {
                let delta = match kind {
                    0 => json!({ "reasoning_content": text }),
                    1 => json!({ "reasoning": text }),
                    2 => json!({ "reasoning": text, "reasoning_content": text }),
                    _ => json!({ "content": text }),
                };
                if *kind == 3 { want_c += text } else { want_r += text }
                if text.is_empty() {
                    continue; // an empty string the backend sends is kept as it is
                }
                sent.push(rw.rewrite(event(delta, Value::Null).as_bytes()).into_owned());
            }
            prop_assert_eq!(rw.flush(), None);
            prop_assert_eq!(read(&sent, output), (want_r, want_c));
        }
    }

    #[test]
    fn history_round_trip_per_backend() {
        // What a `both` client sends back reaches either backend under the name it reads.
        let request = json!({"model": "m", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "reasoning_content": "r", "reasoning": "r", "content": "c"},
            {"role": "user", "content": "more"}]});
        let bytes = request.to_string().into_bytes();
        for (input, keep) in [
            (InputField::Reasoning, "reasoning"),
            (InputField::ReasoningContent, "reasoning_content"),
        ] {
            let out: Value =
                serde_json::from_slice(&rewrite_request_history(&bytes, input).unwrap()).unwrap();
            let assistant = out["messages"][1].as_object().unwrap();
            assert_eq!(
                assistant.keys().collect::<Vec<_>>(),
                ["role", keep, "content"]
            );
            assert_eq!(out["messages"][0], request["messages"][0]);
        }
    }

    /// One chat stream event for the spelling property: reasoning under either name or both,
    /// content, a tool call, a second choice, the finish and the usage-only chunk.
    fn any_event() -> impl Strategy<Value = Value> {
        let piece = || {
            prop::collection::vec(
                prop::sample::select(vec!["<think>", "</think>", "<", "a", " b", "\"", "\\", "é"]),
                0..4,
            )
            .prop_map(|v| v.concat())
        };
        let delta = (0u8..6, piece(), piece()).prop_map(|(kind, a, b)| match kind {
            0 => json!({ "reasoning_content": a }),
            1 => json!({ "reasoning": a }),
            2 => json!({ "reasoning": a, "reasoning_content": a }),
            3 => json!({ "content": a, "reasoning_content": b }),
            4 => json!({ "tool_calls": [{"index": 0, "function": {"arguments": a}}] }),
            _ => json!({ "content": a }),
        });
        (delta, 0u64..2, any::<bool>(), 0u8..4).prop_map(|(delta, index, finish, kind)| match kind {
            0 => json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 3}}),
            _ => json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": index, "delta": delta, "logprobs": null,
                             "finish_reason": if finish { json!("stop") } else { Value::Null }}]}),
        })
    }

    fn parsed(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    proptest! {
        /// The byte searches that let an event pass unparsed, and the in-place key
        /// rename, give what the parse gives for any spelling of the same events (whitespace,
        /// member order, escapes in keys and strings).
        #[test]
        fn stream_rewrite_agrees_with_the_parse_in_any_spelling(
            events in prop::collection::vec((any_event(), any::<u64>()), 1..12),
            output in prop::sample::select(OUTPUTS.to_vec()),
            tags in prop::option::of(tags()),
        ) {
            use switchboard_json::respell::{respell, Style};
            let tags = tags.map(Arc::new);
            let mut fast = StreamRewriter::new(output, tags.clone());
            let mut slow = StreamRewriter::new(output, tags);
            for (event, seed) in &events {
                let data = respell(event, Style::line(*seed));
                let a = fast.rewrite(data.as_bytes()).into_owned();
                let b = slow.rewrite_parsed(data.as_bytes()).into_owned();
                prop_assert_eq!(parsed(&a), parsed(&b), "{}", data);
            }
            prop_assert_eq!(fast.flush().map(|b| parsed(&b)), slow.flush().map(|b| parsed(&b)));
        }

        /// The same for a whole answer and for the history of a request.
        #[test]
        fn body_rewrites_agree_with_the_parse_in_any_spelling(
            event in any_event(),
            seed: u64,
            output in prop::sample::select(OUTPUTS.to_vec()),
            tags in prop::option::of(tags()),
        ) {
            use switchboard_json::respell::{respell, Style};
            // The event's delta as a message of an answer and of a request's history.
            let mut message = event["choices"][0]["delta"].clone();
            if !message.is_object() {
                message = json!({"content": "x"});
            }
            message["role"] = json!("assistant");
            let answer = json!({"id": "c", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"total_tokens": 3}});
            let text = respell(&answer, Style::body(seed));
            let fast = rewrite_response_body(text.as_bytes(), output, tags.as_ref());
            let slow = body::rewrite_parsed_response_body(text.as_bytes(), output, tags.as_ref());
            prop_assert_eq!(fast.map(|b| parsed(&b)), slow.map(|b| parsed(&b)), "{}", text);
            let request = json!({"model": "m", "messages": [{"role": "user", "content": "q"}, message]});
            let text = respell(&request, Style::body(seed));
            for input in [InputField::Reasoning, InputField::ReasoningContent] {
                let fast = rewrite_request_history(text.as_bytes(), input);
                let slow = body::rewrite_parsed_request_history(text.as_bytes(), input);
                prop_assert_eq!(fast.map(|b| parsed(&b)), slow.map(|b| parsed(&b)), "{}", text);
            }
        }
    }
}
