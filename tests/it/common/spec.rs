//! What the Responses and Messages specifications ask of a stream, checked on its events
//! (shared by the integration tests and the wire unit tests).

use serde_json::Value;

/// The named events of an SSE body, as `(event name, data)`.
pub fn parse_sse(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = String::from_utf8_lossy(bytes).replace("\r\n", "\n");
    text.split("\n\n")
        .filter(|e| e.lines().any(|l| l.starts_with("data:")))
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event:"))
                .map(|n| n.trim().to_owned())
                .unwrap_or_default();
            let data = e.lines().find_map(|l| l.strip_prefix("data:")).unwrap();
            let v = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
            (name, v)
        })
        .collect()
}

/// The event types in order.
pub fn types(events: &[(String, Value)]) -> Vec<String> {
    events.iter().map(|(n, _)| n.clone()).collect()
}

fn fail(at: usize, what: &str, v: &Value) -> String {
    format!("event {at}: {what}: {v}")
}

/// A Responses stream to the specification: named by its type, numbered from 0, output items
/// added in order and closed before the next, every content event naming an open item and
/// part of it, the final response listing the items streamed.
pub fn check_responses(events: &[(String, Value)]) -> Result<(), String> {
    let mut items: Vec<(String, bool, usize)> = Vec::new();
    let mut open_part: Option<usize> = None;
    for (at, (name, v)) in events.iter().enumerate() {
        if v["type"] != name.as_str() {
            return Err(fail(at, "name and type differ", v));
        }
        if v["sequence_number"].as_u64() != Some(at as u64) {
            return Err(fail(at, "sequence_number", v));
        }
        if at == 0 && name != "response.created" {
            return Err(fail(at, "the first event is not response.created", v));
        }
        let index = v["output_index"].as_u64().map(|i| i as usize);
        match name.as_str() {
            "response.output_item.added" => {
                if items.last().is_some_and(|i| i.1) || index != Some(items.len()) {
                    return Err(fail(at, "an item added out of order", v));
                }
                let id = v["item"]["id"].as_str().unwrap_or("").to_owned();
                items.push((id, true, 0));
                open_part = None;
            }
            "response.output_item.done" => {
                let Some(it) = index.and_then(|i| items.get_mut(i)).filter(|i| i.1) else {
                    return Err(fail(at, "done for an item not open", v));
                };
                if open_part.is_some() || v["item"]["id"] != it.0.as_str() {
                    return Err(fail(at, "done with a part open, or another id", v));
                }
                it.1 = false;
            }
            n if n.starts_with("response.content_part.")
                || n.ends_with("_text.delta")
                || n.ends_with("_text.done")
                || n.starts_with("response.function_call_arguments.") =>
            {
                let Some(it) = index.and_then(|i| items.get_mut(i)).filter(|i| i.1) else {
                    return Err(fail(at, "content of an item not open", v));
                };
                if v["item_id"] != it.0.as_str() {
                    return Err(fail(at, "item_id is not the item's", v));
                }
                if n.starts_with("response.function_call_arguments.") {
                    continue;
                }
                let ci = v["content_index"].as_u64().map(|c| c as usize);
                match n {
                    "response.content_part.added" => {
                        if open_part.is_some() || ci != Some(it.2) {
                            return Err(fail(at, "a part added out of order", v));
                        }
                        open_part = ci;
                        it.2 += 1;
                    }
                    _ if ci.is_none() || ci != open_part => {
                        return Err(fail(at, "content_index is not the open part's", v));
                    }
                    "response.content_part.done" => open_part = None,
                    "response.output_text.delta" | "response.output_text.done"
                        if !v["logprobs"].is_array() =>
                    {
                        return Err(fail(at, "no logprobs", v));
                    }
                    _ => {}
                }
            }
            "response.completed" | "response.failed" | "response.incomplete" => {
                let out = v["response"]["output"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let ids: Vec<&str> = out.iter().map(|o| o["id"].as_str().unwrap_or("")).collect();
                let streamed: Vec<&str> = items.iter().map(|i| i.0.as_str()).collect();
                if name == "response.completed" && (ids != streamed || items.iter().any(|i| i.1)) {
                    return Err(fail(at, "the final output is not the items streamed", v));
                }
                if v["response"]["id"] != events[0].1["response"]["id"] {
                    return Err(fail(at, "the response id changed", v));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A Messages stream to the specification: `message_start` first, one content block at a
/// time with indices 0, 1, … in order, a thinking block signed before it stops,
/// `message_delta` then `message_stop` last.
pub fn check_messages(events: &[(String, Value)]) -> Result<(), String> {
    let mut open: Option<(u64, String, bool)> = None;
    let mut next = 0;
    for (at, (name, v)) in events.iter().enumerate() {
        if v["type"] != name.as_str() {
            return Err(fail(at, "name and type differ", v));
        }
        if at == 0 && name != "message_start" {
            return Err(fail(at, "the first event is not message_start", v));
        }
        let index = v["index"].as_u64();
        match name.as_str() {
            "content_block_start" => {
                if open.is_some() || index != Some(next) {
                    return Err(fail(at, "a block started out of order", v));
                }
                let kind = v["content_block"]["type"].as_str().unwrap_or("").to_owned();
                if kind == "tool_use" && !v["content_block"]["input"].is_object() {
                    return Err(fail(at, "a tool_use block starts without input", v));
                }
                open = Some((next, kind, false));
                next += 1;
            }
            "content_block_delta" => match open.as_mut() {
                Some((i, _, signed)) if index == Some(*i) => {
                    *signed |= v["delta"]["type"] == "signature_delta";
                }
                _ => return Err(fail(at, "a delta outside its block", v)),
            },
            "content_block_stop" => match open.take() {
                Some((i, kind, signed)) if index == Some(i) => {
                    if kind == "thinking" && !signed {
                        return Err(fail(at, "a thinking block stopped unsigned", v));
                    }
                }
                _ => return Err(fail(at, "a stop outside its block", v)),
            },
            "message_delta" | "message_stop" if open.is_some() => {
                return Err(fail(at, "the message ends with a block open", v));
            }
            _ => {}
        }
    }
    match events.last() {
        Some((n, _)) if n == "message_stop" || n == "error" => Ok(()),
        _ => Err("the stream does not end with message_stop".into()),
    }
}
