//! What the status page shows, gathered from the live snapshot, backend health, the slots,
//! the gauges and the rolling window: plain data, laid out by `html` and the panels' modules.

use std::time::{Duration, Instant, SystemTime};

use super::clients::{ClientView, Viewer};
use crate::live::reload::LastReload;
use crate::live::{AppState, Snapshot};
use crate::observe::window::Summary;

/// The whole page.
#[derive(Clone, Debug)]
pub(crate) struct Fleet {
    pub(crate) version: &'static str,
    pub(crate) now: SystemTime,
    /// Unix time the process started.
    pub(crate) started: u64,
    pub(crate) reload: Option<LastReload>,
    /// The shared store, when there is one.
    pub(crate) shared: Option<SharedView>,
    pub(crate) aliases: Vec<AliasView>,
    pub(crate) clients: Vec<ClientView>,
    /// The usage ledger, when one is kept.
    pub(crate) ledger: Option<super::usage::LedgerView>,
    /// Who held each slot of each backend shown.
    pub(crate) timelines: Vec<super::slots::TimelineView>,
    /// Batches not yet ended.
    pub(crate) batches: Vec<crate::batches::store::BatchRow>,
}

/// The shared store's line: where, and whether it answers.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct SharedView {
    pub(crate) store: String,
    pub(crate) up: bool,
}

/// One alias's row.
#[derive(Clone, Debug)]
pub(crate) struct AliasView {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) old_names: Vec<String>,
    pub(crate) context_window: Option<u32>,
    pub(crate) backends: Vec<BackendView>,
    pub(crate) inflight: i64,
    pub(crate) queued: i64,
    /// Prompt tokens its backends reported, and those they read from cache (since start).
    pub(crate) prompt_tokens: u64,
    pub(crate) cached_tokens: u64,
    pub(crate) last_5m: Summary,
    /// Requests and median time to first token of each 10-second step, oldest first.
    pub(crate) series: Vec<crate::observe::window::Point>,
}

/// A backend serving an alias.
#[derive(Clone, Debug)]
pub(crate) struct BackendView {
    pub(crate) name: String,
    pub(crate) flavor: &'static str,
    /// The configured URL without any user name or password in it.
    pub(crate) url: String,
    /// `None` before the first probe.
    /// As [`AppState::shown_state`] gives it.
    pub(crate) state: &'static str,
    pub(crate) busy: u32,
    pub(crate) slots: u32,
    pub(crate) queue_limit: u32,
    /// Its cost model: prefill and decode rates at depth 0, prefill's half depth, answers
    /// learned from.
    pub(crate) cost: CostView,
    /// The requests waiting for its slots, each with its class and predicted wait.
    pub(crate) queue: Vec<(&'static str, Duration)>,
}

/// A backend's cost model as the page shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CostView {
    pub(crate) prefill_tps: f64,
    pub(crate) prefill_half_depth: Option<f64>,
    pub(crate) decode_tps: f64,
    pub(crate) learned: f64,
}

/// Gather the page's data from one snapshot.
pub(crate) fn collect(state: &AppState, snap: &Snapshot, viewer: &Viewer) -> Fleet {
    let now = Instant::now();
    let aliases = snap
        .routes
        .aliases()
        .iter()
        .filter(|a| viewer.sees_alias(a.name()))
        .map(|live| {
            let (a, m) = (&*live.spec, &live.metrics);
            let backends = live
                .replicas
                .iter()
                .map(|r| {
                    let b = &*r.backend;
                    BackendView {
                        name: b.name.clone(),
                        flavor: b.flavor.as_str(),
                        url: without_userinfo(&b.url),
                        state: state.shown_state(&b.name),
                        busy: r.slots.busy(),
                        slots: b.slots.get(),
                        queue_limit: b.queue,
                        cost: cost_view(&r.health.cost),
                        queue: r
                            .slots
                            .predicted_queue()
                            .into_iter()
                            .map(|q| (q.class.as_str(), q.predicted))
                            .collect(),
                    }
                })
                .collect();
            AliasView {
                name: a.name.clone(),
                description: a.description.clone(),
                old_names: a.old_names.clone(),
                context_window: a.context_window.map(|w| w.get()),
                backends,
                inflight: m.inflight.get(),
                queued: m.queued.get(),
                prompt_tokens: m.prompt_tokens.get(),
                cached_tokens: m.cached_tokens.get(),
                last_5m: m.window.summary(now),
                series: m.window.series(now),
            }
        })
        .collect();
    Fleet {
        version: env!("CARGO_PKG_VERSION"),
        now: SystemTime::now(),
        started: state.started,
        reload: state.reloads.last(),
        shared: snap.shared.as_ref().map(|s| SharedView {
            store: s.shown().to_string(),
            up: s.up(),
        }),
        aliases,
        clients: super::clients::collect(snap, viewer),
        ledger: super::usage::collect(snap, viewer),
        timelines: super::slots::collect(snap, viewer),
        batches: super::batches::collect(state, viewer),
    }
}

/// A backend's cost model now.
fn cost_view(cost: &crate::fleet::cost::CostModel) -> CostView {
    let (prefill, decode) = cost.rates();
    CostView {
        prefill_tps: prefill.tokens_per_second(),
        prefill_half_depth: prefill.half_depth(),
        decode_tps: decode.tokens_per_second(),
        learned: cost.learned().0,
    }
}

/// A backend URL as the page prints it: a user name or password in it (a backend's basic
/// auth) is left out.
pub(crate) fn without_userinfo(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.as_str().trim_end_matches('/').to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_printed_without_credentials() {
        assert_eq!(
            without_userinfo("http://user:secret@gpu1:8000/prefix"),
            "http://gpu1:8000/prefix"
        );
        assert_eq!(
            without_userinfo("http://token@gpu1:8000"),
            "http://gpu1:8000"
        );
        assert_eq!(without_userinfo("http://gpu1:8000"), "http://gpu1:8000");
    }
}
