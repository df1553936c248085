//! vLLM's and SGLang's request preparation before HF `apply_chat_template` runs.

use std::sync::Arc;

use super::{
    add_kwargs, add_specials, classify, invalid, message_role, parse_arguments, Media, Part, Post,
    Prepared,
};
use crate::tokens::json::{JMap, J};
use crate::tokens::template::ChatTemplate;
use crate::tokens::CountError;

/// Part types whose text vLLM reads besides `text`.
const VLLM_TEXT: &[&str] = &[
    "input_text",
    "output_text",
    "refusal",
    "thinking",
    "tool_reference",
];

/// vLLM (`chat_utils.parse_chat_messages` + `_postprocess_messages`, `tool.model_dump()`).
pub(super) fn prepare_vllm(
    req: &JMap,
    messages: &[J],
    tmpl: &ChatTemplate,
) -> Result<Prepared, CountError> {
    // "openai" content format when the template reads typed parts, else "string".
    let openai_format = tmpl.caps.typed_content;
    let mut media = Media::default();
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let (m, role) = message_role(m)?;
        let texts = texts(m.get("content"), VLLM_TEXT, &mut media)?;
        let mut msg = JMap::default();
        msg.insert("role", J::str(role));
        msg.insert(
            "content",
            if openai_format {
                typed(texts)
            } else {
                J::str(&texts.join("\n"))
            },
        );
        if role == "assistant" {
            if let Some(J::Arr(calls)) = m.get("tool_calls") {
                if !calls.0.is_empty() {
                    let calls = calls.0.iter().map(vllm_call).collect();
                    msg.insert("tool_calls", J::arr(calls));
                }
            }
            let reasoning = m
                .get("reasoning")
                .filter(|r| !r.is_null())
                .or_else(|| m.get("reasoning_content").filter(|r| !r.is_null()));
            if let Some(r) = reasoning {
                msg.insert("reasoning", r.clone());
                msg.insert("reasoning_content", r.clone());
            }
        } else if role == "tool" {
            if let Some(id) = m.get("tool_call_id") {
                msg.insert("tool_call_id", id.clone());
            }
        }
        if let Some(J::Str(name)) = m.get("name") {
            msg.insert("name", J::Str(name.clone()));
        }
        if role == "developer" {
            msg.insert("tools", m.get("tools").cloned().unwrap_or(J::Null));
        }
        out.push(J::Obj(Arc::new(msg)));
    }

    let mut vars = JMap::default();
    let tools = match req.get("tools") {
        Some(J::Arr(tools)) => Some(J::arr(tools.0.iter().map(vllm_tool).collect())),
        _ => None,
    };
    let continue_final = matches!(req.get("continue_final_message"), Some(J::Bool(true)));
    let add_gen = !matches!(req.get("add_generation_prompt"), Some(J::Bool(false)));
    let final_text = continue_final
        .then(|| last_text(&out))
        .flatten()
        .map(|s| Arc::from(s.trim()));
    vars.insert("messages", J::arr(out));
    let tool_use = tools
        .as_ref()
        .is_some_and(|t| !t.as_arr().unwrap_or(&[]).is_empty());
    vars.insert("tools", tools.unwrap_or(J::Null));
    vars.insert(
        "documents",
        req.get("documents").cloned().unwrap_or(J::Null),
    );
    vars.insert("add_generation_prompt", J::Bool(add_gen && !continue_final));
    add_specials(&mut vars, tmpl);
    add_kwargs(&mut vars, req);
    Ok(Prepared {
        vars,
        tool_use,
        post: final_text.map_or(Post::None, Post::TruncateAfter),
        media,
    })
}

/// SGLang (`serving_chat._apply_jinja_template`, `process_content_for_template_format`).
pub(super) fn prepare_sglang(
    req: &JMap,
    messages: &[J],
    tmpl: &ChatTemplate,
) -> Result<Prepared, CountError> {
    let openai_format = tmpl.caps.typed_content;
    let mut media = Media::default();
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let (m, role) = message_role(m)?;
        let role = role.to_lowercase();
        let mut msg = JMap::default();
        msg.insert("role", J::str(&role));
        let content = match m.get("content") {
            Some(J::Arr(_)) => {
                let texts = texts(m.get("content"), &["input_text"], &mut media)?;
                if openai_format {
                    typed(texts)
                } else {
                    J::str(&texts.join(" "))
                }
            }
            Some(J::Str(s)) => J::Str(s.clone()),
            _ => J::str(""),
        };
        msg.insert("content", content);
        for key in ["tool_call_id", "name", "reasoning_content"] {
            if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
                msg.insert(key, v.clone());
            }
        }
        if let Some(J::Arr(calls)) = m.get("tool_calls") {
            let calls = calls
                .0
                .iter()
                .map(|c| sglang_call(c, role == "assistant"))
                .collect::<Result<Vec<_>, _>>()?;
            msg.insert("tool_calls", J::arr(calls));
        }
        out.push(J::Obj(Arc::new(msg)));
    }
    let continue_final = matches!(req.get("continue_final_message"), Some(J::Bool(true)));
    let mut post = Post::None;
    if let Some(J::Obj(last)) = out.last() {
        if last.get("role").and_then(J::as_str) == Some("assistant") {
            if let Some(J::Str(text)) = last.get("content") {
                let text = text.clone();
                if continue_final {
                    post = Post::Append(text.to_string());
                    out.pop();
                } else if let Some(slot) = out.last_mut() {
                    *slot = J::obj([("role", J::str("user")), ("content", J::Str(text))]);
                }
            }
        }
    }
    let tool_choice_none = req.get("tool_choice").and_then(J::as_str) == Some("none")
        || (req.get("tool_choice").is_none() && req.get("tools").is_none());
    let tools = match req.get("tools") {
        Some(J::Arr(tools)) if !tool_choice_none => Some(J::arr(
            tools.0.iter().map(sglang_tool).collect::<Result<_, _>>()?,
        )),
        _ => None,
    };
    let mut vars = JMap::default();
    vars.insert("messages", J::arr(out));
    let tool_use = tools
        .as_ref()
        .is_some_and(|t| !t.as_arr().unwrap_or(&[]).is_empty());
    vars.insert("tools", tools.unwrap_or(J::Null));
    vars.insert("documents", J::Null);
    vars.insert("add_generation_prompt", J::Bool(true));
    add_specials(&mut vars, tmpl);
    if let Some(effort) = req.get("reasoning_effort").filter(|v| !v.is_null()) {
        vars.insert("reasoning_effort", effort.clone());
    }
    add_kwargs(&mut vars, req);
    Ok(Prepared {
        vars,
        tool_use,
        post,
        media,
    })
}

/// The texts of a message's content (a string is one text), media counted and dropped.
fn texts(
    content: Option<&J>,
    extra: &[&str],
    media: &mut Media,
) -> Result<Vec<String>, CountError> {
    Ok(match content {
        Some(J::Str(s)) => vec![s.to_string()],
        Some(J::Arr(parts)) => {
            let mut out = Vec::with_capacity(parts.0.len());
            for part in &parts.0 {
                match classify(part, extra) {
                    Part::Text(t) => out.push(t.to_string()),
                    Part::Image => media.images += 1,
                    Part::Audio => media.audio += 1,
                    Part::Skip => {}
                }
            }
            out
        }
        Some(J::Null) | None => Vec::new(),
        Some(_) => return Err(invalid("content must be a string or an array")),
    })
}

fn typed(texts: Vec<String>) -> J {
    J::arr(
        texts
            .into_iter()
            .map(|t| J::obj([("type", J::str("text")), ("text", J::str(&t))]))
            .collect(),
    )
}

fn last_text(out: &[J]) -> Option<String> {
    match out.last()?.as_obj()?.get("content")? {
        J::Str(s) => Some(s.to_string()),
        J::Arr(parts) => parts
            .0
            .last()?
            .as_obj()?
            .get("text")?
            .as_str()
            .map(str::to_owned),
        _ => None,
    }
}

/// vLLM parses string arguments (`{}` when they are not JSON) so templates see objects.
fn vllm_call(call: &J) -> J {
    let J::Obj(c) = call else { return call.clone() };
    let Some(J::Obj(f)) = c.get("function") else {
        return call.clone();
    };
    let args = match f.get("arguments") {
        Some(J::Str(s)) => parse_arguments(s).unwrap_or_else(empty_obj),
        Some(v @ (J::Obj(_) | J::Arr(_))) => v.clone(),
        _ => empty_obj(),
    };
    let mut f = (**f).clone();
    f.insert("arguments", args);
    let mut c = (**c).clone();
    c.insert("function", J::Obj(Arc::new(f)));
    J::Obj(Arc::new(c))
}

/// SGLang parses assistant string arguments and insists on an object.
fn sglang_call(call: &J, assistant: bool) -> Result<J, CountError> {
    let c = call
        .as_obj()
        .ok_or_else(|| invalid("a tool call must be an object"))?;
    let mut f = c
        .get("function")
        .and_then(J::as_obj)
        .cloned()
        .ok_or_else(|| invalid("a tool call needs a function"))?;
    if assistant {
        if let Some(J::Str(s)) = f.get("arguments") {
            let parsed = parse_arguments(s)
                .filter(|a| a.as_obj().is_some())
                .ok_or_else(|| {
                    invalid("Assistant tool call function.arguments must be a JSON object.")
                })?;
            f.insert("arguments", parsed);
        }
    }
    let mut func = JMap::default();
    func.insert("name", f.get("name").cloned().unwrap_or(J::Null));
    func.insert("arguments", f.get("arguments").cloned().unwrap_or(J::Null));
    Ok(J::obj([
        ("id", c.get("id").cloned().unwrap_or(J::Null)),
        ("index", c.get("index").cloned().unwrap_or(J::Null)),
        ("type", J::str("function")),
        ("function", J::Obj(Arc::new(func))),
    ]))
}

fn empty_obj() -> J {
    J::Obj(Arc::new(JMap::default()))
}

/// vLLM's `ChatCompletionToolsParam.model_dump()`: declared fields first (with `None`
/// defaults), then any extra fields the client sent.
fn vllm_tool(t: &J) -> J {
    let Some(t) = t.as_obj() else {
        return t.clone();
    };
    let mut out = JMap::default();
    out.insert(
        "type",
        t.get("type").cloned().unwrap_or_else(|| J::str("function")),
    );
    let mut func = JMap::default();
    if let Some(J::Obj(f)) = t.get("function") {
        for key in ["name", "description", "parameters"] {
            func.insert(key, f.get(key).cloned().unwrap_or(J::Null));
        }
        for (k, v) in &f.0 {
            func.insert(k, v.clone());
        }
    }
    out.insert("function", J::Obj(Arc::new(func)));
    for (k, v) in &t.0 {
        if &**k != "type" && &**k != "function" {
            out.insert(k, v.clone());
        }
    }
    J::Obj(Arc::new(out))
}

/// SGLang's `Tool.model_dump()`.
fn sglang_tool(t: &J) -> Result<J, CountError> {
    let t = t
        .as_obj()
        .ok_or_else(|| invalid("a tool must be an object"))?;
    let f = t
        .get("function")
        .and_then(J::as_obj)
        .ok_or_else(|| invalid("a tool needs a function"))?;
    let mut func = JMap::default();
    func.insert(
        "description",
        f.get("description").cloned().unwrap_or(J::Null),
    );
    func.insert("name", f.get("name").cloned().unwrap_or(J::Null));
    func.insert(
        "parameters",
        f.get("parameters").cloned().unwrap_or(J::Null),
    );
    func.insert("strict", f.get("strict").cloned().unwrap_or(J::Bool(false)));
    let defer = f
        .get("defer_loading")
        .or_else(|| t.get("defer_loading"))
        .filter(|v| !v.is_null());
    if let Some(d) = defer {
        func.insert("defer_loading", d.clone());
    }
    Ok(J::obj([
        (
            "type",
            t.get("type").cloned().unwrap_or_else(|| J::str("function")),
        ),
        ("function", J::Obj(Arc::new(func))),
        (
            "defer_loading",
            t.get("defer_loading").cloned().unwrap_or(J::Null),
        ),
    ]))
}
