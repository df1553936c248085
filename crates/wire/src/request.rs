//! The request view the proxy needs (model, stream, limits) and byte-level edits of the body.
//!
//! The body is parsed once into borrowed fields; everything else stays as the client's bytes.
//! Edits (the rewritten `model`, an injected `stream_options`) are spliced into the original,
//! in one new buffer or as a [`Payload`] that shares the original's bytes.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::de::DeserializeSeed;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::payload::{apply_edits, Payload};
use crate::error::{bounded, ProxyError};

/// The output limits a request body may set, in any API.
const LIMITS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// The members a request's conversation is read from (see [`History`]).
const HISTORY: [&str; 4] = ["system", "messages", "input", "prompt_cache_key"];

/// The members of an OpenAI-style request body the proxy looks at (the last of a name given
/// twice, as a full parse reads it); the rest are skipped.
#[derive(Debug, Default)]
pub(crate) struct RequestView<'a> {
    model: Option<&'a RawValue>,
    pub(crate) stream: Option<bool>,
    /// Kept when it is `null` too: an injected `stream_options` must replace it, not sit
    /// beside it as a second key.
    stream_options: Option<&'a RawValue>,
    /// Each of [`LIMITS`], as given.
    limits: [Option<&'a RawValue>; 3],
    /// `n`, the choices asked for, as given.
    n: Option<&'a RawValue>,
    /// Each of [`HISTORY`], as given.
    history: [Option<&'a RawValue>; 4],
}

impl<'de> Deserialize<'de> for RequestView<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ViewVisitor)
    }
}

struct ViewVisitor;

impl<'de> serde::de::Visitor<'de> for ViewVisitor {
    type Value = RequestView<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("struct RequestView")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut view = RequestView::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match &*key {
                "model" => view.model = Some(map.next_value()?),
                "stream" => view.stream = map.next_value()?,
                "stream_options" => view.stream_options = Some(map.next_value()?),
                "n" => view.n = Some(map.next_value()?),
                k => {
                    if let Some(i) = LIMITS.iter().position(|l| *l == k) {
                        view.limits[i] = Some(map.next_value()?);
                    } else if let Some(i) = HISTORY.iter().position(|h| *h == k) {
                        view.history[i] = Some(map.next_value()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
            }
        }
        Ok(view)
    }
}

/// A parsed request: the view plus where its editable fields sit in the body.
#[derive(Debug)]
pub struct ParsedRequest {
    pub model: String,
    pub stream: bool,
    model_span: Range<usize>,
    stream_options: Option<(Range<usize>, bool)>,
    /// Each of [`LIMITS`] as [`switchboard_json::scan::token_limit`] reads it.
    limits: [Result<Option<u32>, &'static str>; 3],
    /// The choices `n` asks for, as [`output_ask`] reads it (1 where it is not a count).
    choices: u32,
    /// Where its conversation shows in the body.
    pub history: History,
}

/// Where a request's conversation shows in its body: the spans of its `system`, `messages`,
/// `input` and `prompt_cache_key` members, those it has (the last of a name given twice).
/// (A span is held as two `u32`s: a request body is far below 4 GiB, and the view stays
/// small.)
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct History([Option<(u32, u32)>; 4]);

impl History {
    /// The history of `body`; empty when it is no JSON object.
    pub fn of(body: &[u8]) -> History {
        match serde_json::from_slice::<RequestView<'_>>(body) {
            Ok(view) => History::in_view(body, &view),
            Err(_) => History::default(),
        }
    }

    fn in_view(body: &[u8], view: &RequestView<'_>) -> History {
        let span = |r: &RawValue| {
            let s = span_of(body, r);
            Some((u32::try_from(s.start).ok()?, u32::try_from(s.end).ok()?))
        };
        History(view.history.map(|raw| raw.and_then(span)))
    }

    /// Its members' text in `body` (the body it was read from), in [`HISTORY`]'s order (the
    /// parse that found them checked it is UTF-8).
    pub fn members<'b>(&self, body: &'b [u8]) -> [Option<&'b [u8]>; 4] {
        self.0.map(|span| {
            let (start, end) = span?;
            body.get(start as usize..end as usize)
        })
    }
}

/// Where a borrowed raw value sits in the body it was parsed from.
pub fn span_of(body: &[u8], raw: &RawValue) -> Range<usize> {
    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    start..start + raw.get().len()
}

impl ParsedRequest {
    /// Parse `body`: it must be a JSON object with a string `model`.
    pub fn parse(body: &[u8]) -> Result<ParsedRequest, ProxyError> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            return Err(ProxyError::InvalidJson(
                "the request body must be a JSON object".into(),
            ));
        }
        // Checked as UTF-8 once, whole: serde_json then reads its strings and the members it
        // keeps raw without checking each again. (JSON text is UTF-8: a body that is not is
        // refused, as serde_json refuses such bytes in a string it reads.)
        let text = std::str::from_utf8(body).map_err(|e| not_utf8(body, e))?;
        let view: RequestView<'_> =
            serde_json::from_str(text).map_err(|e| ProxyError::InvalidJson(bounded(e)))?;
        let raw_model = view.model.ok_or(ProxyError::MissingModel)?;
        let model: String = match serde_json::from_str::<Option<String>>(raw_model.get()) {
            Ok(Some(m)) if !m.is_empty() => m,
            Ok(_) => return Err(ProxyError::MissingModel),
            Err(_) => {
                return Err(ProxyError::InvalidParam {
                    param: "model",
                    message: "expected a string".into(),
                })
            }
        };
        let stream_options = view.stream_options.map(|raw| {
            let include = serde_json::from_str::<serde_json::Value>(raw.get())
                .ok()
                .and_then(|v| v.get("include_usage").and_then(|u| u.as_bool()))
                .unwrap_or(false);
            (span_of(body, raw), include)
        });
        Ok(ParsedRequest {
            model,
            stream: view.stream.unwrap_or(false),
            model_span: span_of(body, raw_model),
            stream_options,
            limits: view.limits.map(switchboard_json::scan::token_limit),
            choices: choices_asked(view.n),
            history: History::in_view(body, &view),
        })
    }

    /// The first of the token limits `keys` the body sets, as [`output_limit`] reads it.
    pub fn output_limit(&self, keys: &[&'static str]) -> Result<Option<u32>, ProxyError> {
        first_set(keys.iter().filter_map(|key| {
            let i = LIMITS.iter().position(|l| l == key)?;
            Some((*key, self.limits[i]))
        }))
    }

    /// The choices it asks for (`n`), for an API that takes them: 1 where it sets none.
    pub fn choices(&self) -> u32 {
        self.choices
    }

    /// Whether the client itself asked for the usage chunk of a stream.
    pub fn client_wants_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|(_, inc)| *inc)
    }

    /// The body to send upstream, in one buffer: `model` replaced by `upstream_model`
    /// (JSON-encoded), and for streams `stream_options.include_usage` forced on when
    /// `force_usage`.
    pub fn upstream_body(&self, body: &[u8], upstream_model: &str, force_usage: bool) -> Vec<u8> {
        apply_edits(body, self.edits(body, upstream_model, force_usage))
    }

    /// The body to send upstream as [`ParsedRequest::upstream_body`] gives it, sharing every
    /// byte it keeps with `body`.
    pub fn upstream_payload(
        &self,
        body: &Bytes,
        upstream_model: &str,
        force_usage: bool,
    ) -> Payload {
        Payload::spliced(body, self.edits(body, upstream_model, force_usage))
    }

    fn edits(
        &self,
        body: &[u8],
        upstream_model: &str,
        force_usage: bool,
    ) -> Vec<(Range<usize>, Vec<u8>)> {
        let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
        let written = body.get(self.model_span.clone()).unwrap_or_default();
        if !is_json_string_of(written, upstream_model) {
            let model_json = serde_json::to_vec(upstream_model).unwrap_or_default();
            if written != model_json.as_slice() {
                edits.push((self.model_span.clone(), model_json));
            }
        }
        if force_usage && self.stream && !self.client_wants_usage() {
            match &self.stream_options {
                Some((span, _)) => {
                    let mut opts = body
                        .get(span.clone())
                        .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
                        .filter(|v| v.is_object())
                        .unwrap_or_else(|| serde_json::json!({}));
                    opts["include_usage"] = serde_json::Value::Bool(true);
                    edits.push((span.clone(), opts.to_string().into_bytes()));
                }
                None => {
                    let at = body.iter().position(|b| *b == b'{').map_or(0, |p| p + 1);
                    edits.push((
                        at..at,
                        br#""stream_options":{"include_usage":true},"#.to_vec(),
                    ));
                }
            }
        }
        edits
    }
}

/// The refusal of a body that is not UTF-8, saying where its first wrong byte is.
fn not_utf8(body: &[u8], e: std::str::Utf8Error) -> ProxyError {
    let before = &body[..e.valid_up_to()];
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let column = 1 + before.len()
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
    ProxyError::InvalidJson(format!(
        "the request body is not UTF-8 at line {line} column {column}"
    ))
}

/// Whether `raw` is `text` as serde_json writes it, when that is `text` in quotes: it escapes
/// nothing but quotes, backslashes and control characters.
fn is_json_string_of(raw: &[u8], text: &str) -> bool {
    raw.len() == text.len() + 2
        && raw.first() == Some(&b'"')
        && raw.last() == Some(&b'"')
        && &raw[1..raw.len() - 1] == text.as_bytes()
        && !text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

/// The top-level values of `keys` in `body`, borrowed (a missing key is `None`).
fn top_level<'a>(body: &'a [u8], keys: &[&str]) -> Result<Vec<Option<&'a RawValue>>, ProxyError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Members(keys)
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found));
    found.map_err(|e| ProxyError::InvalidJson(bounded(e)))
}

/// The values of the members named `.0` of a JSON object (the last of a name given twice),
/// the others skipped unread.
struct Members<'k>(&'k [&'k str]);

impl<'de> serde::de::DeserializeSeed<'de> for Members<'_> {
    type Value = Vec<Option<&'de RawValue>>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Members<'_> {
    type Value = Vec<Option<&'de RawValue>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = vec![None; self.0.len()];
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match self.0.iter().position(|k| *k == key) {
                Some(i) => found[i] = Some(map.next_value::<&'de RawValue>()?),
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// The first of the token limits `keys` that `body` sets (a non-negative integer; `null` is
/// unset).
pub(crate) fn output_limit(body: &[u8], keys: &[&'static str]) -> Result<Option<u32>, ProxyError> {
    first_limit(keys, top_level(body, keys)?)
}

/// The first of the token limits `keys` whose values (as found) are set.
fn first_limit(
    keys: &[&'static str],
    found: Vec<Option<&RawValue>>,
) -> Result<Option<u32>, ProxyError> {
    let read = found.into_iter().map(switchboard_json::scan::token_limit);
    first_set(keys.iter().copied().zip(read))
}

/// The first of `limits` (each key with its value as read) that is set; the first that is
/// no limit is the 400.
fn first_set(
    limits: impl IntoIterator<Item = (&'static str, Result<Option<u32>, &'static str>)>,
) -> Result<Option<u32>, ProxyError> {
    for (key, limit) in limits {
        match limit {
            Ok(Some(n)) => return Ok(Some(n)),
            Ok(None) => {}
            Err(message) => {
                return Err(ProxyError::InvalidParam {
                    param: key,
                    message: message.into(),
                })
            }
        }
    }
    Ok(None)
}

/// What `body` asks room for: the first of the token limits `keys` it sets, and, when
/// `choices`, how many choices it asks for (`n`: 1 when unset or not a positive integer).
pub fn output_ask(
    body: &[u8],
    keys: &[&'static str],
    choices: bool,
) -> Result<(Option<u32>, u32), ProxyError> {
    if !choices {
        return Ok((output_limit(body, keys)?, 1));
    }
    let mut read: Vec<&str> = keys.to_vec();
    read.push("n");
    let mut found = top_level(body, &read)?;
    let n = choices_asked(found.pop().flatten());
    Ok((first_limit(keys, found)?, n))
}

/// The choices an `n` of `raw` asks for: 1 where it is no count above zero.
fn choices_asked(raw: Option<&RawValue>) -> u32 {
    raw.and_then(|raw| raw.get().parse::<u32>().ok())
        .map_or(1, |n| n.max(1))
}

/// Every one of the limits `keys` that `body` sets, rewritten to `value`; every other byte
/// as it was.
pub fn clamp_limits(body: &[u8], keys: &[&str], value: u32) -> Result<Vec<u8>, ProxyError> {
    let text = value.to_string().into_bytes();
    let edits = top_level(body, keys)?
        .into_iter()
        .flatten()
        .filter(|raw| raw.get() != "null")
        .map(|raw| (span_of(body, raw), text.clone()))
        .collect();
    Ok(apply_edits(body, edits))
}

#[cfg(test)]
mod tests;
