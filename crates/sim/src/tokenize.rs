//! The simulator's own chat template and tokenizer: deterministic, cheap and documented.
//!
//! Template (ChatML-like), rendered by [`render_chat`]:
//! - when `tools` is a non-empty array: `<|im_start|>system\n# Tools\n` then each tool as
//!   compact JSON on its own line, then `<|im_end|>\n`;
//! - each message: `<|im_start|>{role}\n{content}<|im_end|>\n`, where a content list keeps
//!   its text parts joined with `"\n"` (other parts are ignored) and an assistant's
//!   `tool_calls` follow the content as `\n<tool_call>\n{"name":…,"arguments":…}\n</tool_call>`;
//! - unless `add_generation_prompt` is false: `<|im_start|>assistant\n`, followed by
//!   `<think>\n\n</think>\n\n` when `chat_template_kwargs.enable_thinking` is false.
//!
//! Tokens, from [`pieces`]: every special marker ([`SPECIALS`]) is one token (when
//! special parsing is on); between markers every maximal run of non-whitespace characters
//! is one token whose piece carries the whitespace before it. Whitespace after the last
//! word before a marker (or the end) belongs to no token. So a text never has more tokens
//! than bytes, and rendering then tokenizing always gives the count used for `usage`,
//! `/tokenize` and context errors.

use serde_json::Value;

use switchboard_wire::flavor::Flavor;

/// Special markers and their token ids (Qwen-like ids).
pub(crate) const SPECIALS: [(&str, u32); 5] = [
    ("<|endoftext|>", 151_643),
    ("<|im_start|>", 151_644),
    ("<|im_end|>", 151_645),
    ("<think>", 151_667),
    ("</think>", 151_668),
];

/// Ids of ordinary pieces are a hash of the piece below this bound.
const WORD_IDS: u64 = 151_643;

/// One token of a text: its id and the exact piece of text it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token<'a> {
    pub(crate) id: u32,
    pub(crate) piece: &'a str,
}

/// Calls `f` for each token of `text`, in order.
pub(crate) fn pieces<'a>(text: &'a str, parse_special: bool, mut f: impl FnMut(Token<'a>)) {
    let mut rest = text;
    while !rest.is_empty() {
        let (segment, special) = if parse_special {
            split_at_special(rest)
        } else {
            (rest, None)
        };
        words(segment, &mut f);
        match special {
            Some((piece, id)) => {
                f(Token { id, piece });
                rest = &rest[segment.len() + piece.len()..];
            }
            None => break,
        }
    }
}

/// The number of tokens of `text`.
pub(crate) fn count(text: &str, parse_special: bool) -> u32 {
    let mut n = 0u32;
    pieces(text, parse_special, |_| n = n.saturating_add(1));
    n
}

/// The token ids of `text`.
pub(crate) fn ids(text: &str, parse_special: bool) -> Vec<u32> {
    let mut out = Vec::new();
    pieces(text, parse_special, |t| out.push(t.id));
    out
}

/// The text before the first special marker, and that marker with its id.
fn split_at_special(text: &str) -> (&str, Option<(&'static str, u32)>) {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(at) = memchr::memchr(b'<', &bytes[from..]) {
        let at = from + at;
        if let Some(&(piece, id)) = SPECIALS.iter().find(|(s, _)| text[at..].starts_with(s)) {
            return (&text[..at], Some((piece, id)));
        }
        from = at + 1;
    }
    (text, None)
}

fn words<'a>(segment: &'a str, f: &mut impl FnMut(Token<'a>)) {
    let mut start = 0;
    let mut in_word = false;
    for (i, c) in segment.char_indices() {
        if c.is_whitespace() {
            if in_word {
                f(word(&segment[start..i]));
                start = i;
                in_word = false;
            }
        } else {
            in_word = true;
        }
    }
    if in_word {
        f(word(&segment[start..]));
    }
}

fn word(piece: &str) -> Token<'_> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in piece.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let id = u32::try_from(h % WORD_IDS).unwrap_or(0);
    Token { id, piece }
}

/// Renders a chat body's `messages` (and `tools`) with the simulator's template.
pub(crate) fn render_chat(body: &Value) -> String {
    let mut out = String::with_capacity(256);
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        if !tools.is_empty() {
            out.push_str("<|im_start|>system\n# Tools");
            for tool in tools {
                out.push('\n');
                out.push_str(&tool.to_string());
            }
            out.push_str("<|im_end|>\n");
        }
    }
    for msg in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or("user");
        out.push_str("<|im_start|>");
        out.push_str(role);
        out.push('\n');
        push_content(&mut out, msg.get("content"));
        for call in msg
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let func = call.get("function").unwrap_or(call);
            let call = serde_json::json!({
                "name": func.get("name").unwrap_or(&Value::Null),
                "arguments": func.get("arguments").unwrap_or(&Value::Null),
            });
            out.push_str("\n<tool_call>\n");
            out.push_str(&call.to_string());
            out.push_str("\n</tool_call>");
        }
        out.push_str("<|im_end|>\n");
    }
    let generation_prompt = body.get("add_generation_prompt").and_then(Value::as_bool);
    if generation_prompt.unwrap_or(true) {
        out.push_str("<|im_start|>assistant\n");
        if !thinking_enabled(body) {
            out.push_str("<think>\n\n</think>\n\n");
        }
    }
    out
}

/// False when the request turns thinking off with `chat_template_kwargs.enable_thinking`.
pub(crate) fn thinking_enabled(body: &Value) -> bool {
    body.get("chat_template_kwargs")
        .and_then(|k| k.get("enable_thinking"))
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

fn push_content(out: &mut String, content: Option<&Value>) {
    match content {
        Some(Value::String(s)) => out.push_str(s),
        Some(Value::Array(parts)) => {
            let mut first = true;
            for part in parts {
                let text = match part {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str),
                    _ => None,
                };
                if let Some(text) = text {
                    if !first {
                        out.push('\n');
                    }
                    out.push_str(text);
                    first = false;
                }
            }
        }
        _ => {}
    }
}

/// The simulator's prompt token count for a chat body (`messages`) or a completion body
/// (`prompt`: a string, a list of strings, or token ids). The same for every flavour.
pub fn count_prompt_tokens(_flavor: Flavor, body: &Value) -> u32 {
    if body.get("messages").is_some_and(Value::is_array) {
        return count(&render_chat(body), true);
    }
    match body.get("prompt") {
        Some(p) => count_prompt(p),
        None => 0,
    }
}

/// A prompt as token ids, and the whitespace its text ends with (it starts the first piece
/// generated after it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PromptIds {
    pub(crate) ids: Vec<u32>,
    pub(crate) tail: String,
}

/// The prompt of a chat or completion body as token ids: as many as [`count_prompt_tokens`]
/// counts, and equal prompt prefixes give equal id prefixes (one id per piece).
pub(crate) fn prompt_ids(body: &Value) -> PromptIds {
    let mut out = PromptIds::default();
    if body.get("messages").is_some_and(Value::is_array) {
        push_text(&mut out, &render_chat(body));
    } else if let Some(p) = body.get("prompt") {
        push_prompt(&mut out, p);
    }
    out
}

fn push_text(out: &mut PromptIds, text: &str) {
    pieces(text, true, |t| out.ids.push(t.id));
    out.tail = text[text.trim_end().len()..].to_owned();
}

fn push_prompt(out: &mut PromptIds, prompt: &Value) {
    match prompt {
        Value::String(s) => push_text(out, s),
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::Number(n) => {
                        let id = n.as_u64().and_then(|n| u32::try_from(n).ok());
                        out.ids.push(id.unwrap_or(0));
                        out.tail.clear();
                    }
                    other => push_prompt(out, other),
                }
            }
        }
        _ => {}
    }
}

fn count_prompt(prompt: &Value) -> u32 {
    match prompt {
        Value::String(s) => count(s, true),
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Number(_) => 1,
                other => count_prompt(other),
            })
            .fold(0u32, u32::saturating_add),
        _ => 0,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chatml_render_matches_the_documented_template() {
        let body = json!({"messages":[
            {"role":"system","content":"You are a test."},
            {"role":"user","content":[{"type":"text","text":"Hello!"},{"type":"image_url"},{"type":"text","text":"Say hi."}]}
        ]});
        assert_eq!(
            render_chat(&body),
            "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHello!\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
        );
        // 5 markers + system You are a test. (5) + user Hello! Say hi. (4) + assistant (1)
        assert_eq!(count_prompt_tokens(Flavor::Llamacpp, &body), 15);
    }

    #[test]
    fn thinking_off_adds_the_empty_think_block() {
        let body = json!({"messages":[{"role":"user","content":"hi"}],
            "chat_template_kwargs":{"enable_thinking":false}});
        assert!(render_chat(&body).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }

    #[test]
    fn pieces_cover_words_with_leading_whitespace() {
        let mut got = Vec::new();
        pieces("Hello world! <think>x</think><|im_end|>  ", true, |t| {
            got.push(t.piece)
        });
        assert_eq!(
            got,
            ["Hello", " world!", "<think>", "x", "</think>", "<|im_end|>"]
        );
        assert_eq!(count("<|im_start|>user", false), 1);
        assert_eq!(count("<|im_start|>user", true), 2);
        assert_eq!(ids("a <|im_end|>", true)[1], 151_645);
        assert_eq!(ids("same same", true)[1], ids("x same", true)[1]);
    }

    #[test]
    fn never_more_tokens_than_bytes() {
        for text in [
            "",
            " ",
            "a b c",
            "<|im_end|><think>",
            "é  ü\n\tx",
            "<<|im_start|>>",
        ] {
            assert!(count(text, true) as usize <= text.len(), "{text:?}");
        }
    }

    #[test]
    fn prompt_ids_count_as_the_prompt_and_share_prefixes() {
        let one = json!({"messages":[{"role":"user","content":"Hello there, how are you?"}]});
        let two = json!({"messages":[{"role":"user","content":"Hello there, how are you?"},
            {"role":"assistant","content":"word0 word1 "},{"role":"user","content":"more"}]});
        let (a, b) = (prompt_ids(&one), prompt_ids(&two));
        assert_eq!(
            a.ids.len() as u32,
            count_prompt_tokens(Flavor::Llamacpp, &one)
        );
        assert_eq!(
            b.ids.len() as u32,
            count_prompt_tokens(Flavor::Llamacpp, &two)
        );
        assert_eq!(a.tail, "\n");
        // The second prompt starts with the first one and its answer's pieces: "\nword0".
        assert_eq!(b.ids[..a.ids.len()], a.ids[..]);
        assert_eq!(b.ids[a.ids.len()], ids("\nword0", true)[0]);
        let text = json!({"prompt": ["a b", [7, 8], "c "]});
        let t = prompt_ids(&text);
        assert_eq!(t.ids.len() as u32, count_prompt_tokens(Flavor::Vllm, &text));
        assert_eq!((t.ids[2], t.tail.as_str()), (7, " "));
    }

    #[test]
    fn completion_prompts_count_strings_and_ids() {
        assert_eq!(
            count_prompt_tokens(Flavor::Vllm, &json!({"prompt":"Once upon a time"})),
            4
        );
        assert_eq!(
            count_prompt_tokens(Flavor::Vllm, &json!({"prompt":[1,2,3]})),
            3
        );
        assert_eq!(
            count_prompt_tokens(Flavor::Vllm, &json!({"prompt":["a b","c"]})),
            3
        );
    }
}
