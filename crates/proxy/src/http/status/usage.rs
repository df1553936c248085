//! The status page's usage ledger: a line on whether it writes (why not, what waits, what
//! was dropped), and per client its tokens and GPU-hours of each of the last 14 days as
//! charts (an admin or an open proxy sees every client, a client its own).

use std::fmt::Write;
use std::sync::Arc;

use super::charts;
use super::clients::Viewer;
use super::escape::E;
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

/// The header's line.
pub(crate) fn line(out: &mut String, l: &LedgerView) {
    match &l.trouble {
        None => {
            let _ = write!(
                out,
                " · usage ledger {}: <span class=\"ok\">writing</span>",
                E(&l.at)
            );
        }
        Some(why) => {
            let _ = write!(
                out,
                " · usage ledger {}: <span class=\"bad\">writes failing</span> ({}); {} rows waiting",
                E(&l.at),
                E(why),
                l.waiting
            );
        }
    }
    if l.dropped > 0 {
        let _ = write!(
            out,
            ", <span class=\"bad\">{} rows dropped</span>",
            l.dropped
        );
    }
}

/// The section of each client's days.
pub(crate) fn render(out: &mut String, l: &LedgerView) {
    let shown: Vec<_> = l
        .daily
        .clients
        .iter()
        .filter(|(c, _)| l.only.as_ref().is_none_or(|o| o == *c))
        .collect();
    let _ = write!(
        out,
        "<h2>Usage, last {DAYS} days (UTC)</h2>\n<table class=\"usage\">\n<thead><tr>\
         <th>client</th><th>tokens per day</th><th>GPU-hours per day</th>\
         <th class=\"n\">tokens<br>{DAYS} days</th><th class=\"n\">GPU-hours<br>{DAYS} days</th>\
         </tr></thead>\n<tbody>\n"
    );
    if shown.is_empty() {
        out.push_str("<tr><td colspan=\"5\">no usage recorded yet</td></tr>\n");
    }
    let first = l.daily.first_ms;
    for (client, days) in shown {
        let tokens: Vec<f64> = days.iter().map(|d| d.0 as f64).collect();
        let hours: Vec<f64> = days.iter().map(|d| d.1 / 3600.0).collect();
        let _ = write!(out, "<tr><td>{}</td><td>", E(client));
        charts::days(out, "tokens", &tokens, first, 0);
        out.push_str("</td><td>");
        charts::days(out, "GPU-hours", &hours, first, 3);
        let _ = writeln!(
            out,
            "</td><td class=\"n\">{}</td><td class=\"n\">{:.3}</td></tr>",
            tokens.iter().sum::<f64>(),
            hours.iter().sum::<f64>()
        );
    }
    out.push_str("</tbody>\n</table>\n");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
        let mut out = String::new();
        render(&mut out, &view(None, None));
        assert!(
            out.contains("<td>ann</td>") && out.contains("<td>&lt;bob&gt;</td>"),
            "{out}"
        );
        assert!(
            out.contains("<td class=\"n\">1200</td><td class=\"n\">2.000</td>"),
            "{out}"
        );
        let mut own = String::new();
        render(&mut own, &view(Some("ann"), None));
        assert!(
            own.contains("<td>ann</td>") && !own.contains("bob"),
            "{own}"
        );
    }

    #[test]
    fn the_line_says_when_writes_fail() {
        let mut ok = String::new();
        line(&mut ok, &view(None, None));
        assert!(ok.contains("writing"), "{ok}");
        let mut bad = String::new();
        line(&mut bad, &view(None, Some("disk I/O error")));
        assert!(
            bad.contains("writes failing</span> (disk I/O error); 12 rows waiting"),
            "{bad}"
        );
    }
}
