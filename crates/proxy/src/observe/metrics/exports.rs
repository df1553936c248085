//! What the proxy sends elsewhere in the background, and what it could not: spans to the
//! trace collector, usage rows to the ledger's database.

use prometheus_client::registry::Registry;

use super::labels::{SpanDrop, SpansDropped};
use crate::ledger::Counters;

pub(super) fn register(r: &mut Registry, spans: &SpansDropped, ledger: &Counters) {
    for reason in [
        SpanDrop::queue_full,
        SpanDrop::export_failed,
        SpanDrop::too_large,
    ] {
        spans.add(reason, 0);
    }
    r.register(
        "trace_spans_dropped",
        "Spans not exported (queue_full: tracing.queue_spans were waiting; export_failed: the collector refused, was unreachable or too slow; too_large: one span over tracing.export_max_bytes), by reason",
        spans.0.clone(),
    );
    r.register(
        "ledger_rows_written",
        "Usage rows committed to the ledger's database",
        ledger.written.clone(),
    );
    r.register(
        "ledger_rows_dropped",
        "Usage rows given up: ledger.buffer_rows were waiting for the database (or it refused them at exit)",
        ledger.dropped.clone(),
    );
    r.register(
        "ledger_rows_waiting",
        "Usage rows waiting to be written to the ledger's database",
        ledger.waiting.clone(),
    );
    r.register(
        "ledger_up",
        "1 while the ledger's last write succeeded; 0 while its writes fail, and without a ledger",
        ledger.up.clone(),
    );
}
