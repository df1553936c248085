//! What the Messages and Responses translations of a chat answer share: the answer's choice 0
//! (other choices are never merged into it), reasoning under either field, `content` and
//! `arguments` as text, ids for tool calls the backend sent none for, and [`Order`], which
//! puts a chat stream's deltas into blocks written one at a time.
//!
//! A chat stream interleaves freely: text, reasoning and the fragments of several tool calls
//! (each by its `index`) may come in any order, and a call's fragments may be interrupted by
//! anything. Messages allows one open content block at a time and a block cannot be reopened;
//! the Responses writer likewise keeps one output item open at a time. So [`Order`] runs a
//! state machine per tool-call index: a call whose name is known when no other call is open
//! is streamed live in its own block and stays open to the end of the answer (a later
//! fragment of it may still come); anything that arrives while it is open (text, reasoning,
//! other calls) is held, each call's fragments concatenated in its own slot, and written whole
//! (start, its text or arguments, stop) when the answer finishes. Text and reasoning before
//! any call stream live, a new block at each change of kind. The client's stream thus
//! follows each API's grammar, and every call's arguments are exactly its fragments joined.

use serde_json::Value;

use crate::error::ProxyError;

/// The choice with index 0 of a chat answer or chunk (one without an index counts as 0).
pub(crate) fn choice0(v: &Value) -> Option<&Value> {
    v.get("choices")?
        .as_array()?
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
}

/// The reasoning of a chat message or delta, under either field name.
pub(crate) fn reasoning_of(m: &Value) -> Option<&str> {
    ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
}

/// A message's `content` as text: a string, or the text parts of a list joined.
pub(crate) fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| {
                p.get("type")
                    .is_none_or(|t| t == "text" || t == "output_text")
            })
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// A tool call's `arguments` as the JSON text they are: a string as it is, any other value
/// (an object a backend sent unencoded) serialised.
pub(crate) fn arguments_of(call: &Value) -> String {
    match call.get("function").and_then(|f| f.get("arguments")) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// A tool call's `id`, when it has a usable one.
pub(crate) fn id_of(call: &Value) -> Option<&str> {
    call.get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// A tool call's function name.
pub(crate) fn name_of(call: &Value) -> Option<&str> {
    call.get("function")
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Ids for the tool calls of one answer that came without one: `prefix`, a random part drawn
/// once per answer, and the call's place in the answer (stable within it, unique per call).
#[derive(Debug, Clone)]
pub(crate) struct Ids {
    prefix: &'static str,
    base: String,
}

impl Ids {
    pub(crate) fn new(prefix: &'static str) -> Ids {
        Ids {
            prefix,
            base: format!("{:016x}", rand::random::<u64>()),
        }
    }

    /// The id of call number `n` of the answer: the backend's `given`, else one made.
    pub(crate) fn id(&self, given: Option<&str>, n: usize) -> String {
        match given {
            Some(id) => id.to_owned(),
            None => format!("{}{}_{n}", self.prefix, self.base),
        }
    }
}

/// A block of the client's answer, as [`Order`] opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    Thinking,
    Text,
    Tool { id: String, name: String },
}

/// One step of the client's answer: a block opened, text or arguments for the open block, the
/// open block closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Open(Block),
    Delta(String),
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    Tool(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Held: not written yet (its name unknown, or another call open).
    Held,
    /// Written live in the open block.
    Live,
    /// Written whole.
    Done,
}

#[derive(Debug)]
struct Call {
    index: u64,
    id: Option<String>,
    name: Option<String>,
    /// Fragments not written yet.
    args: String,
    state: State,
}

/// What waits for the end of the answer, in the order it first came.
#[derive(Debug)]
enum Held {
    Thinking(String),
    Text(String),
    Call(usize),
}

/// A chat stream's deltas as blocks one at a time (see the module's header).
#[derive(Debug)]
pub(crate) struct Order {
    ids: Ids,
    open: Option<Open>,
    calls: Vec<Call>,
    held: Vec<Held>,
}

impl Order {
    pub(crate) fn new(ids: Ids) -> Order {
        Order {
            ids,
            open: None,
            calls: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Reasoning text.
    pub(crate) fn reasoning(&mut self, s: &str, ops: &mut Vec<Op>) {
        self.prose(true, s, ops);
    }

    /// Answer text.
    pub(crate) fn text(&mut self, s: &str, ops: &mut Vec<Op>) {
        self.prose(false, s, ops);
    }

    fn prose(&mut self, thinking: bool, s: &str, ops: &mut Vec<Op>) {
        if s.is_empty() {
            return;
        }
        match (self.open, thinking) {
            (Some(Open::Tool(_)), _) => self.hold(thinking, s),
            (Some(Open::Thinking), true) | (Some(Open::Text), false) => {
                ops.push(Op::Delta(s.to_owned()))
            }
            _ => {
                if self.open.is_some() {
                    ops.push(Op::Close);
                }
                let (block, open) = if thinking {
                    (Block::Thinking, Open::Thinking)
                } else {
                    (Block::Text, Open::Text)
                };
                self.open = Some(open);
                ops.push(Op::Open(block));
                ops.push(Op::Delta(s.to_owned()));
            }
        }
    }

    fn hold(&mut self, thinking: bool, s: &str) {
        for h in &mut self.held {
            match h {
                Held::Thinking(t) if thinking => return t.push_str(s),
                Held::Text(t) if !thinking => return t.push_str(s),
                _ => {}
            }
        }
        self.held.push(if thinking {
            Held::Thinking(s.to_owned())
        } else {
            Held::Text(s.to_owned())
        });
    }

    /// A fragment of the tool call at `index`: its id and name where this chunk has them, and
    /// a piece of its arguments.
    pub(crate) fn tool(
        &mut self,
        index: u64,
        id: Option<&str>,
        name: Option<&str>,
        args: &str,
        ops: &mut Vec<Op>,
    ) {
        let slot = match self.calls.iter().position(|c| c.index == index) {
            Some(slot) => slot,
            None => {
                self.calls.push(Call {
                    index,
                    id: None,
                    name: None,
                    args: String::new(),
                    state: State::Held,
                });
                self.held.push(Held::Call(self.calls.len() - 1));
                self.calls.len() - 1
            }
        };
        let other_call_open = matches!(self.open, Some(Open::Tool(o)) if o != slot);
        let c = &mut self.calls[slot];
        if c.id.is_none() {
            c.id = id.map(str::to_owned);
        }
        if c.name.is_none() {
            c.name = name.map(str::to_owned);
        }
        match c.state {
            State::Live => {
                if !args.is_empty() {
                    ops.push(Op::Delta(args.to_owned()));
                }
            }
            State::Done => {}
            State::Held => {
                c.args.push_str(args);
                if c.name.is_some() && !other_call_open {
                    self.go_live(slot, ops);
                }
            }
        }
    }

    /// Held call `slot` written live from here on (no other call is open).
    fn go_live(&mut self, slot: usize, ops: &mut Vec<Op>) {
        self.held
            .retain(|h| !matches!(h, Held::Call(s) if *s == slot));
        if self.open.is_some() {
            ops.push(Op::Close);
        }
        let block = self.block_of(slot);
        let c = &mut self.calls[slot];
        c.state = State::Live;
        ops.push(Op::Open(block));
        let args = std::mem::take(&mut c.args);
        if !args.is_empty() {
            ops.push(Op::Delta(args));
        }
        self.open = Some(Open::Tool(slot));
    }

    fn block_of(&self, slot: usize) -> Block {
        let c = &self.calls[slot];
        Block::Tool {
            id: self.ids.id(c.id.as_deref(), slot),
            name: c.name.clone().unwrap_or_default(),
        }
    }

    /// The end of the answer: the open block closed, then everything held written whole.
    pub(crate) fn finish(&mut self, ops: &mut Vec<Op>) {
        if self.open.take().is_some() {
            ops.push(Op::Close);
        }
        for h in std::mem::take(&mut self.held) {
            let (block, text) = match h {
                Held::Thinking(t) => (Block::Thinking, t),
                Held::Text(t) => (Block::Text, t),
                Held::Call(slot) => {
                    let block = self.block_of(slot);
                    let c = &mut self.calls[slot];
                    c.state = State::Done;
                    (block, std::mem::take(&mut c.args))
                }
            };
            ops.push(Op::Open(block));
            if !text.is_empty() {
                ops.push(Op::Delta(text));
            }
            ops.push(Op::Close);
        }
        for c in &mut self.calls {
            c.state = State::Done;
        }
    }
}

/// A chat stream event's JSON object, or the error of an event that cannot be read (not JSON,
/// a lone surrogate, bytes that are not UTF-8, JSON that is not an object): the answer cannot
/// be translated further.
pub(crate) fn chunk_of(data: &[u8]) -> Result<Value, ProxyError> {
    let what = match serde_json::from_slice::<Value>(data) {
        Ok(v) if v.is_object() => return Ok(v),
        Ok(_) => "an event that is not a JSON object".to_owned(),
        Err(_) if std::str::from_utf8(data).is_err() => "an event that is not UTF-8".to_owned(),
        Err(e) => format!("an event that is not JSON ({e})"),
    };
    Err(ProxyError::UpstreamMalformed {
        backend: String::new(),
        detail: what,
    })
}

/// One chat chunk's choice-0 delta fed to `order`: reasoning, text, then tool calls.
pub(crate) fn feed(order: &mut Order, delta: &Value, ops: &mut Vec<Op>) {
    if let Some(r) = reasoning_of(delta) {
        order.reasoning(r, ops);
    }
    let text = text_of(delta.get("content"));
    order.text(&text, ops);
    for call in delta
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let args = arguments_of(call);
        order.tool(index, id_of(call), name_of(call), &args, ops);
    }
}

#[cfg(test)]
mod tests {
    //! The order of a translated chat stream: the state machine alone (both translations
    //! over any stream are tested in `crate::wire`'s tests).

    use serde_json::{json, Value};

    use super::*;

    fn tool(
        o: &mut Order,
        index: u64,
        id: Option<&str>,
        name: Option<&str>,
        args: &str,
    ) -> Vec<Op> {
        let mut ops = Vec::new();
        o.tool(index, id, name, args, &mut ops);
        ops
    }

    fn open_tool(id: &str, name: &str) -> Op {
        Op::Open(Block::Tool {
            id: id.into(),
            name: name.into(),
        })
    }

    fn delta(s: &str) -> Op {
        Op::Delta(s.into())
    }

    #[test]
    fn text_after_an_open_tool_call_is_held_and_the_calls_continuation_stays_in_its_block() {
        let mut o = Order::new(Ids::new("toolu_"));
        let mut ops = Vec::new();
        o.text("hi", &mut ops);
        assert_eq!(ops, [Op::Open(Block::Text), delta("hi")]);
        let ops = tool(&mut o, 0, Some("c0"), Some("f"), "{\"k\":");
        assert_eq!(ops, [Op::Close, open_tool("c0", "f"), delta("{\"k\":")]);
        let mut ops = Vec::new();
        o.text(" more", &mut ops);
        assert!(ops.is_empty(), "text is held while the call is open");
        assert_eq!(tool(&mut o, 0, None, None, "1}"), [delta("1}")]);
        let mut ops = Vec::new();
        o.finish(&mut ops);
        assert_eq!(
            ops,
            [Op::Close, Op::Open(Block::Text), delta(" more"), Op::Close]
        );
    }

    #[test]
    fn interleaved_indexes_each_keep_their_own_fragments() {
        let mut o = Order::new(Ids::new("call_"));
        tool(&mut o, 0, Some("a"), Some("f"), "{\"a\":");
        assert!(tool(&mut o, 7, Some("b"), Some("g"), "{}").is_empty());
        assert_eq!(tool(&mut o, 0, None, None, "1}"), [delta("1}")]);
        let mut ops = Vec::new();
        o.finish(&mut ops);
        assert_eq!(
            ops,
            [Op::Close, open_tool("b", "g"), delta("{}"), Op::Close]
        );
    }

    #[test]
    fn a_call_whose_name_comes_late_is_held_until_it_comes() {
        let mut o = Order::new(Ids::new("call_"));
        assert!(tool(&mut o, 0, None, None, "{").is_empty());
        let ops = tool(&mut o, 0, None, Some("f"), "}");
        let [Op::Open(Block::Tool { id, name }), Op::Delta(d)] = &ops[..] else {
            panic!("{ops:?}");
        };
        assert!(id.starts_with("call_") && id.ends_with("_0"), "{id}");
        assert_eq!((name.as_str(), d.as_str()), ("f", "{}"));
    }

    #[test]
    fn made_ids_are_distinct_per_call_and_per_answer() {
        let (a, b) = (Ids::new("toolu_"), Ids::new("toolu_"));
        assert_ne!(a.id(None, 0), a.id(None, 1));
        assert_ne!(a.id(None, 0), b.id(None, 0));
        assert_eq!(a.id(None, 3), a.id(None, 3));
        assert_eq!(a.id(Some("given"), 0), "given");
    }

    #[test]
    fn arguments_and_content_of_any_shape_read_as_text() {
        let call = json!({"function": {"arguments": {"k": [1, "é"]}}});
        assert_eq!(arguments_of(&call), r#"{"k":[1,"é"]}"#);
        assert_eq!(arguments_of(&json!({"function": {}})), "");
        let parts = json!([{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}]);
        assert_eq!(text_of(Some(&parts)), "ab");
        assert_eq!(text_of(Some(&Value::Null)), "");
    }
}
