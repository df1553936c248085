//! The Batch API's families: its lines' runs by outcome and their waits for a slot, its
//! batches by status, and whether its database answers.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::labels::DURATION;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LineLabels {
    alias: String,
    client: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StatusLabel {
    status: String,
}

#[derive(Debug)]
pub struct BatchFamilies {
    lines: Family<LineLabels, Counter>,
    by_status: Family<StatusLabel, Gauge>,
    queue_wait: Histogram,
    /// 1 while the Batch API's last call to its database worked (0 without a Batch API).
    pub(crate) db_up: Gauge,
}

impl Default for BatchFamilies {
    fn default() -> BatchFamilies {
        BatchFamilies {
            lines: Family::default(),
            by_status: Family::default(),
            queue_wait: Histogram::new(DURATION),
            db_up: Gauge::default(),
        }
    }
}

impl BatchFamilies {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "batch_lines",
            "Runs of Batch API lines by outcome: completed (answered 2xx), failed (to the error file), retried (a transient failure, run again), deferred (not run: its queue full, its wait over, or its client's limit or budget reached; run again)",
            self.lines.clone(),
        );
        r.register_with_unit(
            "batch_line_queue_wait",
            "Time each run of a Batch API line waited for a backend slot (in the idle class, behind every other request)",
            Unit::Seconds,
            self.queue_wait.clone(),
        );
        r.register(
            "batches",
            "Batch API batches by status, as the ledger keeps them (read again each second while batches run)",
            self.by_status.clone(),
        );
        r.register(
            "batch_db_up",
            "1 while the Batch API's last call to the ledger's database worked; 0 while its calls fail (it connects again), and without a Batch API",
            self.db_up.clone(),
        );
    }

    /// A line's run ended with `outcome`.
    pub fn line(&self, alias: &str, client: &str, outcome: &'static str) {
        let labels = LineLabels {
            alias: alias.to_string(),
            client: client.to_string(),
            outcome,
        };
        self.lines.get_or_create(&labels).inc();
    }

    /// A line's run waited `seconds` for its slot.
    pub(crate) fn waited(&self, seconds: f64) {
        self.queue_wait.observe(seconds);
    }

    /// How many batches are in each status (`all`; those not in `by` have none).
    pub fn statuses(&self, all: &[&str], by: &[(String, i64)]) {
        for status in all {
            let n = by.iter().find(|(s, _)| s == status).map_or(0, |(_, n)| *n);
            let label = StatusLabel {
                status: (*status).to_string(),
            };
            self.by_status.get_or_create(&label).set(n);
        }
    }
}
