//! A whole answer's `usage` and `timings` as the backends write them, read by matching the
//! text: each key and separator byte for byte, each number by `switchboard_json::number`.
//!
//! llama-server and vLLM write these objects the same way every time (their members in one
//! order, no whitespace), and a walk member by member (see `walk`) spends most of its time
//! finding and matching keys: under callgrind (`benches/load/instructions.sh`, llama.cpp
//! answers of 16 tokens) `of_body` took some 4,100 instructions a chat with both objects
//! walked, 2,700 with them read here. Text laid out otherwise (another order, whitespace,
//! `null` where a number is, a number `switchboard_json::number` leaves to serde_json) is not
//! read here: the caller walks it. Where a layout matches, the object holds exactly its
//! members, each a number read as serde_json reads it, so what is read is what the object's
//! parse reads (property tests in `usage/tests/layouts.rs`).

use switchboard_json::number::{f64_at, u64_at};

/// One piece of a layout.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    /// This text, byte for byte.
    Text(&'static [u8]),
    /// A count (a `u64`), kept in `Read::counts` at this place.
    Count(usize),
    /// A number (an `f64`), kept in `Read::numbers` at this place.
    Number(usize),
    /// A number no field reads.
    Skip,
    /// `null`, or these steps.
    NullOr(&'static [Step]),
}

use Step::{Count, NullOr, Number, Skip, Text};

/// The places of the counts a usage object's layouts read.
pub(super) mod usage {
    pub(crate) const PROMPT: usize = 0;
    pub(crate) const COMPLETION: usize = 1;
    pub(crate) const CACHED: usize = 2;
}

/// The places of the counts and numbers llama.cpp's `timings` layout reads.
pub(super) mod timings {
    pub(crate) const CACHE_N: usize = 0;
    pub(crate) const PROMPT_N: usize = 1;
    pub(crate) const PREDICTED_N: usize = 2;
    pub(crate) const PROMPT_MS: usize = 0;
    pub(crate) const PROMPT_PER_SECOND: usize = 1;
    pub(crate) const PREDICTED_MS: usize = 2;
    pub(crate) const PREDICTED_PER_SECOND: usize = 3;
}

/// The usage objects of llama-server and of vLLM (its `UsageInfo`'s fields in order), their
/// prompt's details `null` or the cached tokens (always given by llama-server, by vLLM with
/// `--enable-prompt-tokens-details`).
pub(super) const USAGE: [&[Step]; 2] = [
    &[
        Text(br#"{"completion_tokens":"#),
        Count(usage::COMPLETION),
        Text(br#","prompt_tokens":"#),
        Count(usage::PROMPT),
        Text(br#","total_tokens":"#),
        Skip,
        Text(br#","prompt_tokens_details":"#),
        NullOr(CACHED),
        Text(b"}"),
    ],
    &[
        Text(br#"{"prompt_tokens":"#),
        Count(usage::PROMPT),
        Text(br#","total_tokens":"#),
        Skip,
        Text(br#","completion_tokens":"#),
        Count(usage::COMPLETION),
        Text(br#","prompt_tokens_details":"#),
        NullOr(CACHED),
        Text(b"}"),
    ],
];

/// A prompt's details: its cached tokens.
const CACHED: &[Step] = &[
    Text(br#"{"cached_tokens":"#),
    Count(usage::CACHED),
    Text(b"}"),
];

/// llama-server's `timings`.
pub(super) const TIMINGS: &[Step] = &[
    Text(br#"{"cache_n":"#),
    Count(timings::CACHE_N),
    Text(br#","prompt_n":"#),
    Count(timings::PROMPT_N),
    Text(br#","prompt_ms":"#),
    Number(timings::PROMPT_MS),
    Text(br#","prompt_per_token_ms":"#),
    Skip,
    Text(br#","prompt_per_second":"#),
    Number(timings::PROMPT_PER_SECOND),
    Text(br#","predicted_n":"#),
    Count(timings::PREDICTED_N),
    Text(br#","predicted_ms":"#),
    Number(timings::PREDICTED_MS),
    Text(br#","predicted_per_token_ms":"#),
    Skip,
    Text(br#","predicted_per_second":"#),
    Number(timings::PREDICTED_PER_SECOND),
    Text(b"}"),
];

/// What a layout read: the counts and numbers at their places (`None` where it has none).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Read {
    pub(crate) counts: [Option<u64>; 3],
    pub(crate) numbers: [Option<f64>; 4],
}

/// The object that opens `b` read by `layout`, when it is written exactly so (what follows
/// the object is not read); `None` when it is not.
pub(super) fn read(b: &[u8], layout: &[Step]) -> Option<Read> {
    let mut read = Read::default();
    steps(b, 0, layout, &mut read)?;
    Some(read)
}

/// The text at `b[at..]` read by `layout` into `read`: where it ends, `None` where it is
/// written otherwise.
fn steps(b: &[u8], at: usize, layout: &[Step], read: &mut Read) -> Option<usize> {
    let mut i = at;
    for step in layout {
        i = match *step {
            Text(text) => {
                if !begins_with(b.get(i..)?, text) {
                    return None;
                }
                i + text.len()
            }
            Count(at) => {
                let (n, end) = u64_at(b, i)?;
                read.counts[at] = Some(n);
                end
            }
            Number(at) => {
                let (x, end) = f64_at(b, i)?;
                read.numbers[at] = Some(x);
                end
            }
            Skip => f64_at(b, i)?.1,
            NullOr(_) if begins_with(b.get(i..)?, b"null") => i + 4,
            NullOr(inner) => steps(b, i, inner, read)?,
        };
    }
    Some(i)
}

/// Whether `b` begins with `text`, compared eight bytes at a time (the last eight overlapping
/// those before where its length is no multiple of eight): a layout's texts and keys are a few
/// words long, shorter than a call to `memcmp` costs.
pub(super) fn begins_with(b: &[u8], text: &[u8]) -> bool {
    let n = text.len();
    let Some(b) = b.get(..n) else {
        return false;
    };
    if n < 8 {
        return b == text;
    }
    let word = |s: &[u8], at: usize| s[at..].first_chunk::<8>().map(|w| u64::from_ne_bytes(*w));
    let mut at = 0;
    while at + 8 < n {
        if word(b, at) != word(text, at) {
            return false;
        }
        at += 8;
    }
    word(b, n - 8) == word(text, n - 8)
}
