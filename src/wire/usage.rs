//! Token usage and timings as a backend reports them: in one stream event or a whole answer.
//!
//! An event is small and parsed whole (its `choices` say whether it is the usage-only chunk).
//! A whole answer is mostly text the proxy does not need: its `usage` object is found by its
//! key (see `json_scan`) and parsed alone, and llama.cpp's `timings` object walked (a flat
//! object of numbers, see [`walked`]). Every backend's answer carries `usage` (and
//! llama.cpp's `timings`) at the top level after `choices`, and no such object after it: the
//! last occurrence is the one read. A body that writes a word character as an
//! escape (where a key may hide from the search, see `json_scan`) is parsed whole instead.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde::Deserialize;

use crate::json_scan::{finder, may_escape_word, skip_ws, values};
use crate::json_walk;

/// Token usage as a backend reported it.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub reasoning: Option<u64>,
    /// Prompt tokens read from the backend's cache, where it says so (`cached_tokens` of
    /// the prompt's details, Messages' `cache_read_input_tokens`).
    pub cached: Option<u64>,
    /// llama.cpp `timings`: prompt and generation speed as the backend measured them.
    pub prefill_tps: Option<f64>,
    pub decode_tps: Option<f64>,
    /// llama.cpp `timings`: the work as the backend measured it.
    pub timings: Option<Timings>,
}

#[derive(Deserialize)]
struct UsageChunk<'a> {
    choices: Option<Vec<serde::de::IgnoredAny>>,
    usage: Option<WireUsage>,
    #[serde(borrow)]
    timings: Option<&'a serde_json::value::RawValue>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    completion_tokens_details: Option<Details>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct Details {
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

/// llama.cpp's `timings`: the work of one answer as the backend measured it.
#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq)]
pub struct Timings {
    /// Prompt tokens read from the slot's cache.
    pub cache_n: Option<u64>,
    /// Prompt tokens processed.
    pub prompt_n: Option<u64>,
    pub prompt_ms: Option<f64>,
    pub prompt_per_second: Option<f64>,
    /// Tokens generated.
    pub predicted_n: Option<u64>,
    pub predicted_ms: Option<f64>,
    pub predicted_per_second: Option<f64>,
}

impl Timings {
    /// The `timings` object `v` (as [`of_body`] reads its text).
    pub fn of_value(v: &serde_json::Value) -> Option<Timings> {
        Timings::deserialize(v).ok()
    }

    /// Field `f` (as [`field`] numbers them) read from the scalar `value` as its
    /// `Deserialize` reads it; `false` when that fails.
    fn read(&mut self, f: usize, value: &[u8]) -> bool {
        fn parse<'a, T: Deserialize<'a>>(value: &'a [u8]) -> Result<T, serde_json::Error> {
            T::deserialize(&mut serde_json::Deserializer::from_slice(value))
        }
        let read = match f {
            0 => parse(value).map(|v| self.cache_n = v),
            1 => parse(value).map(|v| self.prompt_n = v),
            2 => parse(value).map(|v| self.prompt_ms = v),
            3 => parse(value).map(|v| self.prompt_per_second = v),
            4 => parse(value).map(|v| self.predicted_n = v),
            5 => parse(value).map(|v| self.predicted_ms = v),
            _ => parse(value).map(|v| self.predicted_per_second = v),
        };
        read.is_ok()
    }
}

fn usage_with(u: WireUsage, timings: Option<Timings>) -> Usage {
    let t = timings.unwrap_or_default();
    Usage {
        prompt: u.prompt_tokens,
        completion: u.completion_tokens,
        reasoning: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
        cached: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        prefill_tps: t.prompt_per_second,
        decode_tps: t.predicted_per_second,
        timings,
    }
}

/// Usage and timings of one stream event, and whether it is the usage-only chunk (empty
/// `choices`); `None` when it has no usage.
pub fn of_event(data: &[u8]) -> Option<(Usage, bool)> {
    let c: UsageChunk = serde_json::from_slice(data).ok()?;
    let usage_only = c.choices.as_ref().is_some_and(|ch| ch.is_empty());
    let timings = c.timings.and_then(|t| serde_json::from_str(t.get()).ok());
    Some((usage_with(c.usage?, timings), usage_only))
}

static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"\"usage\""));
static TIMINGS: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"\"timings\""));

/// Usage and timings of a whole (non-streamed) answer; `None` when it is not a JSON object
/// or has no usage object.
///
/// Reads what [`of_event`] reads, for a fraction of its cost, when the top-level `usage` is
/// the last `usage` object of the answer (as in every backend's layout): that object is
/// found by its key and parsed alone, and so is the object under the last `timings` key.
pub fn of_body(body: &[u8]) -> Option<Usage> {
    // An array (llama.cpp's answer to several prompts at once) holds a usage per prompt.
    if skip_ws(body).first() != Some(&b'{') {
        return None;
    }
    if may_escape_word(body) {
        return of_event(body).map(|(u, _)| u);
    }
    let usage = last_object(body, &USAGE)?;
    let timings = last_object(body, &TIMINGS);
    // Both sit at the answer's end: the text from the first of them on is checked as UTF-8
    // once, and the usage is read from it as text (no string of its is checked again). The
    // timings are walked as bytes (their numbers are ASCII), else read from the text too.
    let from = body.len() - usage.len().max(timings.map_or(0, <[u8]>::len));
    let tail = std::str::from_utf8(&body[from..]).ok();
    let u = object::<WireUsage>(usage, tail)?;
    let timings = timings.and_then(|t| walked(t).unwrap_or_else(|| object(t, tail)));
    Some(usage_with(u, timings))
}

/// The index of [`Timings`]' member named `key`, in the order of its fields.
fn field(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"cache_n" => 0,
        b"prompt_n" => 1,
        b"prompt_ms" => 2,
        b"prompt_per_second" => 3,
        b"predicted_n" => 4,
        b"predicted_ms" => 5,
        b"predicted_per_second" => 6,
        _ => return None,
    })
}

/// llama.cpp's `timings` object that opens `b` (what follows it is not read), as
/// [`Timings`]' `Deserialize` reads it: unknown members skipped, a known one given twice or
/// not a number (or `null`) failing the whole. `None` when the walk cannot tell: a member
/// that is a string, object or array, a key with an escape, text that is not an object —
/// then it is parsed whole.
///
/// Hand-walked because the object is flat and small: nine numbers, whose parse by
/// serde_json cost some 4,400 instructions (skipping them alone 2,800). The walk skips the
/// two it does not need and reads the seven it does each by serde_json itself (the same
/// number to the bit): under callgrind (`benches/load/instructions.sh`, 64 connections) a
/// proxied chat took some 52,900 instructions with the object parsed, 51,900–52,300 walked.
fn walked(b: &[u8]) -> Option<Option<Timings>> {
    let ws = |i| json_walk::skip_ws(b, i);
    if b.first() != Some(&b'{') {
        return None;
    }
    let mut t = Timings::default();
    let mut seen = 0u8;
    let mut i = ws(1);
    if b.get(i) == Some(&b'}') {
        return Some(Some(t));
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let end = i + 1 + memchr::memchr2(b'"', b'\\', &b[i + 1..])?;
        if b[end] != b'"' {
            return None;
        }
        let key = &b[i + 1..end];
        i = ws(end + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = ws(i + 1);
        if matches!(b.get(start)?, b'"' | b'{' | b'[') {
            return None;
        }
        i = json_walk::value_end(b, start);
        let value = &b[start..i];
        if let Some(f) = field(key) {
            if seen & (1 << f) != 0 || !t.read(f, value) {
                return Some(None);
            }
            seen |= 1 << f;
        }
        i = ws(i);
        match b.get(i) {
            Some(b',') => i = ws(i + 1),
            Some(b'}') => return Some(Some(t)),
            _ => return None,
        }
    }
}

/// The object that starts `at` (what follows it is not read), `None` when it is not a `T`;
/// read from `tail` as text when that holds `at` (both run to the body's end).
fn object<'b, T: Deserialize<'b>>(at: &'b [u8], tail: Option<&'b str>) -> Option<T> {
    let text = tail.and_then(|t| t.get(t.len().checked_sub(at.len())?..));
    match text {
        Some(text) => T::deserialize(&mut serde_json::Deserializer::from_str(text)).ok(),
        None => T::deserialize(&mut serde_json::Deserializer::from_slice(at)).ok(),
    }
}

/// `body` from the start of the object under the last `key` on.
fn last_object<'b>(body: &'b [u8], key: &'b Finder<'static>) -> Option<&'b [u8]> {
    values(body, key)
        .filter(|v| v.first() == Some(&b'{'))
        .last()
}

#[cfg(test)]
mod tests;
