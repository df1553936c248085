//! llama.cpp's request preparation (`tools/server` + `common/chat.cpp`) before its Jinja engine runs.

use std::sync::Arc;

use super::{
    add_kwargs, classify, invalid, message_role, parse_arguments, Media, Part, Post, Prepared,
};
use crate::tokens::json::{JMap, J};
use crate::tokens::template::ChatTemplate;
use crate::tokens::CountError;

pub(super) fn prepare(
    req: &JMap,
    messages: &[J],
    tmpl: &ChatTemplate,
) -> Result<Prepared, CountError> {
    let mut media = Media::default();
    let mut out: Vec<J> = messages
        .iter()
        .map(|m| message(m, tmpl, &mut media))
        .collect::<Result<_, _>>()?;
    if !tmpl.caps.system_role {
        merge_system(&mut out);
    }
    let last_is_assistant = out
        .last()
        .and_then(|m| m.as_obj()?.get("role")?.as_str().map(|r| r == "assistant"))
        .unwrap_or(false);
    let mut add_gen = !matches!(req.get("add_generation_prompt"), Some(J::Bool(false)));
    let mut post = Post::None;
    if last_is_assistant && !matches!(req.get("continue_final_message"), Some(J::Bool(false))) {
        // `--prefill-assistant` (on by default): the last assistant message is continued.
        if let Some(J::Obj(last)) = out.pop() {
            post = prefill(&last);
        }
        add_gen = false;
    }
    let (vars, tool_use) = template_vars(req, tmpl, out, add_gen)?;
    Ok(Prepared {
        vars,
        tool_use,
        post,
        media,
    })
}

/// One message as llama.cpp hands it to the template: role, content in the form the template
/// takes (string or typed parts), reasoning, name, tool call id and calls.
fn message(m: &J, tmpl: &ChatTemplate, media: &mut Media) -> Result<J, CountError> {
    let caps = tmpl.caps;
    let only_string = caps.string_content && !caps.typed_content;
    let only_typed = !caps.string_content && caps.typed_content;
    let (m, role) = message_role(m)?;
    if m.get("content").is_none() && m.get("tool_calls").is_none() {
        return Err(invalid("a message needs content or tool_calls"));
    }
    let mut msg = JMap::default();
    let role = if role == "developer" && !tmpl.harmony {
        "system"
    } else {
        role
    };
    msg.insert("role", J::str(role));
    let content = match m.get("content") {
        Some(J::Str(s)) => J::Str(s.clone()),
        Some(J::Arr(parts)) => content_parts(&parts.0, only_string, media)?,
        Some(J::Null) | None => J::str(""),
        Some(_) => return Err(invalid("content must be a string or an array")),
    };
    let content = match content {
        J::Str(s) if only_typed => J::arr(vec![text_part(s)]),
        J::Arr(parts) if only_string => J::Str(Arc::from(join_typed(&parts.0))),
        other => other,
    };
    msg.insert("content", content);
    for key in ["reasoning_content", "name", "tool_call_id"] {
        if let Some(J::Str(s)) = m.get(key) {
            if !s.is_empty() {
                msg.insert(key, J::Str(s.clone()));
            }
        }
    }
    if let Some(J::Arr(calls)) = m.get("tool_calls") {
        let calls = calls
            .0
            .iter()
            .map(|c| tool_call(c, caps.object_arguments))
            .collect::<Result<Vec<_>, _>>()?;
        if !calls.is_empty() {
            msg.insert("tool_calls", J::arr(calls));
        }
    }
    Ok(J::Obj(Arc::new(msg)))
}

/// The last assistant message, continued rather than templated: its text and reasoning.
fn prefill(last: &JMap) -> Post {
    let content = match last.get("content") {
        Some(J::Str(s)) => s.to_string(),
        Some(J::Arr(parts)) => join_typed(&parts.0),
        _ => String::new(),
    };
    let reasoning = last
        .get("reasoning_content")
        .and_then(J::as_str)
        .unwrap_or("")
        .to_string();
    Post::Prefill { reasoning, content }
}

/// The template's variables: messages, special tokens, thinking switch, tools, dates, the
/// request's `chat_template_kwargs` and reasoning effort. Also whether tools are in use.
fn template_vars(
    req: &JMap,
    tmpl: &ChatTemplate,
    messages: Vec<J>,
    add_gen: bool,
) -> Result<(JMap, bool), CountError> {
    let mut vars = JMap::default();
    vars.insert("messages", J::arr(messages));
    vars.insert(
        "bos_token",
        special(tmpl, "bos_token").unwrap_or_else(|| J::str("")),
    );
    vars.insert(
        "eos_token",
        special(tmpl, "eos_token").unwrap_or_else(|| J::str("")),
    );
    let mut enable_thinking = true;
    if let Some(J::Obj(kw)) = req.get("chat_template_kwargs") {
        if let Some(J::Bool(b)) = kw.get("enable_thinking") {
            enable_thinking = *b;
        }
    }
    if req.get("reasoning_effort").and_then(J::as_str) == Some("none") {
        enable_thinking = false;
    }
    vars.insert("enable_thinking", J::Bool(enable_thinking));
    let tools = match req.get("tools") {
        Some(J::Arr(tools)) if !tools.0.is_empty() => {
            Some(tools.0.iter().map(tool).collect::<Result<Vec<_>, _>>()?)
        }
        _ => None,
    };
    let tool_use = tools.is_some();
    if let Some(tools) = tools {
        vars.insert("tools", J::arr(tools));
    }
    let (datetime, date) = dates();
    vars.insert("datetime", J::str(&datetime));
    vars.insert("date_string", J::str(&date));
    add_kwargs(&mut vars, req);
    match req.get("reasoning_effort").and_then(J::as_str) {
        Some("none") => {
            vars.remove("reasoning_effort");
        }
        Some(effort) if !effort.is_empty() => vars.insert("reasoning_effort", J::str(effort)),
        _ => {}
    }
    if add_gen {
        vars.insert("add_generation_prompt", J::Bool(true));
    }
    Ok((vars, tool_use))
}

fn special(tmpl: &ChatTemplate, key: &str) -> Option<J> {
    tmpl.specials
        .iter()
        .find(|(k, _)| &**k == key)
        .map(|(_, v)| v.clone())
}

fn text_part(s: Arc<str>) -> J {
    J::obj([("type", J::str("text")), ("text", J::Str(s))])
}

/// Text parts, with media parts counted and removed. Joined when the template takes only
/// strings or media was present (llama.cpp then joins with `"\n"`, except next to media).
fn content_parts(parts: &[J], only_string: bool, media: &mut Media) -> Result<J, CountError> {
    let mut texts: Vec<(bool, Arc<str>)> = Vec::with_capacity(parts.len());
    let mut had_media = false;
    for part in parts {
        match classify(part, &[]) {
            Part::Text(t) => texts.push((false, Arc::from(t))),
            Part::Image => {
                media.images += 1;
                had_media = true;
                texts.push((true, Arc::from("")));
            }
            Part::Audio => {
                media.audio += 1;
                had_media = true;
                texts.push((true, Arc::from("")));
            }
            Part::Skip => {
                let typed_text = part
                    .as_obj()
                    .and_then(|p| p.get("type"))
                    .and_then(J::as_str)
                    == Some("text");
                if typed_text {
                    return Err(invalid("a text content part needs a string text"));
                }
            }
        }
    }
    if had_media || only_string {
        let mut text = String::new();
        let mut after_media = false;
        for (is_media, t) in &texts {
            if *is_media {
                after_media = true;
                continue;
            }
            if !after_media && !text.is_empty() {
                text.push('\n');
            }
            after_media = false;
            text.push_str(t);
        }
        return Ok(J::Str(Arc::from(text)));
    }
    Ok(J::arr(
        texts
            .into_iter()
            .filter(|(m, _)| !m)
            .map(|(_, t)| text_part(t))
            .collect(),
    ))
}

/// Joins `{type: "text"}` parts the way llama.cpp does for string-only templates.
fn join_typed(parts: &[J]) -> String {
    let mut text = String::new();
    for p in parts {
        let Some(p) = p.as_obj() else { continue };
        if p.get("type").and_then(J::as_str) != Some("text") {
            continue;
        }
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(p.get("text").and_then(J::as_str).unwrap_or(""));
    }
    text
}

fn tool_call(call: &J, object_arguments: bool) -> Result<J, CountError> {
    let c = call
        .as_obj()
        .ok_or_else(|| invalid("a tool call must be an object"))?;
    if c.get("type").and_then(J::as_str) != Some("function") {
        return Err(invalid("tool calls must have type \"function\""));
    }
    let f = c
        .get("function")
        .and_then(J::as_obj)
        .ok_or_else(|| invalid("a tool call needs a function"))?;
    let name = f
        .get("name")
        .and_then(J::as_str)
        .ok_or_else(|| invalid("a tool call needs a function name"))?;
    let args_text = match f.get("arguments") {
        Some(J::Str(s)) => s.to_string(),
        Some(other) => compact(other),
        None => return Err(invalid("a tool call needs arguments")),
    };
    let arguments = if object_arguments {
        parse_arguments(&args_text)
            .ok_or_else(|| invalid("tool call arguments are not valid JSON"))?
    } else {
        J::str(&args_text)
    };
    let mut out = JMap::default();
    out.insert("type", J::str("function"));
    out.insert(
        "function",
        J::obj([("name", J::str(name)), ("arguments", arguments)]),
    );
    if let Some(J::Str(id)) = c.get("id") {
        if !id.is_empty() {
            out.insert("id", J::Str(id.clone()));
        }
    }
    Ok(J::Obj(Arc::new(out)))
}

/// A tool as llama.cpp rebuilds it: `{type, function: {name, description, parameters}}`.
fn tool(t: &J) -> Result<J, CountError> {
    let t = t
        .as_obj()
        .ok_or_else(|| invalid("a tool must be an object"))?;
    if t.get("type").and_then(J::as_str) != Some("function") {
        return Err(invalid("tools must have type \"function\""));
    }
    let f = t
        .get("function")
        .and_then(J::as_obj)
        .ok_or_else(|| invalid("a tool needs a function"))?;
    let name = f
        .get("name")
        .and_then(J::as_str)
        .ok_or_else(|| invalid("a tool needs a function name"))?;
    let description = match f.get("description") {
        Some(J::Str(s)) => J::Str(s.clone()),
        Some(other) => other.clone(),
        None => J::str(""),
    };
    let parameters = f
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| J::Obj(Arc::new(JMap::default())));
    Ok(J::obj([
        ("type", J::str("function")),
        (
            "function",
            J::obj([
                ("name", J::str(name)),
                ("description", description),
                ("parameters", parameters),
            ]),
        ),
    ]))
}

/// A first system message the template ignores is merged into the next message.
fn merge_system(out: &mut Vec<J>) {
    let is_system = out
        .first()
        .and_then(|m| m.as_obj()?.get("role")?.as_str().map(|r| r == "system"))
        .unwrap_or(false);
    if !is_system {
        return;
    }
    let first = out.remove(0);
    let Some(next) = out.first_mut() else { return };
    let (Some(sys), J::Obj(next_map)) = (first.as_obj(), next) else {
        return;
    };
    let sys_text = sys.get("content").and_then(J::as_str).unwrap_or("");
    let next_text = next_map.get("content").and_then(J::as_str).unwrap_or("");
    let merged = format!("{sys_text}\n{next_text}");
    Arc::make_mut(next_map).insert("content", J::str(&merged));
}

/// Compact JSON, as nlohmann's `dump()` writes it.
fn compact(j: &J) -> String {
    let mut out = String::new();
    write_compact(&mut out, j);
    out
}

fn write_compact(out: &mut String, j: &J) {
    match j {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Int(i) => out.push_str(&i.to_string()),
        J::UInt(u) => out.push_str(&u.to_string()),
        J::Float(f) => out.push_str(&serde_json::Value::from(*f).to_string()),
        J::Str(s) => out.push_str(&serde_json::Value::from(&**s).to_string()),
        J::Arr(a) => {
            out.push('[');
            for (i, v) in a.0.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_compact(out, v);
            }
            out.push(']');
        }
        J::Obj(m) => {
            out.push('{');
            for (i, (k, v)) in m.0.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::from(&**k).to_string());
                out.push(':');
                write_compact(out, v);
            }
            out.push('}');
        }
    }
}

/// llama.cpp's `datetime` ("%b %d %Y") and `date_string` ("%d %b %Y") template variables.
fn dates() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let (y, m, d) = crate::tokens::template::civil_from_days(days);
    const MON: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mon = MON[usize::try_from(m - 1).unwrap_or(0) % 12];
    (format!("{mon} {d:02} {y}"), format!("{d:02} {mon} {y}"))
}
