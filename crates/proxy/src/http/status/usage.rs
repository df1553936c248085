//! The status page's usage ledger: a line on whether it writes (why not, what waits, what
//! was dropped), and per client its tokens and GPU-hours of each of the last 14 days as
//! charts (an admin or an open proxy sees every client, a client its own); drawn by
//! `templates/usage.html`.

use std::sync::Arc;

use serde::Serialize;

use super::charts;
use super::clients::Viewer;
use crate::ledger::{Daily, DAYS};
use crate::live::Snapshot;

/// What the page shows of the ledger.
#[derive(Clone, Debug)]
pub(crate) struct LedgerView {
    /// The database, as it may be shown.
    pub(crate) at: String,
    /// Why writes fail, while they do.
    pub(crate) trouble: Option<String>,
    pub(crate) waiting: i64,
    pub(crate) dropped: u64,
    pub(crate) daily: Arc<Daily>,
    /// The clients whose days are shown: `None`, every one.
    pub(crate) only: Option<String>,
}

pub(crate) fn collect(snap: &Snapshot, viewer: &Viewer) -> Option<LedgerView> {
    let ledger = snap.ledger.as_ref()?;
    let (trouble, waiting, dropped) = ledger.trouble();
    Some(LedgerView {
        at: ledger.settings().url.shown(),
        trouble,
        waiting,
        dropped,
        daily: ledger.daily(),
        only: match viewer {
            Viewer::Client(c) => Some(c.owner().to_string()),
            Viewer::Admin | Viewer::Open => None,
        },
    })
}

/// The ledger as `usage.html` draws it: the header's line (where, whether it writes, what
/// waits, what was dropped) and each shown client's days.
#[derive(Serialize)]
pub(crate) struct LedgerShape<'a> {
    at: &'a str,
    trouble: Option<&'a str>,
    waiting: i64,
    dropped: u64,
    days: usize,
    clients: Vec<ClientDays<'a>>,
}

/// A client's days: its tokens and GPU-hours charted, and their sums.
#[derive(Serialize)]
struct ClientDays<'a> {
    client: &'a str,
    tokens: charts::Chart,
    hours: charts::Chart,
    tokens_sum: String,
    hours_sum: String,
}

/// The ledger laid out for `usage.html`.
pub(crate) fn shape(l: &LedgerView) -> LedgerShape<'_> {
    let first = l.daily.first_ms;
    let clients = l
        .daily
        .clients
        .iter()
        .filter(|(c, _)| l.only.as_ref().is_none_or(|o| o == *c))
        .map(|(client, days)| {
            let tokens: Vec<f64> = days.iter().map(|d| d.0 as f64).collect();
            let hours: Vec<f64> = days.iter().map(|d| d.1 / 3600.0).collect();
            ClientDays {
                client,
                tokens_sum: tokens.iter().sum::<f64>().to_string(),
                hours_sum: format!("{:.3}", hours.iter().sum::<f64>()),
                tokens: charts::days("tokens", &tokens, first, 0),
                hours: charts::days("GPU-hours", &hours, first, 3),
            }
        })
        .collect();
    LedgerShape {
        at: &l.at,
        trouble: l.trouble.as_deref(),
        waiting: l.waiting,
        dropped: l.dropped,
        days: DAYS,
        clients,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The ledger's `part` (`line` or `section`) as the page draws it.
    fn drawn(part: &str, l: &LedgerView) -> String {
        super::super::templates::render_str(
            &format!("{{% from 'usage.html' import {part} %}}{{{{ {part}(ledger) }}}}"),
            minijinja::context! { ledger => shape(l) },
        )
    }

    fn view(only: Option<&str>, trouble: Option<&str>) -> LedgerView {
        let mut days = [(0, 0.0); DAYS];
        days[DAYS - 1] = (1200, 7200.0);
        let mut d = Daily {
            first_ms: 1_796_515_200_000,
            ..Daily::default()
        };
        d.clients.insert("ann".into(), days);
        d.clients.insert("<bob>".into(), [(5, 1.0); DAYS]);
        LedgerView {
            at: "sqlite:///x/usage.db".into(),
            trouble: trouble.map(str::to_string),
            waiting: 12,
            dropped: 0,
            daily: Arc::new(d),
            only: only.map(str::to_string),
        }
    }

    #[test]
    fn each_client_gets_its_days_charted_and_a_client_sees_its_own() {
        let out = drawn("section", &view(None, None));
        assert!(
            out.contains("<td>ann</td>") && out.contains("<td>&lt;bob&gt;</td>"),
            "{out}"
        );
        assert!(
            out.contains("<td class=\"n\">1200</td><td class=\"n\">2.000</td>"),
            "{out}"
        );
        let own = drawn("section", &view(Some("ann"), None));
        assert!(
            own.contains("<td>ann</td>") && !own.contains("bob"),
            "{own}"
        );
    }

    #[test]
    fn the_line_says_when_writes_fail() {
        let ok = drawn("line", &view(None, None));
        assert!(ok.contains("writing"), "{ok}");
        let bad = drawn("line", &view(None, Some("disk I/O error")));
        assert!(
            bad.contains("writes failing</span> (disk I&#x2f;O error); 12 rows waiting"),
            "{bad}"
        );
        let mut dropped = view(None, None);
        dropped.dropped = 3;
        let dropped = drawn("line", &dropped);
        assert!(
            dropped.ends_with("writing</span>, <span class=\"bad\">3 rows dropped</span>"),
            "{dropped}"
        );
    }
}
