//! The wire layer as a whole: the registry of APIs, and both translations of a chat stream
//! (to Messages and to Responses) over any interleaving of text, reasoning and tool calls.

use std::collections::HashSet;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::reasoning::OutputField;
use crate::responses::stream::tests::spec;
use crate::stream::{ApiEvents, Seen, StreamContext};

#[test]
fn each_endpoint_has_the_adapter_of_its_api() {
    let at = |path| adapter(Endpoint::from_path(path));
    assert_eq!(adapter(Endpoint::chat_completions).spec().name, "chat");
    assert_eq!(at("/v1/responses").spec().name, "responses");
    assert_eq!(at("/v1/messages").spec().name, "messages");
    assert_eq!(at("/v1/messages/count_tokens").spec().name, "messages");
    assert_eq!(at("/v1/completions").spec().name, "completions");
    assert_eq!(at("/v1/embeddings").spec().name, "passthrough");
    assert!(adapter(Endpoint::chat_completions).spec().guarded);
    assert!(!at("/v1/embeddings").spec().takes_stream_usage);
    assert!(at("/v1/completions").spec().takes_stream_usage);
}

#[test]
fn the_registry_names_each_api_once() {
    let mut labels: Vec<&str> = APIS.iter().map(|a| a.spec().routes.label).collect();
    labels.extend(
        APIS.iter()
            .filter_map(|a| a.spec().routes.count.as_ref().map(|c| c.label)),
    );
    let n = labels.len();
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), n, "an endpoint label twice");
    let mut paths: Vec<&str> = APIS
        .iter()
        .flat_map(|a| {
            a.spec()
                .routes
                .paths
                .iter()
                .chain(a.spec().routes.count_paths())
        })
        .copied()
        .collect();
    let n = paths.len();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(paths.len(), n, "a path twice");
    assert_eq!(
        by_config_name("messages").map(|a| a.spec().name),
        Some("messages")
    );
    assert!(by_config_name("grpc").is_none());
    // What the other APIs are translated to is registered and served everywhere.
    let chat: Vec<_> = APIS.iter().filter(|a| a.spec().speaks_chat).collect();
    assert_eq!(chat.len(), 1);
    assert!(chat[0].spec().config_name.is_some());
}

#[test]
fn each_specs_facts_agree_and_runtimes_name_registered_apis() {
    for api in APIS.iter().chain([&(&passthrough::OTHER as &dyn Adapter)]) {
        let spec = api.spec();
        let asks_n = spec.shaping.is_some_and(|f| f.own.contains(&"n"));
        assert_eq!(
            spec.choices, asks_n,
            "{}: choices is its `n` field",
            spec.name
        );
        assert!(
            spec.guarded <= spec.shaping.is_some(),
            "{}: guarded unshaped",
            spec.name
        );
    }
    for r in crate::runtime::RUNTIMES {
        let names = r.serves.iter().chain(r.count_paths.iter().map(|c| &c.api));
        for name in names {
            assert!(by_config_name(name).is_some(), "{}: no API {name}", r.name);
        }
        for c in r.count_paths {
            let api = by_config_name(c.api).unwrap();
            assert!(
                api.spec().routes.count.is_some(),
                "{}: {} counts nothing",
                r.name,
                c.api
            );
        }
    }
}

fn ctx() -> StreamContext {
    StreamContext {
        output: OutputField::ReasoningContent,
        tags: None,
        model: "alias".into(),
    }
}

/// Feeds `events` (SSE `data:` payloads, one line each) through `t`, each as its own event;
/// the client's bytes.
fn translate(t: &mut dyn ApiEvents, events: &[String], seen: &mut Seen) -> Vec<u8> {
    let sse: String = events.iter().map(|d| format!("data: {d}\n\n")).collect();
    crate::messages::from_chat::tests::translate(t, &sse, seen)
}

/// One piece of a generated chat stream.
#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    Reasoning(String),
    /// Fragment `k` of call number `c`.
    Call(usize, usize),
}

/// A generated tool call: its chat index, id (or none), name, and arguments cut in pieces.
#[derive(Debug, Clone)]
struct Gen {
    index: u64,
    id: Option<String>,
    name: String,
    /// The name comes with the second fragment rather than the first.
    name_late: bool,
    fragments: Vec<String>,
}

impl Gen {
    fn args(&self) -> String {
        self.fragments.concat()
    }
}

/// `s` cut at the char boundaries `cuts` pick (mid-UTF-8 never: a JSON string holds chars).
fn cut(s: &str, cuts: &[usize]) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
    at.push(chars.len());
    at.sort_unstable();
    let mut out = Vec::new();
    let mut from = 0;
    for to in at {
        out.push(chars[from..to].iter().collect());
        from = to;
    }
    out
}

fn gen_calls() -> impl Strategy<Value = Vec<Gen>> {
    let call = (
        any::<bool>(),
        "[a-z]{1,6}",
        any::<bool>(),
        "[a-zé€😀\"{}:,0-9 \\\\]{0,16}",
        prop::collection::vec(any::<usize>(), 0..5),
    );
    (
        prop::collection::vec(call, 0..4),
        prop::sample::subsequence(vec![0u64, 1, 2, 5, 7], 4),
    )
        .prop_map(|(calls, indexes)| {
            calls
                .into_iter()
                .zip(indexes)
                .enumerate()
                .map(|(n, ((has_id, name, late, args, cuts), index))| Gen {
                    index,
                    id: has_id.then(|| format!("id{n}")),
                    name,
                    name_late: late,
                    fragments: cut(&args, &cuts),
                })
                .collect()
        })
}

fn gen_prose() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[a-zé€😀 ]{1,6}", 0..4)
}

/// The chat stream: pieces merged in the order `picks` chooses, some pairs in one chunk.
fn chat_events(
    calls: &[Gen],
    text: &[String],
    reasoning: &[String],
    picks: &[(u8, bool)],
    field: &str,
) -> Vec<String> {
    let mut queues: Vec<Vec<Piece>> = vec![
        text.iter().cloned().map(Piece::Text).collect(),
        reasoning.iter().cloned().map(Piece::Reasoning).collect(),
    ];
    for (c, g) in calls.iter().enumerate() {
        queues.push((0..g.fragments.len()).map(|k| Piece::Call(c, k)).collect());
    }
    for q in &mut queues {
        q.reverse();
    }
    let mut deltas: Vec<Value> = Vec::new();
    let mut picks = picks.iter().cycle();
    while queues.iter().any(|q| !q.is_empty()) {
        let &(pick, join) = picks.next().unwrap_or(&(0, false));
        let live: Vec<usize> = (0..queues.len())
            .filter(|q| !queues[*q].is_empty())
            .collect();
        let q = live[pick as usize % live.len()];
        let piece = queues[q].pop().unwrap();
        let mut d = match (join, deltas.pop()) {
            (true, Some(d)) => d,
            (_, last) => {
                deltas.extend(last);
                json!({})
            }
        };
        let taken = match &piece {
            Piece::Text(_) => d.get("content").is_some(),
            Piece::Reasoning(_) => d.get(field).is_some(),
            Piece::Call(c, _) => d["tool_calls"]
                .as_array()
                .is_some_and(|a| a.iter().any(|t| t["index"] == calls[*c].index)),
        };
        if taken {
            // The kind is in this delta already: the piece goes in a chunk of its own.
            deltas.push(d);
            d = json!({});
        }
        match piece {
            Piece::Text(t) => d["content"] = json!(t),
            Piece::Reasoning(r) => d[field] = json!(r),
            Piece::Call(c, k) => {
                let g = &calls[c];
                let mut f = json!({"arguments": g.fragments[k]});
                let name_here = if g.name_late && g.fragments.len() > 1 {
                    k == 1
                } else {
                    k == 0
                };
                if name_here {
                    f["name"] = json!(g.name);
                }
                let mut t = json!({"index": g.index, "function": f});
                if k == 0 {
                    if let Some(id) = &g.id {
                        t["id"] = json!(id);
                        t["type"] = json!("function");
                    }
                }
                match d["tool_calls"].as_array_mut() {
                    Some(a) => a.push(t),
                    None => d["tool_calls"] = json!([t]),
                }
            }
        }
        deltas.push(d);
    }
    let chunk = |choice: Value| {
        json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "model": "m",
            "created": 1, "choices": [choice]})
        .to_string()
    };
    let mut events: Vec<String> = deltas
        .into_iter()
        .map(|d| chunk(json!({"index": 0, "delta": d, "finish_reason": null})))
        .collect();
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    events.push(chunk(
        json!({"index": 0, "delta": {}, "finish_reason": finish}),
    ));
    events.push(
        json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
        .to_string(),
    );
    events.push("[DONE]".into());
    events
}

/// A Messages stream's grammar beyond the block order (checked by `spec`): each delta of its
/// block's own type; the blocks' text, thinking and each tool call's arguments as streamed.
fn messages_content(events: &[(String, Value)]) -> Result<(String, String, Vec<Value>), String> {
    spec::check_messages(events)?;
    let (mut text, mut thinking, mut tools) = (String::new(), String::new(), Vec::new());
    let mut kind = String::new();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let tail = &names[names.len().saturating_sub(2)..];
    if tail != ["message_delta", "message_stop"] {
        return Err(format!(
            "the stream does not end in message_delta, message_stop: {tail:?}"
        ));
    }
    for (name, v) in events {
        match name.as_str() {
            "content_block_start" => {
                kind = v["content_block"]["type"].as_str().unwrap_or("").to_owned();
                if kind == "tool_use" {
                    let mut b = v["content_block"].clone();
                    b["args"] = json!("");
                    tools.push(b);
                }
            }
            "content_block_delta" => {
                let d = &v["delta"];
                match (kind.as_str(), d["type"].as_str().unwrap_or("")) {
                    ("text", "text_delta") => text.push_str(d["text"].as_str().unwrap_or("")),
                    ("thinking", "thinking_delta") => {
                        thinking.push_str(d["thinking"].as_str().unwrap_or(""))
                    }
                    ("thinking", "signature_delta") => {}
                    ("tool_use", "input_json_delta") => {
                        let last = tools.last_mut().ok_or("no tool block")?;
                        let so_far = last["args"].as_str().unwrap_or("").to_owned();
                        last["args"] = json!(so_far + d["partial_json"].as_str().unwrap_or(""));
                    }
                    (k, t) => return Err(format!("a {t} in a {k} block: {v}")),
                }
            }
            _ => {}
        }
    }
    Ok((text, thinking, tools))
}

/// A Responses stream's grammar beyond `spec`'s: `response.in_progress` second, every
/// `output_index` its item's, arguments deltas and done naming their own item, the done
/// events and the final output carrying each call's full arguments.
fn responses_content(events: &[(String, Value)]) -> Result<(String, String, Vec<Value>), String> {
    spec::check_responses(events)?;
    if events.get(1).map(|e| e.0.as_str()) != Some("response.in_progress") {
        return Err("response.in_progress is not second".into());
    }
    let last = events.last().ok_or("no events")?;
    if last.0 != "response.completed" {
        return Err(format!("the stream ends with {}", last.0));
    }
    let (mut text, mut reasoning) = (String::new(), String::new());
    let mut items: Vec<Value> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    for (name, v) in events {
        let at = v["output_index"].as_u64().map(|i| i as usize);
        match name.as_str() {
            "response.output_item.added" => {
                items.push(v["item"].clone());
                args.push(String::new());
            }
            "response.output_text.delta" => text.push_str(v["delta"].as_str().unwrap_or("")),
            "response.reasoning_text.delta" => {
                reasoning.push_str(v["delta"].as_str().unwrap_or(""))
            }
            "response.function_call_arguments.delta" => {
                let i = at.ok_or("no output_index")?;
                if items[i]["type"] != "function_call" {
                    return Err(format!("arguments for a {} item", items[i]["type"]));
                }
                args[i].push_str(v["delta"].as_str().unwrap_or(""));
            }
            "response.function_call_arguments.done" => {
                let i = at.ok_or("no output_index")?;
                if v["arguments"] != args[i].as_str() {
                    return Err(format!("done with other arguments: {v}"));
                }
            }
            "response.output_item.done" => {
                let i = at.ok_or("no output_index")?;
                if items[i]["type"] == "function_call" && v["item"]["arguments"] != args[i].as_str()
                {
                    return Err(format!("an item done with other arguments: {v}"));
                }
                items[i] = v["item"].clone();
            }
            _ => {}
        }
    }
    let output = last.1["response"]["output"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if output != items {
        return Err("the final output is not the items as done".into());
    }
    let calls = items
        .into_iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    Ok((text, reasoning, calls))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any interleaving of text, reasoning and tool calls over several indexes (ids missing,
    /// arguments cut anywhere between chars, multibyte ones included) becomes a Messages and a
    /// Responses stream that follow each API's grammar, with each call's arguments exactly its
    /// fragments joined, in its own block or item, under a distinct id.
    #[test]
    fn any_chat_stream_translates_to_streams_of_each_apis_grammar(
        calls in gen_calls(),
        text in gen_prose(),
        reasoning in gen_prose(),
        picks in prop::collection::vec((any::<u8>(), any::<bool>()), 1..40),
        field in prop::sample::select(vec!["reasoning_content", "reasoning"]),
    ) {
        let events = chat_events(&calls, &text, &reasoning, &picks, field);
        let (all_text, all_reasoning) = (text.concat(), reasoning.concat());
        // Each call once, by its given id or none, with its name and its fragments joined;
        // the ids distinct, the made ones with the API's prefix.
        let by_call = |found: &[Value], id_key: &str, args_key: &str, prefix: &str| {
            let mut want: Vec<(Option<String>, String, String)> = calls
                .iter()
                .map(|g| (g.id.clone(), g.name.clone(), g.args()))
                .collect();
            let mut got: Vec<(Option<String>, String, String)> = Vec::new();
            let mut ids = HashSet::new();
            for f in found {
                let id = f[id_key].as_str().unwrap_or("").to_owned();
                if !ids.insert(id.clone()) || id.is_empty() {
                    return Err(format!("an id twice or empty: {found:?}"));
                }
                let given = id.starts_with("id").then(|| id.clone());
                if given.is_none() && !id.starts_with(prefix) {
                    return Err(format!("a made id without {prefix}: {id}"));
                }
                let name = f["name"].as_str().unwrap_or("").to_owned();
                got.push((given, name, f[args_key].as_str().unwrap_or("").to_owned()));
            }
            want.sort();
            got.sort();
            if want == got {
                Ok(())
            } else {
                Err(format!("calls {got:?}, sent {want:?}"))
            }
        };

        let mut seen = Seen::default();
        let bytes = translate(&mut messages::from_chat::translation(&ctx()), &events, &mut seen);
        let out = spec::parse_sse(&bytes);
        let (t, r, tools) = messages_content(&out).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&t, &all_text);
        prop_assert_eq!(&r, &all_reasoning);
        by_call(&tools, "id", "args", "toolu_").map_err(TestCaseError::fail)?;
        let stop = &out[out.len() - 2].1["delta"]["stop_reason"];
        prop_assert_eq!(stop, if calls.is_empty() { "end_turn" } else { "tool_use" });

        let mut seen = Seen::default();
        let bytes = translate(&mut responses::from_chat::translation(&ctx()), &events, &mut seen);
        let out = spec::parse_sse(&bytes);
        let (t, r, items) = responses_content(&out).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&t, &all_text);
        prop_assert_eq!(&r, &all_reasoning);
        by_call(&items, "call_id", "arguments", "call_").map_err(TestCaseError::fail)?;
        prop_assert_eq!(seen.usage.map(|u| u.completion), Some(5));
    }
}

/// A chat stream that sends `[DONE]` before any chunk has no answer: neither translation
/// closes a message or response it never opened; both end as a broken stream.
#[test]
fn a_stream_with_no_chunk_before_done_ends_broken_in_either_api() {
    let done = vec!["[DONE]".to_string()];
    let mut seen = Seen::default();
    let bytes = translate(
        &mut messages::from_chat::translation(&ctx()),
        &done,
        &mut seen,
    );
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains(r#""type":"message_delta""#), "{text}");
    assert!(!text.contains(r#""type":"message_stop""#), "{text}");
    assert!(text.starts_with("event: error\n"), "{text}");
    assert!(seen.error.as_deref().unwrap_or("").contains("message_stop"));

    let mut seen = Seen::default();
    let bytes = translate(
        &mut responses::from_chat::translation(&ctx()),
        &done,
        &mut seen,
    );
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains(r#""type":"response.completed""#), "{text}");
    assert!(text.contains("response.failed"), "{text}");
    assert!(seen
        .error
        .as_deref()
        .unwrap_or("")
        .contains("response.completed"));
}

#[test]
fn fields_belong_to_their_apis() {
    use crate::shape::{has_field, is_request_field};
    let (chat, messages) = (&chat::SHAPING, &messages::SHAPING);
    let (responses, completions) = (&responses::SHAPING, &passthrough::COMPLETIONS_SHAPING);
    assert!(has_field(chat, "temperature") && has_field(messages, "temperature"));
    assert!(has_field(responses, "chat_template_kwargs"));
    assert!(has_field(responses, "max_output_tokens") && !has_field(chat, "max_output_tokens"));
    assert!(!has_field(responses, "max_tokens") && has_field(messages, "max_tokens"));
    assert!(has_field(completions, "suffix") && !has_field(chat, "suffix"));
    assert!(is_request_field("model") && is_request_field("images"));
    assert!(!is_request_field("temperature"));
}
