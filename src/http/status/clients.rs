//! The status page's section per client: in flight, queued, its class, each limit and what
//! is left of it, and how much of its budgets of the month is used. Names are escaped; keys
//! are never shown.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::escape::E;
use crate::clients::limiter::Left;
use crate::clients::Caller;
use crate::live::Snapshot;

/// One client's section.
#[derive(Clone, Debug)]
pub struct ClientView {
    pub name: String,
    pub priority: &'static str,
    /// `None`: every alias.
    pub aliases: Option<Vec<String>>,
    pub inflight: u32,
    pub queued: i64,
    pub max_concurrent: Option<u32>,
    /// Tokens charged in the last five minutes, and GPU-seconds.
    pub tokens_5m: u64,
    pub gpu_5m: f64,
    /// Label, limit and what is left (GPU time in seconds).
    pub limits: Vec<(&'static str, Left)>,
    /// The budgets of the month: label, used and limit.
    pub month: Vec<(&'static str, u64, u64)>,
}

/// Who is looking at the page, by the key it presented.
#[derive(Clone, Debug)]
pub enum Viewer {
    /// An admin key (`server.admin_keys_env`): the whole page.
    Admin,
    /// A client's key: its own section and the aliases it may use.
    Client(Caller),
    /// No key is configured: the whole page, as the proxy is open.
    Open,
}

impl Viewer {
    /// Whether the page shows it alias `name`.
    pub fn sees_alias(&self, name: &str) -> bool {
        match self {
            Viewer::Client(c) => c.may_use(name),
            Viewer::Admin | Viewer::Open => true,
        }
    }

    /// Whether the page shows it the section of client `name`.
    fn sees_client(&self, name: &str) -> bool {
        match self {
            Viewer::Client(me) => me.name() == name,
            Viewer::Admin | Viewer::Open => true,
        }
    }
}

/// The clients the page shows `viewer`: all of them to an admin key (or on an open proxy),
/// a client only its own.
pub fn collect(snap: &Snapshot, viewer: &Viewer) -> Vec<ClientView> {
    let now = Instant::now();
    snap.clients
        .callers()
        .iter()
        .filter(|c| viewer.sees_client(c.name()))
        .map(|c| {
            let s = c.state.limiter.standing(now);
            let recent = c.state.recent.sum(now);
            let [td, tm, gd, gm] = c.state.budgets.standing();
            let seconds = |l: Option<Left>| {
                l.map(|l| Left {
                    limit: l.limit / 1000,
                    remaining: l.remaining / 1000,
                    reset: l.reset,
                })
            };
            let limits = [
                ("requests / min", s.requests),
                ("tokens / min", s.tokens),
                ("tokens / day", td),
                ("tokens / month", tm),
                ("GPU-s / day", seconds(gd)),
                ("GPU-s / month", seconds(gm)),
            ]
            .into_iter()
            .filter_map(|(l, left)| Some((l, left?)))
            .collect();
            let month = [("tokens", tm), ("GPU-s", seconds(gm))]
                .into_iter()
                .filter_map(|(l, left)| {
                    left.map(|b| (l, b.limit.saturating_sub(b.remaining), b.limit))
                })
                .collect();
            ClientView {
                name: c.spec.name.clone(),
                priority: c.spec.priority.as_str(),
                aliases: c.spec.aliases.as_ref().map(|a| a.iter().cloned().collect()),
                inflight: c.state.inflight.load(Ordering::Relaxed),
                queued: c.state.queued.load(Ordering::Relaxed),
                max_concurrent: c.spec.max_concurrent.map(|m| m.get()),
                tokens_5m: recent.0,
                gpu_5m: recent.1 as f64 / 1000.0,
                limits,
                month,
            }
        })
        .collect()
}

/// The clients' table (nothing when no client is configured).
pub fn render(out: &mut String, clients: &[ClientView]) {
    if clients.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Clients</h2>\n<table class=\"clients\">\n<thead><tr><th>client</th><th>priority</th>\
         <th>aliases</th><th class=\"n\">in flight</th><th class=\"n\">queued</th>\
         <th class=\"n\">tokens<br>5 min</th><th class=\"n\">GPU-s<br>5 min</th>\
         <th>limits (left / limit)</th></tr></thead>\n<tbody>\n",
    );
    for c in clients {
        let aliases = c
            .aliases
            .as_ref()
            .map_or("all".to_string(), |a| a.join(", "));
        let inflight = match c.max_concurrent {
            Some(m) => format!("{} / {m}", c.inflight),
            None => c.inflight.to_string(),
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td>",
            E(&c.name),
            c.priority,
            E(&aliases),
            inflight,
            c.queued,
            c.tokens_5m,
            c.gpu_5m
        );
        if c.limits.is_empty() {
            out.push_str("none");
        }
        for (i, (label, left)) in c.limits.iter().enumerate() {
            let _ = write!(
                out,
                "{}{label}: {} / {}",
                if i > 0 { " · " } else { "" },
                left.remaining,
                left.limit
            );
        }
        for (i, (label, used, limit)) in c.month.iter().enumerate() {
            let share = *used as f64 * 100.0 / (*limit).max(1) as f64;
            let _ = write!(
                out,
                "{}{label} {share:.1} % ({used} of {limit})",
                if i == 0 {
                    "<br>month's budget used: "
                } else {
                    " · "
                },
            );
        }
        out.push_str("</td></tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_client_row_shows_its_limits_escaped() {
        let c = ClientView {
            name: "ci<x>".into(),
            priority: "batch",
            aliases: Some(vec!["a".into(), "b".into()]),
            inflight: 1,
            queued: 2,
            max_concurrent: Some(4),
            tokens_5m: 321,
            gpu_5m: 12.25,
            limits: vec![("tokens / min", crate::clients::headers::full(100))],
            month: vec![("tokens", 250, 1000)],
        };
        let mut out = String::new();
        render(&mut out, &[c]);
        assert!(
            out.contains("<td>ci&lt;x&gt;</td><td>batch</td><td>a, b</td>"),
            "{out}"
        );
        assert!(
            out.contains("1 / 4")
                && out.contains("tokens / min: 100 / 100")
                && out.contains("<td class=\"n\">321</td><td class=\"n\">12.2</td>"),
            "{out}"
        );
        assert!(
            out.contains("month's budget used: tokens 25.0 % (250 of 1000)"),
            "{out}"
        );
        let mut none = String::new();
        render(&mut none, &[]);
        assert!(none.is_empty());
    }
}
