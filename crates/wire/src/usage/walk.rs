//! A whole answer's `usage` and `timings` objects, walked member by member where they are not
//! written as a backend writes them (see `layout`, tried first).
//!
//! Both are small: numbers, and in `usage` two objects of numbers (its details). Each walk
//! reads what the type's `Deserialize` reads: unknown members skipped, a known one given twice
//! or of the wrong type failing the whole ([`Stop::Fails`]). Where it cannot tell (a key with
//! an escape, a known member that is neither a number, `null` nor an object of them) it says so
//! ([`Stop::Unsure`]) and the object is parsed. Numbers are read by `switchboard_json::number`,
//! and by serde_json one by one where it cannot read them.
//!
//! Hand-walked because serde_json's parse of the two was most of what reading an answer's
//! usage cost: under callgrind (`benches/load/instructions.sh`, 8 connections, llama.cpp
//! answers of 16 tokens) [`super::of_body`] took some 8,000 instructions a chat with the
//! usage parsed and each `timings` number read by serde_json, 5,800 walked so.
//!
//! The text must be valid JSON, as an answer read here is: on other text the answers are
//! unspecified but nothing panics. Property tests hold every answer to the parse's
//! (`usage/tests.rs`).

use serde::Deserialize;

use switchboard_json::number::{f64_at, u64_at};
use switchboard_json::walk::{quote_or_escape, skip_ws, value_end};

use super::layout;
use super::{Details, PromptDetails, Timings, WireUsage};

/// Why a walk stopped short.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Stop {
    /// The text is not what the type reads: its parse fails too.
    Fails,
    /// The walk cannot tell: the object is to be parsed.
    Unsure,
}

type Walk<T> = Result<T, Stop>;

/// The usage object that opens `b`, as [`WireUsage`]' `Deserialize` reads it: read by a
/// backend's layout where it is written so, else walked.
pub(super) fn usage(b: &[u8]) -> Walk<WireUsage> {
    use layout::usage::{CACHED, COMPLETION, PROMPT};
    if let Some(r) = layout::USAGE.iter().find_map(|l| layout::read(b, l)) {
        return Ok(WireUsage {
            prompt_tokens: r.counts[PROMPT].unwrap_or(0),
            completion_tokens: r.counts[COMPLETION].unwrap_or(0),
            completion_tokens_details: None,
            prompt_tokens_details: r.counts[CACHED].map(|n| PromptDetails {
                cached_tokens: Some(n),
            }),
        });
    }
    let mut u = WireUsage {
        prompt_tokens: 0,
        completion_tokens: 0,
        completion_tokens_details: None,
        prompt_tokens_details: None,
    };
    let mut seen = Seen::default();
    members(b, 0, |key, at| {
        Ok(match key {
            b"prompt_tokens" => {
                seen.first(0)?;
                let (n, end) = count(b, at)?;
                u.prompt_tokens = n.ok_or(Stop::Fails)?;
                end
            }
            b"completion_tokens" => {
                seen.first(1)?;
                let (n, end) = count(b, at)?;
                u.completion_tokens = n.ok_or(Stop::Fails)?;
                end
            }
            b"completion_tokens_details" => {
                seen.first(2)?;
                let (d, end) = details(b, at, b"reasoning_tokens")?;
                u.completion_tokens_details =
                    d.map(|reasoning_tokens| Details { reasoning_tokens });
                end
            }
            b"prompt_tokens_details" => {
                seen.first(3)?;
                let (d, end) = details(b, at, b"cached_tokens")?;
                u.prompt_tokens_details = d.map(|cached_tokens| PromptDetails { cached_tokens });
                end
            }
            _ => value_end(b, at),
        })
    })?;
    Ok(u)
}

/// llama.cpp's `timings` object that opens `b`, as [`Timings`]' `Deserialize` reads it: read
/// by llama-server's layout where it is written so, else walked.
pub(super) fn timings(b: &[u8]) -> Walk<Timings> {
    use layout::timings::*;
    if let Some(r) = layout::read(b, layout::TIMINGS) {
        return Ok(Timings {
            cache_n: r.counts[CACHE_N],
            prompt_n: r.counts[PROMPT_N],
            prompt_ms: r.numbers[PROMPT_MS],
            prompt_per_second: r.numbers[PROMPT_PER_SECOND],
            predicted_n: r.counts[PREDICTED_N],
            predicted_ms: r.numbers[PREDICTED_MS],
            predicted_per_second: r.numbers[PREDICTED_PER_SECOND],
        });
    }
    let mut t = Timings::default();
    let mut seen = Seen::default();
    members(b, 0, |key, at| {
        let (field, slot) = match key {
            b"cache_n" => (0, Member::Count(&mut t.cache_n)),
            b"prompt_n" => (1, Member::Count(&mut t.prompt_n)),
            b"prompt_ms" => (2, Member::Time(&mut t.prompt_ms)),
            b"prompt_per_second" => (3, Member::Time(&mut t.prompt_per_second)),
            b"predicted_n" => (4, Member::Count(&mut t.predicted_n)),
            b"predicted_ms" => (5, Member::Time(&mut t.predicted_ms)),
            b"predicted_per_second" => (6, Member::Time(&mut t.predicted_per_second)),
            _ => return Ok(value_end(b, at)),
        };
        seen.first(field)?;
        Ok(match slot {
            Member::Count(n) => {
                let end;
                (*n, end) = count(b, at)?;
                end
            }
            Member::Time(f) => {
                let end;
                (*f, end) = scalar(b, at, f64_at)?;
                end
            }
        })
    })?;
    Ok(t)
}

/// A field of [`Timings`] a member is read into.
enum Member<'t> {
    Count(&'t mut Option<u64>),
    Time(&'t mut Option<f64>),
}

/// The known members an object has had, by number: a second of one fails the object, as it
/// fails a derived `Deserialize`.
#[derive(Default)]
struct Seen(u8);

impl Seen {
    fn first(&mut self, field: u8) -> Walk<()> {
        if self.0 & (1 << field) != 0 {
            return Err(Stop::Fails);
        }
        self.0 |= 1 << field;
        Ok(())
    }
}

/// The members of the object that opens `b[at..]`, each handed to `read` with its key and
/// where its value starts; `read` returns where the value ends. Where the object ends.
fn members(b: &[u8], at: usize, mut read: impl FnMut(&[u8], usize) -> Walk<usize>) -> Walk<usize> {
    if b.get(at) != Some(&b'{') {
        return Err(Stop::Unsure);
    }
    let mut i = skip_ws(b, at + 1);
    if b.get(i) == Some(&b'}') {
        return Ok(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return Err(Stop::Unsure);
        }
        // Keys are short: searched a word at a time, with no vector search's set-up.
        let end = i + 1 + quote_or_escape(&b[i + 1..]).ok_or(Stop::Unsure)?;
        if b[end] != b'"' {
            return Err(Stop::Unsure);
        }
        let key = &b[i + 1..end];
        i = skip_ws(b, end + 1);
        if b.get(i) != Some(&b':') {
            return Err(Stop::Unsure);
        }
        i = skip_ws(b, read(key, skip_ws(b, i + 1))?);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Ok(i + 1),
            _ => return Err(Stop::Unsure),
        }
    }
}

/// An `Option<u64>` at `b[at..]` and where it ends.
fn count(b: &[u8], at: usize) -> Walk<(Option<u64>, usize)> {
    scalar(b, at, u64_at)
}

/// An `Option<T>` at `b[at..]` (not an object, array or string) and where it ends: read by
/// `fast` where it can, else by serde_json.
fn scalar<'b, T: Deserialize<'b>>(
    b: &'b [u8],
    at: usize,
    fast: impl FnOnce(&[u8], usize) -> Option<(T, usize)>,
) -> Walk<(Option<T>, usize)> {
    if let Some((v, end)) = fast(b, at) {
        return Ok((Some(v), end));
    }
    if b[at..].starts_with(b"null") {
        return Ok((None, at + 4));
    }
    if matches!(b.get(at), None | Some(b'"' | b'{' | b'[')) {
        return Err(Stop::Unsure);
    }
    let end = value_end(b, at);
    let read = Option::<T>::deserialize(&mut serde_json::Deserializer::from_slice(&b[at..end]));
    Ok((read.map_err(|_| Stop::Fails)?, end))
}

/// A details object at `b[at..]` (or `null`) whose one member read is the count `name`:
/// `None` for `null`, else that count; and where it ends.
fn details(b: &[u8], at: usize, name: &[u8]) -> Walk<(Option<Option<u64>>, usize)> {
    if b[at..].starts_with(b"null") {
        return Ok((None, at + 4));
    }
    let mut n = None;
    let mut seen = Seen::default();
    let end = members(b, at, |key, at| {
        if key != name {
            return Ok(value_end(b, at));
        }
        seen.first(0)?;
        let (v, end) = count(b, at)?;
        n = v;
        Ok(end)
    })?;
    Ok((Some(n), end))
}
