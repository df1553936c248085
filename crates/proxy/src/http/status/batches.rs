//! The status page's Batch API section: the batches not yet ended, each with its client,
//! endpoint, status and progress (a bar of lines answered and failed), as the batch runner
//! last read them — no database read while the page renders; drawn by `templates/batches.html`.
//! A key sees its owner's.

use serde::Serialize;

use super::charts::tenth;
use super::clients::Viewer;
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
const BAR: u32 = 160;

/// A batch's row as `batches.html` draws it: its progress bar's parts in px to a tenth.
#[derive(Serialize)]
pub(crate) struct BatchLine<'a> {
    id: &'a str,
    client: &'a str,
    endpoint: &'a str,
    status: &'static str,
    bar_w: u32,
    completed: i64,
    failed: i64,
    total: i64,
    done_w: f64,
    failed_w: f64,
    age: String,
}

/// A batch laid out for `batches.html`, `now` in Unix seconds.
pub(crate) fn line(b: &BatchRow, now: u64) -> BatchLine<'_> {
    let total = b.total.max(0) as f64;
    let bar = f64::from(BAR);
    let width = |n: i64| match total > 0.0 {
        true => tenth((n.max(0) as f64 / total * bar).min(bar)),
        false => 0.0,
    };
    let age = now.saturating_sub(b.created_at.max(0) as u64);
    BatchLine {
        id: &b.id,
        client: &b.client,
        endpoint: &b.endpoint,
        status: b.status.as_str(),
        bar_w: BAR,
        completed: b.completed,
        failed: b.failed,
        total: b.total,
        done_w: width(b.completed),
        failed_w: width(b.failed),
        age: super::span::span(std::time::Duration::from_secs(age)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drawn(ctx: minijinja::Value) -> String {
        super::super::templates::render("batches.html", ctx).unwrap()
    }

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
        let batches = [line(&b, 190)];
        let out = drawn(minijinja::context! { batches });
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
        let none: [BatchLine; 0] = [];
        assert!(drawn(minijinja::context! { batches => none })
            .trim()
            .is_empty());
    }
}
