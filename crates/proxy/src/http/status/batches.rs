//! The status page's Batch API section: the batches not yet ended, each with its client,
//! endpoint, status and progress (a bar of lines answered and failed), as the batch runner
//! last read them — no database read while the page renders. A key sees its owner's.

use std::fmt::Write;

use super::clients::Viewer;
use super::escape::E;
use crate::batches::store::BatchRow;
use crate::live::AppState;

/// The batches the viewer sees, oldest first (none while the Batch API is off).
pub(crate) fn collect(state: &AppState, viewer: &Viewer) -> Vec<BatchRow> {
    let Ok(batches) = &state.batches else {
        return Vec::new();
    };
    batches
        .active()
        .iter()
        .filter(|b| viewer.owns(&b.client))
        .take(MAX_SHOWN)
        .cloned()
        .collect()
}

/// The most batches listed (the page stays bounded).
const MAX_SHOWN: usize = 50;

/// Width of the progress bar in px.
const BAR: f64 = 160.0;

pub(crate) fn render(out: &mut String, batches: &[BatchRow], now: u64) {
    if batches.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Batches in progress</h2>\n<table class=\"batches\">\n<thead><tr><th>batch</th>\
         <th>client</th><th>endpoint</th><th>status</th><th>progress</th>\
         <th class=\"n\">age</th></tr></thead>\n<tbody>\n",
    );
    for b in batches {
        let total = b.total.max(0) as f64;
        let width = |n: i64| match total > 0.0 {
            true => (n.max(0) as f64 / total * BAR).min(BAR),
            false => 0.0,
        };
        let (done, failed) = (width(b.completed), width(b.failed));
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>\
             <svg class=\"progress\" width=\"{BAR}\" height=\"10\" role=\"img\" \
             aria-label=\"{c} of {t} done, {f} failed\"><rect width=\"{BAR}\" height=\"10\" \
             class=\"left\"/><rect width=\"{done:.1}\" height=\"10\" class=\"done\"/>\
             <rect x=\"{done:.1}\" width=\"{failed:.1}\" height=\"10\" class=\"failed\"/></svg> \
             {c} of {t} done · {f} failed</td><td class=\"n\">{}</td></tr>",
            E(&b.id),
            E(&b.client),
            E(&b.endpoint),
            E(b.status.as_str()),
            super::span::span(std::time::Duration::from_secs(
                now.saturating_sub(b.created_at.max(0) as u64)
            )),
            c = b.completed,
            t = b.total,
            f = b.failed,
        );
    }
    out.push_str("</tbody>\n</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_a_row_with_its_progress_as_a_bar_and_in_words() {
        let b = BatchRow {
            id: "batch_<x>".into(),
            client: "ann".into(),
            endpoint: "/v1/chat/completions".into(),
            status: crate::batches::BatchState::InProgress,
            created_at: 100,
            total: 40,
            completed: 10,
            failed: 2,
            ..BatchRow::default()
        };
        let mut out = String::new();
        render(&mut out, &[b], 190);
        assert!(out.contains("batch_&lt;x&gt;"), "{out}");
        assert!(out.contains("10 of 40 done · 2 failed"), "{out}");
        assert!(
            out.contains("<rect width=\"40.0\" height=\"10\" class=\"done\"/>"),
            "{out}"
        );
        assert!(out.contains("<rect x=\"40.0\" width=\"8.0\""), "{out}");
        assert!(
            out.contains(">1 min 30 s<") || out.contains(">90 s<"),
            "{out}"
        );
        let mut none = String::new();
        render(&mut none, &[], 0);
        assert!(none.is_empty());
    }
}
