//! Token usage and timings as a backend reports them: in one stream event or a whole answer.
//!
//! An event is small and parsed whole (its `choices` say whether it is the usage-only chunk).
//! A whole answer is mostly text the proxy does not need: its `usage` object is found by its
//! key (see `switchboard_json::scan`) and read alone, by the layout its backend writes it in
//! (see `layout`) or else walked (see `walk`), as is llama.cpp's `timings` object.
//! Every backend's answer carries `usage` (and llama.cpp's `timings`) at the top level after
//! `choices`, and no such object after it: the last occurrence is the one read. A body that
//! writes a word character as an escape (where a key may hide from the search, see
//! `switchboard_json::scan`) is parsed whole instead.
//!
//! Both keys are found in one search from the end, where they are: at each `g` (the letter
//! they share, rare in JSON keys) both spellings are tried until the usage is found; a
//! `timings` not found after it is searched for before it, forward. Under callgrind
//! (`benches/load/instructions.sh`) the two forward searches of the whole body cost some
//! 1,600 instructions a chat answer.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde::Deserialize;

use switchboard_json::scan::{finder, may_escape_word, skip_ws, values};

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
    pub(crate) fn of_value(v: &serde_json::Value) -> Option<Timings> {
        Timings::deserialize(v).ok()
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

/// Usage and timings of a whole (non-streamed) answer; `None` when it is not a JSON object
/// or has no usage object.
///
/// Reads what [`of_event`] reads, for a fraction of its cost, when the top-level `usage` is
/// the last `usage` object of the answer (as in every backend's layout): that object is
/// found by its key and read alone, and so is the object under the last `timings` key.
pub fn of_body(body: &[u8]) -> Option<Usage> {
    // An array (llama.cpp's answer to several prompts at once) holds a usage per prompt.
    if skip_ws(body).first() != Some(&b'{') {
        return None;
    }
    if may_escape_word(body) {
        return of_event(body).map(|(u, _)| u);
    }
    let (usage, timings) = last_objects(body);
    let usage = usage?;
    let u = read(walk::usage(usage), usage)?;
    let timings = timings.and_then(|t| read(walk::timings(t), t));
    Some(usage_with(u, timings))
}

/// What a walk of the object that opens `at` read; where it could not tell, the object's
/// parse (what follows the object is not read). `None` when either fails.
fn read<'b, T: Deserialize<'b>>(walk: Result<T, walk::Stop>, at: &'b [u8]) -> Option<T> {
    match walk {
        Ok(v) => Some(v),
        Err(walk::Stop::Fails) => None,
        Err(walk::Stop::Unsure) => {
            T::deserialize(&mut serde_json::Deserializer::from_slice(at)).ok()
        }
    }
}

/// `body` from the start of the object under the last `"usage"` key on, and from the start
/// of the object under the last `"timings"` key on.
fn last_objects(body: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let (mut usage, mut timings) = (None, None);
    for g in memchr::memrchr_iter(b'g', body) {
        if timings.is_none() {
            timings = object_under(body, g, b"\"timings\"", 6);
        }
        if usage.is_none() {
            usage = object_under(body, g, b"\"usage\"", 4);
            if usage.is_some() && timings.is_none() {
                // A `timings` left to find is before the usage, where the answer's text is
                // (a vLLM answer has none): searched forward, at a vector search's pace.
                let before = &body[..g - 4];
                let last = values(before, &TIMINGS).filter(|v| v.first() == Some(&b'{'));
                timings = last.last().map(|v| &body[before.len() - v.len()..]);
            }
        }
        if usage.is_some() {
            break;
        }
    }
    (usage, timings)
}

static TIMINGS: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"\"timings\""));

/// `body` from the start of the object under the key `quoted` (with its quotes) whose byte
/// `g` is `body[at]`: where that key is written there, follows no backslash, and its value
/// is an object.
fn object_under<'b>(body: &'b [u8], at: usize, quoted: &[u8], g: usize) -> Option<&'b [u8]> {
    let start = at.checked_sub(g)?;
    let end = start + quoted.len();
    if !layout::begins_with(&body[start..], quoted) || (start > 0 && body[start - 1] == b'\\') {
        return None;
    }
    let value = skip_ws(skip_ws(&body[end..]).strip_prefix(b":")?);
    (value.first() == Some(&b'{')).then_some(value)
}

mod layout;
#[cfg(test)]
mod tests;
mod walk;
