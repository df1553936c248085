//! A chat stream translated into another API's stream, event by event: the shell every
//! translation shares (the Messages and Responses ones, [`super::messages::from_chat`] and
//! [`super::responses::from_chat`]), around what is each API's own ([`Writer`]).
//!
//! The shell reads each chat event, keeps the usage and the finish reason, puts choice 0's
//! deltas into blocks through [`Order`], and ends the answer once: at `[DONE]`, or when the
//! stream ends after a finish reason. An answer ends only after it has begun: a stream that
//! sent no chunk before its `[DONE]` (or its end) has no answer to close, and ends as a
//! broken stream in the API's own words rather than with a closing event of nothing. A chat
//! `error` event, or one that cannot be read, ends it there.

use std::time::Instant;

/// A whole chat answer no other API's answer can be made of: not JSON, or without what a chat
/// answer has.
#[derive(Debug, thiserror::Error)]
pub enum NotChat {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Lacks(&'static str),
}

impl From<&'static str> for NotChat {
    fn from(what: &'static str) -> NotChat {
        NotChat::Lacks(what)
    }
}

use serde_json::Value;

use super::from_chat::{choice0, chunk_of, feed, Op, Order};
use super::stream::{data_payload, Action, ApiEvents, Seen};
use super::usage::{self, Usage};
use crate::error::ProxyError;

/// What one API makes of a translated chat stream: its events, which go through the API's
/// own repair (as a native stream's do) into `out`.
pub(crate) trait Writer: Send {
    /// `v`, one of the API's events, into the client's stream.
    fn put(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>);
    /// The events that open the answer, from its first chat chunk.
    fn start(&mut self, first: &Value) -> Vec<Value>;
    /// The event of one step [`Order`] wrote.
    fn op(&mut self, op: Op) -> Value;
    /// The events that close the answer, after its last block: its chat finish reason and
    /// usage.
    fn close(&mut self, finish: Option<&str>, usage: Option<&Value>) -> Vec<Value>;
    /// The end of a stream that did not close its answer (the API's repair tells it).
    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>>;
    /// The stream broken by `e`, in the API's words.
    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8>;
}

/// A chat stream translated by `W`.
pub(crate) struct Translated<W> {
    writer: W,
    started: bool,
    finished: bool,
    order: Order,
    finish: Option<String>,
    usage: Option<Value>,
    reported: Option<Usage>,
}

impl<W: Writer> Translated<W> {
    /// The translation by `writer`, its tool calls without an id named by `order`.
    pub(crate) fn new(writer: W, order: Order) -> Translated<W> {
        Translated {
            writer,
            started: false,
            finished: false,
            order,
            finish: None,
            usage: None,
            reported: None,
        }
    }

    fn write(&mut self, ops: Vec<Op>, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        for op in ops {
            let ev = self.writer.op(op);
            self.writer.put(ev, now, seen, out);
        }
    }

    /// One chat event's JSON.
    fn on_chunk(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        if v.get("error").is_some() {
            self.finished = true;
            return self.writer.put(v, now, seen, out);
        }
        if !self.started {
            self.started = true;
            for ev in self.writer.start(&v) {
                self.writer.put(ev, now, seen, out);
            }
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        // Choice 0 only: a backend's other choices (n > 1) are not the client's answer.
        let Some(choice) = choice0(&v) else {
            return;
        };
        if let Some(d) = choice.get("delta") {
            let mut ops = Vec::new();
            feed(&mut self.order, d, &mut ops);
            self.write(ops, now, seen, out);
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
        }
    }

    /// The end of the answer: the blocks held written, then the closing events.
    fn finish(&mut self, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let mut ops = Vec::new();
        self.order.finish(&mut ops);
        self.write(ops, now, seen, out);
        self.finished = true;
        let closing = self
            .writer
            .close(self.finish.as_deref(), self.usage.as_ref());
        for ev in closing {
            self.writer.put(ev, now, seen, out);
        }
        // The chat usage has the backend's own speeds, which the API's usage has no room for.
        if let Some(u) = self.reported {
            seen.usage = Some(u);
        }
    }
}

impl<W: Writer> ApiEvents for Translated<W> {
    fn event(&mut self, ev: &[u8], now: Instant, seen: &mut Seen) -> Action {
        let Some(data) = data_payload(ev) else {
            return Action::Drop;
        };
        if self.finished {
            return Action::Drop;
        }
        let mut out = Vec::new();
        if data == b"[DONE]" {
            if self.started {
                self.finish(now, seen, &mut out);
            }
            return Action::Replace(out);
        }
        let v = match chunk_of(data) {
            Ok(v) => v,
            Err(e) => {
                seen.error = Some(e.to_string());
                return Action::Replace(self.broken(&e, seen));
            }
        };
        if let Some((u, _)) = usage::of_event(data) {
            self.reported = Some(u);
        }
        self.on_chunk(v, now, seen, &mut out);
        Action::Replace(out)
    }

    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>> {
        if self.finished {
            return None;
        }
        if self.started && self.finish.is_some() {
            let mut out = Vec::new();
            self.finish(Instant::now(), seen, &mut out);
            return Some(out);
        }
        self.finished = true;
        self.writer.end(seen)
    }

    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8> {
        self.finished = true;
        self.writer.broken(e, seen)
    }
}
