//! The relay's tracker: what a stream's events showed (first and last token, usage, an error)
//! and what becomes of each event (kept, dropped, rewritten by the transform).

use std::borrow::Cow;
use std::time::Instant;

use bytes::BytesMut;

use super::readings::EventReadings;
use super::RelayOptions;
use crate::observe::record::Record;
use crate::pipeline::same_shape::LastShape;
use crate::wire::stream::{data_payload, event_len, named_data};
use crate::wire::{Action, Seen};

/// Everything the relay tracks apart from the byte buffer.
pub(super) struct Tracker {
    pub(super) rec: Record,
    pub(super) opts: RelayOptions,
    pub(super) saw_done: bool,
    /// The last event read in full, for the events shaped as it.
    pub(super) last: LastShape,
    /// What the API's own events showed; moved into the record when the relay goes.
    pub(super) seen: Seen,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.rec.absorb(std::mem::take(&mut self.seen));
    }
}

impl Tracker {
    /// First and last token times of one event's data; `token`: it has one.
    fn track(&mut self, token: bool, data: &EventReadings<'_>, now: Instant) {
        if self.rec.first_content.is_some() {
            // Both first times are known: every later event only moves the last one.
            self.rec.last_token = Some(now);
            return;
        }
        if token {
            self.rec.first_token.get_or_insert(now);
            self.rec.last_token = Some(now);
            if self.rec.first_content.is_none() && data.has_content() {
                self.rec.first_content = Some(now);
            }
        }
    }

    /// An event with more fields than its data: forwarded as it is; its data still counts
    /// for TTFT and usage.
    fn on_named(&mut self, ev: &[u8], now: Instant) {
        let (_, Some(data)) = named_data(ev) else {
            return;
        };
        let readings = EventReadings::new(data);
        if self.rec.first_content.is_none() && readings.has_tagged_text() {
            self.rec.first_token.get_or_insert(now);
            self.rec.first_content.get_or_insert(now);
            self.rec.last_token = Some(now);
        }
        self.counted(&readings, now);
        if readings.may_have_usage() {
            if let Some((usage, _)) = crate::wire::usage::of_event(data) {
                self.rec.usage = Some(usage);
            }
        }
    }

    /// The end marker `[DONE]`: the text the transform still holds goes out before it.
    fn on_done(&mut self, ev: &[u8]) -> Action {
        self.saw_done = true;
        match self.opts.transform.as_mut().and_then(|t| t.flush()) {
            Some(held) => {
                let mut out = crate::wire::data_event(&held);
                out.extend_from_slice(ev);
                Action::Replace(out)
            }
            None => Action::Keep,
        }
    }

    pub(super) fn on_event(&mut self, ev: &[u8], now: Instant) -> Action {
        if self.rec.traced().is_some() {
            if let Some(data) = data_payload(ev).or_else(|| named_data(ev).1) {
                crate::pipeline::traced::event(&mut self.rec, data);
            }
        }
        if let Some(events) = self.opts.events.as_mut() {
            return events.event(ev, now, &mut self.seen);
        }
        let Some(data) = data_payload(ev) else {
            self.on_named(ev, now);
            return Action::Keep;
        };
        if data == b"[DONE]" {
            return self.on_done(ev);
        }
        if let Some(kept) = self.last.matches(data) {
            // The readings of the last event hold: no error, no usage object, no escape, and
            // a token when its text is not empty (or the last had one besides its text).
            self.rec.generated += u64::from(self.last.has_token(data));
            self.track_text(data, now);
            return if kept {
                Action::Keep
            } else {
                self.transform(data).0
            };
        }
        let readings = EventReadings::new(data);
        if readings.is_error() {
            self.last.forget();
            self.rec.error = Some("error event from backend".into());
            return Action::Keep;
        }
        self.counted(&readings, now);
        if readings.may_have_usage() {
            self.last.forget();
            if let Some((usage, usage_only)) = crate::wire::usage::of_event(data) {
                self.rec.usage = Some(usage);
                if usage_only && self.opts.drop_usage_chunk {
                    return match self.opts.transform.as_mut().and_then(|t| t.flush()) {
                        Some(held) => Action::Replace(crate::wire::data_event(&held)),
                        None => Action::Drop,
                    };
                }
            }
            return self.transform(data).0;
        }
        let (action, kept) = self.transform(data);
        if readings.searched() {
            self.last
                .remember(data, kept, |d| EventReadings::new(d).has_token());
        } else {
            self.last.forget();
        }
        action
    }

    /// An event read in full: its token counted (what a stream that ends without usage is
    /// charged: one a content, reasoning or tool-call delta), its times tracked.
    fn counted(&mut self, data: &EventReadings<'_>, now: Instant) {
        let token = data.has_token();
        self.rec.generated += u64::from(token);
        self.track(token, data, now);
    }

    /// First and last token times of an event shaped as the last one (its token counted by
    /// the caller).
    fn track_text(&mut self, data: &[u8], now: Instant) {
        if self.rec.first_content.is_some() {
            self.rec.last_token = Some(now);
        } else {
            let readings = EventReadings::new(data);
            self.track(readings.has_token(), &readings, now);
        }
    }

    /// The transform's action on `data`, and whether an event shaped as it is left alone
    /// too (nothing changed, by a transform whose verdict follows the keys).
    fn transform(&mut self, data: &[u8]) -> (Action, bool) {
        let Some(t) = self.opts.transform.as_mut() else {
            return (Action::Keep, true);
        };
        match t.rewrite(data) {
            Cow::Borrowed(_) => (Action::Keep, t.follows_keys()),
            Cow::Owned(rewritten) => (Action::Replace(crate::wire::data_event(&rewritten)), false),
        }
    }
}

impl Tracker {
    /// Transform the complete events at the start of `data`: how many bytes they span, and
    /// their replacement when any event changed (`None`: forward `data[..len]` as it is).
    pub(super) fn scan(&mut self, data: &[u8], now: Instant) -> (usize, Option<BytesMut>) {
        let mut out: Option<BytesMut> = None;
        let mut pos = 0;
        let mut copied = 0;
        while let Some(len) = event_len(&data[pos..]) {
            match self.on_event(&data[pos..pos + len], now) {
                Action::Keep => {}
                action => {
                    let o = out.get_or_insert_with(|| BytesMut::with_capacity(data.len() + 64));
                    o.extend_from_slice(&data[copied..pos]);
                    if let Action::Replace(bytes) = action {
                        o.extend_from_slice(&bytes);
                    }
                    copied = pos + len;
                }
            }
            pos += len;
        }
        if let Some(o) = out.as_mut() {
            o.extend_from_slice(&data[copied..pos]);
        }
        (pos, out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use serde_json::Value;

    use crate::pipeline::relay::tests::options;
    use crate::wire::Endpoint;

    /// Events read by the shape of the last one against the same events read in full.
    mod same_shape_agrees_with_a_full_read {
        use super::*;
        use crate::reasoning::{StreamRewriter, ThinkTags};
        use proptest::prelude::*;
        use serde_json::json;
        use switchboard_json::respell::{respell, Style};

        /// What replaces the text of the envelope: plain text, escaped text, and text that
        /// leaves its string to add members.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z <>/:,{}\\[\\]\u{e9}]{0,12}",
                any::<String>().prop_map(|t| {
                    let quoted = serde_json::to_string(&t).unwrap();
                    quoted[1..quoted.len() - 1].to_owned()
                }),
                Just(r#"\u0041\" \\"#.to_owned()),
                Just(r#"","usage":{"prompt_tokens":3},"k":""#.to_owned()),
                Just(r#"","error":{"message":"x"},"k":""#.to_owned()),
                Just(r#"","reasoning":"r"#.to_owned()),
                Just(r#"","reasoning_content":"r"#.to_owned()),
                Just(r#"","content":"c"#.to_owned()),
                Just(r#"", "tool_calls": [{"index": 0}], "k": ""#.to_owned()),
            ]
        }

        /// One envelope (spelled by `seed`) around the texts, with other events between.
        fn stream() -> impl Strategy<Value = Vec<Vec<u8>>> {
            let field = prop::sample::select(vec!["content", "reasoning_content", "reasoning"]);
            let item = prop_oneof![
                4 => text().prop_map(Some),
                1 => Just(None),
            ];
            (field, any::<u64>(), prop::collection::vec(item, 1..12)).prop_map(|(field, seed, items)| {
                let envelope = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": [{"index": 0, "delta": {field: "MARK"}, "finish_reason": null}]});
                let envelope = respell(&envelope, Style { escapes: seed & 4 == 0, ..Style::line(seed) });
                let other = respell(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 2}}), Style::line(seed));
                items
                    .into_iter()
                    .map(|t| match t {
                        Some(t) => envelope.replacen("MARK", &t, 1).into_bytes(),
                        None => other.clone().into_bytes(),
                    })
                    .filter(|e| serde_json::from_slice::<Value>(e).is_ok())
                    .collect()
            })
        }

        fn tracker(tags: bool) -> Tracker {
            let metrics = crate::observe::metrics::Metrics::new();
            let tags = tags.then(|| Arc::new(ThinkTags::preset("qwen3").unwrap()));
            Tracker {
                rec: Record::start(
                    &metrics.alias("a"),
                    Endpoint::chat_completions,
                    http::HeaderValue::from_static("id"),
                ),
                opts: options(
                    true,
                    Some(Box::new(StreamRewriter::new(Default::default(), tags))),
                ),
                saw_done: false,
                last: LastShape::default(),
                seen: Seen::default(),
            }
        }

        fn bytes(a: Action) -> Option<Vec<u8>> {
            match a {
                Action::Keep => Some(Vec::new()),
                Action::Drop => None,
                Action::Replace(b) => Some(b),
            }
        }

        proptest! {
            #[test]
            fn readings_match(events in stream(), tags: bool) {
                let (mut shaped, mut full) = (tracker(tags), tracker(tags));
                let start = Instant::now();
                for (i, data) in events.iter().enumerate() {
                    let now = start + std::time::Duration::from_millis(i as u64);
                    let ev = crate::wire::data_event(data);
                    full.last = LastShape::default();
                    prop_assert_eq!(bytes(shaped.on_event(&ev, now)), bytes(full.on_event(&ev, now)));
                    prop_assert_eq!(&shaped.rec.error, &full.rec.error);
                    prop_assert_eq!(&shaped.rec.usage, &full.rec.usage);
                    prop_assert_eq!(shaped.rec.first_token, full.rec.first_token);
                    prop_assert_eq!(shaped.rec.first_content, full.rec.first_content);
                    prop_assert_eq!(shaped.rec.last_token, full.rec.last_token);
                    prop_assert_eq!(shaped.rec.generated, full.rec.generated);
                }
            }
        }
    }
}
