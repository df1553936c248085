//! The status page's table of aliases: a row per alias (its backends with their state, load,
//! cost model and queue; its last five minutes and their charts), laid out for
//! `templates/aliases.html`.

use serde::Serialize;

use super::charts::{self, Chart};
use super::view::{AliasView, BackendView};

/// The most waiting requests named in a backend's cell.
const WAITS_SHOWN: usize = 8;

/// An alias's row as `aliases.html` draws it.
#[derive(Serialize)]
pub(crate) struct AliasRow<'a> {
    name: &'a str,
    description: Option<&'a str>,
    old_names: &'a [String],
    /// The share of its prompt tokens read from cache, in %, once it has any.
    cached: Option<String>,
    backends: Vec<BackendCell<'a>>,
    inflight: i64,
    queued: i64,
    requests: u64,
    errors: u64,
    rejections: u64,
    ttft: String,
    decode: String,
    window: String,
    /// Its last five minutes charted (none without a window).
    charts: Vec<Chart>,
}

/// A backend in an alias's row.
#[derive(Serialize)]
struct BackendCell<'a> {
    name: &'a str,
    state_class: &'static str,
    state_words: &'static str,
    flavor: &'static str,
    busy: u32,
    slots: u32,
    queue_limit: u32,
    url: &'a str,
    prefill: String,
    /// Prefill's half depth, in thousands of tokens.
    half_depth: Option<String>,
    decode: String,
    learned: String,
    /// The first waiting requests' class and predicted wait, and how many more wait.
    waits: Vec<(&'static str, String)>,
    more_waits: usize,
}

/// The CSS class and the words of a backend state. A breaker state is one more arm here
/// (its class, `breaker`, is styled already).
fn state_cell(state: &str) -> (&'static str, &'static str) {
    match state {
        "up" => ("up", "up"),
        "loading" => ("loading", "loading"),
        "down" => ("down", "down"),
        "breaker_open" => ("breaker", "breaker open"),
        _ => ("unknown", "not probed yet"),
    }
}

/// An alias's row laid out for `aliases.html`.
pub(crate) fn row(a: &AliasView) -> AliasRow<'_> {
    let w = &a.last_5m;
    let cached = (a.prompt_tokens > 0).then(|| {
        let share = a.cached_tokens as f64 / a.prompt_tokens as f64;
        format!("{:.0}", share * 100.0)
    });
    AliasRow {
        name: &a.name,
        description: a.description.as_deref(),
        old_names: &a.old_names,
        cached,
        backends: a.backends.iter().map(cell).collect(),
        inflight: a.inflight,
        queued: a.queued,
        requests: w.requests,
        errors: w.errors,
        rejections: w.rejections,
        ttft: w.ttft_p50.map_or("–".into(), seconds),
        decode: w.decode_p50.map_or("–".into(), |v| format!("{v:.0}")),
        window: a.context_window.map_or("–".into(), |n| n.to_string()),
        charts: match a.series.is_empty() {
            true => Vec::new(),
            false => charts::window(&a.series),
        },
    }
}

/// A backend's cell laid out.
fn cell(b: &BackendView) -> BackendCell<'_> {
    let (state_class, state_words) = state_cell(b.state);
    let c = &b.cost;
    BackendCell {
        name: &b.name,
        state_class,
        state_words,
        flavor: b.flavor,
        busy: b.busy,
        slots: b.slots,
        queue_limit: b.queue_limit,
        url: &b.url,
        prefill: format!("{:.0}", c.prefill_tps),
        half_depth: c
            .prefill_half_depth
            .map(|d| (d / 1000.0).round().to_string()),
        decode: format!("{:.1}", c.decode_tps),
        learned: format!("{:.0}", c.learned),
        waits: b
            .queue
            .iter()
            .take(WAITS_SHOWN)
            .map(|(class, wait)| (*class, seconds(wait.as_secs_f64())))
            .collect(),
        more_waits: b.queue.len().saturating_sub(WAITS_SHOWN),
    }
}

/// Seconds as the TTFT column shows them.
fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_its_class_and_words() {
        assert_eq!(state_cell("up"), ("up", "up"));
        assert_eq!(state_cell("breaker_open"), ("breaker", "breaker open"));
        assert_eq!(state_cell("loading"), ("loading", "loading"));
        assert_eq!(state_cell("down"), ("down", "down"));
        assert_eq!(state_cell("unknown").0, "unknown");
    }

    #[test]
    fn seconds_keep_two_places_below_ten() {
        assert_eq!(seconds(0.25), "0.25 s");
        assert_eq!(seconds(42.4), "42 s");
    }
}
