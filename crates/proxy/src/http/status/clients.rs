//! The status page's section per client: in flight, queued, its class, its tokens and
//! GPU-seconds of the last five minutes (a chart in its timeline colour for the busiest), each
//! limit and what is left of it, and how much of its budgets of the month is used, drawn by
//! `templates/clients.html`. Keys are never shown.

use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;

use super::charts;
use crate::clients::limiter::Left;
use crate::clients::Caller;
use crate::config::{ByLimit, Limit, Window};
use crate::live::Snapshot;

/// One client's section.
#[derive(Clone, Debug)]
pub(crate) struct ClientView {
    pub(crate) name: String,
    pub(crate) priority: &'static str,
    /// `None`: every alias.
    pub(crate) aliases: Option<Vec<String>>,
    pub(crate) inflight: u32,
    pub(crate) queued: i64,
    pub(crate) max_concurrent: Option<u32>,
    /// Tokens charged in the last five minutes, and GPU-seconds.
    pub(crate) tokens_5m: u64,
    pub(crate) gpu_5m: f64,
    /// Its GPU-seconds of each 10-second step of the five minutes, oldest first: charted for
    /// the [`CHARTED`] clients of the most, `None` for the others.
    pub(crate) gpu_steps: Option<[f64; 30]>,
    /// Its colour on the slot timelines.
    pub(crate) colour: &'static str,
    /// Label, limit and what is left (GPU time in seconds).
    pub(crate) limits: Vec<(String, Left)>,
    /// The budgets of the month: label, used and limit.
    pub(crate) month: Vec<(&'static str, u64, u64)>,
}

/// Who is looking at the page, by the key it presented.
#[derive(Clone, Debug)]
pub(crate) enum Viewer {
    /// An admin key (`server.admin_keys_env`): the whole page.
    Admin,
    /// A client's key: its own section and the aliases it may use.
    Client(Caller),
    /// No key is configured: the whole page, as the proxy is open.
    Open,
}

impl Viewer {
    /// Whether the page shows it alias `name`.
    pub(crate) fn sees_alias(&self, name: &str) -> bool {
        match self {
            Viewer::Client(c) => c.may_use(name),
            Viewer::Admin | Viewer::Open => true,
        }
    }

    /// Whether the page shows it what `owner` owns (its batches, its usage): a client's key
    /// its own, a key of `server.api_keys_env` that key's.
    pub(super) fn owns(&self, owner: &str) -> bool {
        match self {
            Viewer::Client(me) => me.owner() == owner,
            Viewer::Admin | Viewer::Open => true,
        }
    }

    /// Whether the page shows it the section of client `name`.
    pub(super) fn sees_client(&self, name: &str) -> bool {
        match self {
            Viewer::Client(me) => me.name() == name,
            Viewer::Admin | Viewer::Open => true,
        }
    }
}

/// The clients whose GPU-seconds of the last five minutes are charted: the ones of the most
/// (the others show the sum), which bounds the page at many clients.
pub(crate) const CHARTED: usize = 20;

/// The clients the page shows `viewer`: all of them to an admin key (or on an open proxy),
/// a client only its own.
pub(crate) fn collect(snap: &Snapshot, viewer: &Viewer) -> Vec<ClientView> {
    let now = Instant::now();
    let names: Vec<&str> = snap.clients.callers().iter().map(|c| c.name()).collect();
    let mut views: Vec<ClientView> = snap
        .clients
        .callers()
        .iter()
        .filter(|c| viewer.sees_client(c.name()))
        .map(|c| {
            let steps = c.state.recent.steps(now);
            let recent = crate::clients::total(&steps);
            let (limits, month) = shown(&c.state.standing(now));
            ClientView {
                name: c.spec.name.clone(),
                priority: c.spec.priority.as_str(),
                aliases: c.spec.aliases.as_ref().map(|a| a.iter().cloned().collect()),
                inflight: c.state.inflight.load(Ordering::Relaxed),
                queued: c.state.queued.load(Ordering::Relaxed),
                max_concurrent: c.spec.max_concurrent.map(|m| m.get()),
                tokens_5m: recent.0,
                gpu_5m: recent.1 as f64 / 1000.0,
                gpu_steps: Some(steps.map(|s| s.1 as f64 / 1000.0)),
                colour: super::palette::colour(&names, c.name()),
                limits,
                month,
            }
        })
        .collect();
    chart_the_most(&mut views);
    views
}

/// Each limit of `standing` it has (label, what is left) and its budgets of the month (label,
/// used, limit), GPU time in seconds.
#[allow(clippy::type_complexity)]
fn shown(standing: &ByLimit<Option<Left>>) -> (Vec<(String, Left)>, Vec<(&'static str, u64, u64)>) {
    let set = standing.iter().filter_map(|(kind, left)| {
        let left = (*left)?;
        let left = match kind.resource.millis() {
            true => Left {
                limit: left.limit / 1000,
                remaining: left.remaining / 1000,
                reset: left.reset,
            },
            false => left,
        };
        Some((kind, left))
    });
    let set: Vec<(Limit, Left)> = set.collect();
    let limits = set
        .iter()
        .map(|(kind, left)| (kind.label(), *left))
        .collect();
    let month = set
        .iter()
        .filter(|(kind, _)| kind.window == Window::Month)
        .map(|(kind, b)| {
            (
                kind.resource.short(),
                b.limit.saturating_sub(b.remaining),
                b.limit,
            )
        })
        .collect();
    (limits, month)
}

/// Keeps the steps of the [`CHARTED`] clients of the most GPU-seconds (none of a client that
/// had none), drops the others'.
fn chart_the_most(views: &mut [ClientView]) {
    let mut most: Vec<usize> = (0..views.len())
        .filter(|&i| views[i].gpu_5m > 0.0)
        .collect();
    most.sort_by(|&a, &b| views[b].gpu_5m.total_cmp(&views[a].gpu_5m));
    let charted: std::collections::HashSet<usize> = most.into_iter().take(CHARTED).collect();
    for (i, v) in views.iter_mut().enumerate() {
        if !charted.contains(&i) {
            v.gpu_steps = None;
        }
    }
}

/// A client's row as `clients.html` draws it.
#[derive(Serialize)]
pub(crate) struct ClientRow<'a> {
    name: &'a str,
    priority: &'static str,
    /// Its aliases, or `all`.
    aliases: String,
    inflight: u32,
    max_concurrent: Option<u32>,
    queued: i64,
    tokens_5m: u64,
    /// Its GPU-seconds charted, or their sum.
    gpu_chart: Option<charts::Chart>,
    gpu_5m: String,
    /// Label, what is left and the limit.
    limits: Vec<(&'a str, u64, u64)>,
    /// The budgets of the month: label, share used (%), used and limit.
    month: Vec<(&'static str, String, u64, u64)>,
}

/// A client's row laid out for `clients.html`.
pub(crate) fn row(c: &ClientView) -> ClientRow<'_> {
    ClientRow {
        name: &c.name,
        priority: c.priority,
        aliases: c
            .aliases
            .as_ref()
            .map_or("all".to_string(), |a| a.join(", ")),
        inflight: c.inflight,
        max_concurrent: c.max_concurrent,
        queued: c.queued,
        tokens_5m: c.tokens_5m,
        gpu_chart: c.gpu_steps.map(|steps| charts::gpu(&steps, c.colour)),
        gpu_5m: format!("{:.1}", c.gpu_5m),
        limits: c
            .limits
            .iter()
            .map(|(label, left)| (label.as_str(), left.remaining, left.limit))
            .collect(),
        month: c
            .month
            .iter()
            .map(|&(label, used, limit)| {
                let share = used as f64 * 100.0 / limit.max(1) as f64;
                (label, format!("{share:.1}"), used, limit)
            })
            .collect(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `clients`' rows as the page draws them.
    fn drawn(clients: &[ClientView]) -> String {
        let clients: Vec<_> = clients.iter().map(row).collect();
        super::super::templates::render("clients.html", minijinja::context! { clients }).unwrap()
    }

    fn client(name: &str, gpu_5m: f64) -> ClientView {
        let mut steps = [0.0; 30];
        steps[29] = gpu_5m;
        ClientView {
            name: name.into(),
            priority: "batch",
            aliases: Some(vec!["a".into(), "b".into()]),
            inflight: 1,
            queued: 2,
            max_concurrent: Some(4),
            tokens_5m: 321,
            gpu_5m,
            gpu_steps: Some(steps),
            colour: "#009E73",
            limits: vec![("tokens / min".into(), crate::clients::headers::full(100))],
            month: vec![("tokens", 250, 1000)],
        }
    }

    #[test]
    fn the_clients_of_the_most_gpu_seconds_are_charted_and_no_idle_one() {
        let mut views: Vec<ClientView> = (0..CHARTED + 5)
            .map(|i| client(&format!("c{i}"), i as f64))
            .collect();
        chart_the_most(&mut views);
        let charted: Vec<usize> = (0..views.len())
            .filter(|&i| views[i].gpu_steps.is_some())
            .collect();
        assert_eq!(charted, (5..CHARTED + 5).collect::<Vec<_>>());
        let mut idle = vec![client("idle", 0.0)];
        chart_the_most(&mut idle);
        assert!(idle[0].gpu_steps.is_none());
    }

    #[test]
    fn a_charted_client_shows_its_gpu_seconds_in_its_colour_with_the_sum_beside() {
        let out = drawn(&[client("busy", 7.5)]);
        assert!(out.contains("fill=\"#009E73\""), "{out}");
        assert!(
            out.contains("<title>GPU-seconds per 10 s, last 5 min (most 7.5)</title>"),
            "{out}"
        );
        assert!(
            out.contains(">-5 min</text>") && out.contains(">now</text>"),
            "{out}"
        );
        assert!(
            out.contains("<span class=\"val\">7.5 GPU-s</span>"),
            "{out}"
        );
    }

    #[test]
    fn a_client_row_shows_its_limits_escaped() {
        let mut c = client("ci<x>", 12.25);
        c.gpu_steps = None;
        let out = drawn(&[c]);
        assert!(
            out.contains("<td>ci&lt;x&gt;</td><td>batch</td><td>a, b</td>"),
            "{out}"
        );
        assert!(
            out.contains("1 / 4")
                // minijinja's escaper writes `/` as `&#x2f;`.
                && out.contains("tokens &#x2f; min: 100 / 100")
                && out.contains("<td class=\"n\">321</td><td class=\"n\">12.2</td>"),
            "{out}"
        );
        assert!(
            out.contains("month's budget used: tokens 25.0 % (250 of 1000)"),
            "{out}"
        );
        assert!(drawn(&[]).trim().is_empty());
    }
}
