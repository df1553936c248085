//! The per-event rewriter of a streamed chat completion: field renaming and tag splitting.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::field::{normalize, OutputField, Pieces, CONTENT};
use super::scan::{self, TagStart};
use super::splitter::Splitter;
use super::tags::ThinkTags;
use switchboard_json::scan as json_scan;

/// Top-level chunk keys copied into a flush chunk.
const META_KEYS: [&str; 4] = ["id", "object", "created", "model"];

/// Rewrites the events of one streamed response; keeps a tag splitter per choice index.
///
/// Text a splitter holds back (a partial tag) is released in the event that carries that
/// choice's `finish_reason` or `tool_calls` (what follows cannot continue a tag), or by
/// [`StreamRewriter::flush`]. When one event's text holds both reasoning and content, the
/// delta carries both fields, reasoning first.
pub struct StreamRewriter {
    output: OutputField,
    tags: Option<Arc<ThinkTags>>,
    open_start: Option<TagStart>,
    /// `(choice index, splitter)`, in order of first appearance.
    choices: Vec<(u64, Splitter)>,
    /// `id`/`object`/`created`/`model` of the last parsed chunk that left text held back.
    meta: Map<String, Value>,
}

impl StreamRewriter {
    pub fn new(output: OutputField, tags: Option<Arc<ThinkTags>>) -> Self {
        let open_start = tags.as_deref().map(TagStart::for_open);
        StreamRewriter {
            output,
            tags,
            open_start,
            choices: Vec::new(),
            meta: Map::new(),
        }
    }

    /// `data` is the payload of one SSE `data:` line (a JSON chat.completion.chunk, or `[DONE]`).
    /// Returns the payload to send: borrowed (same bytes) when nothing needed rewriting.
    pub fn rewrite<'a>(&mut self, data: &'a [u8]) -> Cow<'a, [u8]> {
        // A key written with escapes hides from the byte searches: such a payload is parsed.
        let searchable = || !json_scan::may_escape_word(data);
        if !self.may_rewrite(data) {
            if searchable() {
                return Cow::Borrowed(data);
            }
        } else if self.tags.is_none() && searchable() {
            // The common case (vLLM's `reasoning` to `reasoning_content`): a key rename in the
            // bytes, no parse.
            if let Some(renamed) = scan::rename_key(data, self.output) {
                return Cow::Owned(renamed);
            }
        }
        self.rewrite_parsed(data)
    }

    /// Whether [`StreamRewriter::rewrite`] leaves an event unchanged by its keys and the types
    /// of their values alone: true without think tags (a rename of reasoning keys with string
    /// values, no state between events).
    pub(crate) fn follows_keys(&self) -> bool {
        self.tags.is_none()
    }

    /// The rewrite by a parse of the payload, what [`StreamRewriter::rewrite`] gives without
    /// its byte searches.
    pub(crate) fn rewrite_parsed<'a>(&mut self, data: &'a [u8]) -> Cow<'a, [u8]> {
        let Ok(mut event) = serde_json::from_slice::<Value>(data) else {
            return Cow::Borrowed(data);
        };
        if !self.apply(&mut event) {
            return Cow::Borrowed(data);
        }
        match serde_json::to_vec(&event) {
            Ok(bytes) => Cow::Owned(bytes),
            Err(_) => Cow::Borrowed(data),
        }
    }

    /// Releases text still held back (a partial tag pending) as one chunk, or `None` when
    /// nothing is held. Call it before forwarding `[DONE]` or at end of stream and send what
    /// it returns first. Calling it before an event with a `finish_reason` is allowed but not
    /// needed: that event releases its choice's held text itself.
    pub(crate) fn flush(&mut self) -> Option<Vec<u8>> {
        let tags = self.tags.as_deref()?;
        let mut choices = Vec::new();
        for (index, splitter) in &mut self.choices {
            if !splitter.is_holding() {
                continue;
            }
            let mut out = Pieces::default();
            splitter.release(tags, &mut out);
            let mut delta = Map::new();
            if !out.reasoning.is_empty() {
                for name in self.output.names() {
                    delta.insert((*name).to_owned(), Value::String(out.reasoning.clone()));
                }
            }
            if !out.content.is_empty() {
                delta.insert(CONTENT.to_owned(), Value::String(out.content));
            }
            let mut choice = Map::new();
            choice.insert("index".to_owned(), Value::from(*index));
            choice.insert("delta".to_owned(), Value::Object(delta));
            choice.insert("finish_reason".to_owned(), Value::Null);
            choices.push(Value::Object(choice));
        }
        if choices.is_empty() {
            return None;
        }
        let mut chunk = Map::new();
        for key in META_KEYS {
            if let Some(value) = self.meta.get(key) {
                chunk.insert(key.to_owned(), value.clone());
            }
        }
        if !chunk.contains_key("object") {
            chunk.insert("object".to_owned(), Value::from("chat.completion.chunk"));
        }
        chunk.insert("choices".to_owned(), Value::Array(choices));
        serde_json::to_vec(&Value::Object(chunk)).ok()
    }

    /// The byte-search gate: `false` means the event certainly needs nothing.
    fn may_rewrite(&self, data: &[u8]) -> bool {
        if scan::needs_rename(data, self.output) {
            return true;
        }
        let Some(open_start) = &self.open_start else {
            return false;
        };
        if self.choices.iter().any(|(_, s)| s.is_holding()) {
            return true;
        }
        if !scan::has_content_text(data) {
            return false;
        }
        // Content text passes untouched only outside reasoning, for choices already seen,
        // when it cannot hold an open tag. `tool_calls` carry indices of their own.
        if open_start.maybe_in(data) || scan::has_tool_calls(data) {
            return true;
        }
        let mut seen_any = false;
        for index in scan::indices(data) {
            seen_any = true;
            let settled = index
                .and_then(|i| self.choices.iter().find(|(c, _)| *c == i))
                .is_some_and(|(_, s)| !s.in_reasoning());
            if !settled {
                return true;
            }
        }
        !seen_any
    }

    /// Rewrites a parsed event in place; returns whether anything changed.
    fn apply(&mut self, event: &mut Value) -> bool {
        let Some(chunk) = event.as_object_mut() else {
            return false;
        };
        let Some(Value::Array(choices)) = chunk.get_mut("choices") else {
            return false;
        };
        let mut changed = false;
        for (position, choice) in choices.iter_mut().enumerate() {
            let Some(choice) = choice.as_object_mut() else {
                continue;
            };
            let index = choice
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64);
            let ends_text = choice.get("finish_reason").is_some_and(|v| !v.is_null());
            let Some(Value::Object(delta)) = choice.get_mut("delta") else {
                continue;
            };
            let split = match self.tags.as_deref() {
                Some(tags) => Some(split_delta(
                    tags,
                    &mut self.choices,
                    index,
                    delta,
                    ends_text,
                )),
                None => None,
            };
            changed |= normalize(delta, self.output, split, false);
        }
        if self.choices.iter().any(|(_, s)| s.is_holding()) {
            self.meta = META_KEYS
                .iter()
                .filter_map(|k| Some(((*k).to_owned(), chunk.get(*k)?.clone())))
                .collect();
        }
        changed
    }
}

/// Runs one delta's content through its choice's splitter.
fn split_delta(
    tags: &ThinkTags,
    choices: &mut Vec<(u64, Splitter)>,
    index: u64,
    delta: &Map<String, Value>,
    ends_text: bool,
) -> Pieces {
    let at = match choices.iter().position(|(c, _)| *c == index) {
        Some(at) => at,
        None => {
            choices.push((index, Splitter::new(tags)));
            choices.len() - 1
        }
    };
    let mut out = Pieces::default();
    let Some((_, splitter)) = choices.get_mut(at) else {
        return out;
    };
    if let Some(Value::String(text)) = delta.get(CONTENT) {
        splitter.push(tags, text, &mut out);
    }
    let tool_call = ["tool_calls", "function_call"]
        .iter()
        .any(|k| delta.get(*k).is_some_and(|v| !v.is_null()));
    if ends_text || tool_call {
        splitter.release(tags, &mut out);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = r#""created":1796026262,"id":"chatcmpl-sWeZ","model":"tiny-qwen3","system_fingerprint":"b0-unknown","object":"chat.completion.chunk""#;

    /// A llama.cpp chunk with the given delta and finish_reason.
    fn chunk(delta: &str, finish: &str) -> String {
        format!(r#"{{"choices":[{{"finish_reason":{finish},"index":0,"delta":{delta}}}],{ID}}}"#)
    }

    fn content(text: &str) -> String {
        chunk(&json!({ "content": text }).to_string(), "null")
    }

    fn qwen(starts_open: bool) -> Option<Arc<ThinkTags>> {
        let mut tags = ThinkTags::preset("qwen3").unwrap();
        tags.starts_open = starts_open;
        Some(Arc::new(tags))
    }

    /// Runs events through a rewriter (flushing before `[DONE]`) and returns the deltas sent.
    fn run(rw: &mut StreamRewriter, events: &[String]) -> Vec<Value> {
        let mut sent = Vec::new();
        for event in events {
            if event == "[DONE]" {
                sent.extend(rw.flush());
            }
            let out = rw.rewrite(event.as_bytes());
            if let Ok(v) = serde_json::from_slice::<Value>(&out) {
                sent.push(serde_json::to_vec(&v).unwrap());
            }
        }
        sent.extend(rw.flush());
        sent.iter()
            .map(|b| serde_json::from_slice::<Value>(b).unwrap())
            .collect()
    }

    /// Concatenated `reasoning_content` and `content` of choice 0 across sent chunks.
    fn texts(sent: &[Value], field: &str) -> (String, String) {
        let (mut r, mut c) = (String::new(), String::new());
        for v in sent {
            for choice in v["choices"].as_array().into_iter().flatten() {
                let delta = &choice["delta"];
                r += delta[field].as_str().unwrap_or_default();
                c += delta["content"].as_str().unwrap_or_default();
            }
        }
        (r, c)
    }

    #[test]
    fn nothing_to_do_is_the_same_bytes() {
        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, None);
        for event in [
            chunk(r#"{"role":"assistant","content":null}"#, "null"),
            chunk(r#"{"reasoning_content":"L"}"#, "null"),
            content("Hi <think> there"),
            chunk("{}", r#""stop""#),
            "[DONE]".to_owned(),
        ] {
            assert!(
                matches!(rw.rewrite(event.as_bytes()), Cow::Borrowed(b) if b == event.as_bytes())
            );
        }
        assert_eq!(rw.flush(), None);
    }

    #[test]
    fn renames_vllm_reasoning_in_place() {
        let vllm = r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning":"Let"},"logprobs":null,"finish_reason":null}]}"#;
        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, None);
        let out = rw.rewrite(vllm.as_bytes());
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            vllm.replace("\"reasoning\"", "\"reasoning_content\"")
        );
        let mut rw = StreamRewriter::new(OutputField::Reasoning, None);
        assert!(matches!(rw.rewrite(vllm.as_bytes()), Cow::Borrowed(_)));
        let mut rw = StreamRewriter::new(OutputField::Both, None);
        let out: Value = serde_json::from_slice(&rw.rewrite(vllm.as_bytes())).unwrap();
        assert_eq!(
            out["choices"][0]["delta"],
            json!({"reasoning_content": "Let", "reasoning": "Let"})
        );
        // vLLM 0.11–0.15 writes both names with the same text.
        let both = vllm.replace(
            r#""reasoning":"Let""#,
            r#""reasoning":"Let","reasoning_content":"Let""#,
        );
        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, None);
        let out: Value = serde_json::from_slice(&rw.rewrite(both.as_bytes())).unwrap();
        assert_eq!(
            out["choices"][0]["delta"],
            json!({"reasoning_content": "Let"})
        );
        assert_eq!(out["choices"][0]["logprobs"], Value::Null);
    }

    #[test]
    fn inline_tags_cut_across_chunks() {
        // The llama.cpp `--reasoning-format none` capture, piece by piece.
        let mut events = vec![chunk(r#"{"role":"assistant","content":null}"#, "null")];
        for piece in [
            "<t", "h", "ink", ">\n", "Let", " me", " think", ".\n", "</", "th", "in", "k>", "\n\n",
            "H", "i",
        ] {
            events.push(content(piece));
        }
        events.push(chunk("{}", r#""stop""#));
        events.push(format!(
            r#"{{"choices":[],{ID},"usage":{{"completion_tokens":30}},"timings":{{"cache_n":22}}}}"#
        ));
        events.push("[DONE]".to_owned());
        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, qwen(false));
        let mut borrowed = 0;
        for event in &events {
            borrowed += usize::from(matches!(rw.rewrite(event.as_bytes()), Cow::Borrowed(_)));
        }
        // Role chunk, "\n\n", "H", "i", finish, usage and [DONE] need no parse.
        assert_eq!(borrowed, 7);
        let sent = run(
            &mut StreamRewriter::new(OutputField::ReasoningContent, qwen(false)),
            &events,
        );
        assert_eq!(
            texts(&sent, "reasoning_content"),
            ("\nLet me think.\n".into(), "\n\nHi".into())
        );
        assert_eq!(sent.len(), events.len() - 1);
        // No empty strings appear where the backend sent text that was all tag.
        assert_eq!(sent[1]["choices"][0]["delta"], json!({}));
        assert_eq!(sent.last().unwrap()["timings"], json!({"cache_n": 22}));
    }

    #[test]
    fn forced_open_template() {
        let events: Vec<String> = ["Hm", ".</th", "ink>\n", "Hi"]
            .iter()
            .map(|t| content(t))
            .collect();
        let sent = run(
            &mut StreamRewriter::new(OutputField::Reasoning, qwen(true)),
            &events,
        );
        assert_eq!(texts(&sent, "reasoning"), ("Hm.".into(), "\nHi".into()));
    }

    #[test]
    fn held_text_goes_out_with_the_finish_or_tool_call() {
        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, qwen(false));
        let out: Value = serde_json::from_slice(&rw.rewrite(content("a <").as_bytes())).unwrap();
        assert_eq!(out["choices"][0]["delta"], json!({"content": "a "}));
        let fin = chunk(r#"{"content":"/"}"#, r#""length""#);
        let out: Value = serde_json::from_slice(&rw.rewrite(fin.as_bytes())).unwrap();
        assert_eq!(out["choices"][0]["delta"], json!({"content": "</"}));
        assert_eq!(rw.flush(), None);

        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, qwen(false));
        rw.rewrite(content("x<").as_bytes());
        let call = chunk(
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}"#,
            "null",
        );
        let out: Value = serde_json::from_slice(&rw.rewrite(call.as_bytes())).unwrap();
        assert_eq!(out["choices"][0]["delta"]["content"], "<");
        assert_eq!(
            out["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
            "{"
        );
    }

    #[test]
    fn flush_without_finish_chunk() {
        let mut rw = StreamRewriter::new(OutputField::Both, qwen(true));
        rw.rewrite(content("thinking </thi").as_bytes());
        let flushed: Value = serde_json::from_slice(&rw.flush().unwrap()).unwrap();
        assert_eq!(
            flushed,
            json!({"id": "chatcmpl-sWeZ", "object": "chat.completion.chunk", "created": 1796026262,
                   "model": "tiny-qwen3", "choices": [{"index": 0, "delta":
                   {"reasoning_content": "</thi", "reasoning": "</thi"}, "finish_reason": null}]})
        );
        assert_eq!(rw.flush(), None);
    }

    #[test]
    fn one_splitter_per_choice() {
        let two = |i: u64, text: &str| {
            json!({"id": "c", "choices": [{"index": i, "delta": {"content": text}, "finish_reason": null}]}).to_string()
        };
        let events = [
            two(0, "<thi"),
            two(1, "<think>b1"),
            two(0, "nk>a1</think>"),
            two(1, "</think>B"),
            two(0, "A"),
        ];
        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, qwen(false));
        let sent = run(&mut rw, &events);
        let mut per = [
            (String::new(), String::new()),
            (String::new(), String::new()),
        ];
        for v in &sent {
            let choice = &v["choices"][0];
            let slot = &mut per[choice["index"].as_u64().unwrap() as usize];
            slot.0 += choice["delta"]["reasoning_content"]
                .as_str()
                .unwrap_or_default();
            slot.1 += choice["delta"]["content"].as_str().unwrap_or_default();
        }
        assert_eq!(per, [("a1".into(), "A".into()), ("b1".into(), "B".into())]);
    }

    #[test]
    fn unseen_choice_is_parsed_when_forced_open() {
        let mut rw = StreamRewriter::new(OutputField::ReasoningContent, qwen(true));
        rw.rewrite(content("r</think>").as_bytes());
        assert!(matches!(
            rw.rewrite(content("plain").as_bytes()),
            Cow::Borrowed(_)
        ));
        let other = json!({"choices": [{"index": 1, "delta": {"content": "r1"}}]}).to_string();
        let out: Value = serde_json::from_slice(&rw.rewrite(other.as_bytes())).unwrap();
        assert_eq!(
            out["choices"][0]["delta"],
            json!({"reasoning_content": "r1"})
        );
    }
}
