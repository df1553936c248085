//! The status page's slot timeline: per backend, one row per slot over the last ten minutes,
//! each request a bar from its grant to its end in its client's colour (prefill lighter,
//! decode full), an error outlined in red, a request that lost its slot dashed and marked (▼
//! preempted, ✕ failed before an answer); each bar's `<title>` names client, alias, tokens,
//! GPU-seconds and status.
//! The colours are Okabe and Ito's, told apart with the common colour-vision deficiencies.
//! The requests holding slots now are bars open to "now", outlined in their client's colour.
//! Beside it, who holds each slot (client, class, time held, predicted time left) and the
//! backend's queue: each waiting request's client, class, wait so far and predicted wait. A
//! client's key sees the backends of its aliases, other clients' bars grey and unnamed.
//! Gathered and laid out here, drawn by `templates/slots.html`.

use std::time::Instant;

use serde::Serialize;

use super::charts::tenth;
use super::clients::Viewer;
use super::palette::{colour, OTHER};
use crate::fleet::timeline::{Bar, Lost, ROWS, SPAN};
use crate::live::Snapshot;

/// How the legend names requests of no named client.
const NO_CLIENT: &str = "no client";
/// How a client's view names the other clients.
const ANOTHER: &str = "another client";
const W: f64 = 720.0;
const LEFT: f64 = 44.0;
const ROW: f64 = 14.0;
const FOOT: f64 = 14.0;

/// One backend's timeline.
#[derive(Clone, Debug)]
pub(crate) struct TimelineView {
    pub(crate) backend: String,
    pub(crate) slots: u32,
    /// Each bar, seconds before now of its start, first token and end; its colour and title.
    pub(crate) bars: Vec<BarView>,
    /// The clients shown, with their colours.
    pub(crate) legend: Vec<(String, &'static str)>,
    /// Its queue, in the order predicted: client (as the viewer may see it), class, wait so
    /// far and predicted wait, in seconds.
    pub(crate) queue: Vec<(String, &'static str, f64, f64)>,
    /// The requests holding its slots now, slot by slot.
    pub(crate) holding: Vec<HoldView>,
}

/// A request holding a slot now: a bar from its grant (seconds ago) to now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HoldView {
    pub(crate) slot: u32,
    /// Its client as the viewer may see it (`None`: another client's), and its colour.
    pub(crate) client: Option<String>,
    pub(crate) colour: &'static str,
    pub(crate) class: &'static str,
    /// Seconds it has held the slot, and its predicted seconds left.
    pub(crate) held: f64,
    pub(crate) left: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BarView {
    pub(crate) slot: u32,
    pub(crate) start: f64,
    pub(crate) first: Option<f64>,
    pub(crate) end: f64,
    pub(crate) colour: &'static str,
    /// A request that lost its slot: a dashed bar and a mark.
    pub(crate) lost: Option<Lost>,
    pub(crate) error: bool,
    pub(crate) title: String,
}

/// The timelines of the backends `viewer` sees (those of its aliases), in alias order.
pub(crate) fn collect(snap: &Snapshot, viewer: &Viewer) -> Vec<TimelineView> {
    let now = Instant::now();
    let names: Vec<&str> = snap.clients.callers().iter().map(|c| c.name()).collect();
    let own = match viewer {
        Viewer::Client(me) => Some(me.name()),
        Viewer::Admin | Viewer::Open => None,
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for live in snap.routes.aliases() {
        if !viewer.sees_alias(live.name()) {
            continue;
        }
        for r in &live.replicas {
            if !seen.insert(r.backend.name.clone()) {
                continue;
            }
            let bars = r.slots.timeline.recent(now);
            let mut v = view(&r.backend.name, r.slots.slots(), &bars, now, &names, own);
            // A client by its id as the viewer may see it: its name, or `None` (another's).
            let shown = |id: u64| -> Option<&str> {
                let name = snap
                    .clients
                    .callers()
                    .iter()
                    .find(|c| c.state.id == id)
                    .map_or(NO_CLIENT, |c| c.name());
                named(own, name)
            };
            v.queue = r
                .slots
                .predicted_queue()
                .into_iter()
                .map(|q| {
                    let (waited, predicted) = (q.waited.as_secs_f64(), q.predicted.as_secs_f64());
                    let client = shown(q.client).unwrap_or(ANOTHER).to_string();
                    (client, q.class.as_str(), waited, predicted)
                })
                .collect();
            let rows = ROWS.min(v.slots);
            for h in r.slots.holding().into_iter().filter(|h| h.slot < rows) {
                let client = shown(h.client);
                let colour = coloured(&mut v.legend, &names, client);
                v.holding.push(HoldView {
                    slot: h.slot,
                    client: client.map(str::to_string),
                    colour,
                    class: h.class.as_str(),
                    held: h.held.as_secs_f64(),
                    left: h.left.as_secs_f64(),
                });
            }
            out.push(v);
        }
    }
    out
}

/// `client` as a viewer that may name `own` only (`None`: every client) sees it: its name, or
/// `None` for another client's. A request of no named client is everyone's (an open proxy's).
fn named<'a>(own: Option<&str>, client: &'a str) -> Option<&'a str> {
    Some(client).filter(|c| own.is_none_or(|o| o == *c) || *c == NO_CLIENT)
}

/// The colour of a request of `named` (`None`: another client's, grey), its client put in
/// `legend` the first time.
fn coloured(
    legend: &mut Vec<(String, &'static str)>,
    names: &[&str],
    named: Option<&str>,
) -> &'static str {
    let colour = named.map_or(OTHER, |c| colour(names, c));
    if let Some(c) = named.filter(|c| !legend.iter().any(|(n, _)| n == c)) {
        legend.push((c.to_string(), colour));
    }
    colour
}

/// A backend's bars as drawn for a viewer that may name `own` only (`None`: every client).
fn view(
    backend: &str,
    slots: u32,
    bars: &[Bar],
    now: Instant,
    names: &[&str],
    own: Option<&str>,
) -> TimelineView {
    let ago = |t: Instant| now.saturating_duration_since(t).as_secs_f64();
    let mut legend: Vec<(String, &'static str)> = Vec::new();
    let shown = bars.iter().filter(|b| b.slot < ROWS.min(slots));
    let bars = shown
        .map(|b| {
            let client = b.client.as_deref().map_or(NO_CLIENT, String::as_str);
            let named = named(own, client);
            let colour = coloured(&mut legend, names, named);
            let held = ago(b.start) - ago(b.end);
            let title = match (named, b.lost) {
                (None, None) => format!("slot {}: {ANOTHER}", b.slot),
                (None, Some(how)) => {
                    format!("slot {}: {ANOTHER} · {}", b.slot, lost(how, held))
                }
                (Some(c), Some(how)) => {
                    format!("slot {}: {c} · {} · {}", b.slot, b.alias, lost(how, held))
                }
                (Some(c), None) => format!(
                    "slot {}: {c} · {} · {} prompt + {} output tokens · {:.2} GPU-s · status {}{}",
                    b.slot,
                    b.alias,
                    b.prompt,
                    b.output,
                    b.gpu_s,
                    b.status,
                    if b.requests > 1 {
                        format!(" · {} requests", b.requests)
                    } else {
                        String::new()
                    }
                ),
            };
            BarView {
                slot: b.slot,
                start: ago(b.start),
                first: b.first.map(ago),
                end: ago(b.end),
                colour,
                lost: b.lost,
                error: b.error,
                title,
            }
        })
        .collect();
    TimelineView {
        backend: backend.to_string(),
        slots,
        bars,
        legend,
        queue: Vec::new(),
        holding: Vec::new(),
    }
}

/// What a lost bar's title says of it, having held its slot `held` seconds.
fn lost(how: Lost, held: f64) -> String {
    match how {
        Lost::Preempted => {
            format!("preempted after {held:.1} s on its slot: its slot went to an interactive request, it went back to its queue")
        }
        Lost::Failed => format!("failed after {held:.1} s on its slot, before an answer"),
    }
}

/// Each timeline's frame, as `slots.html` draws it.
#[derive(Serialize)]
struct Frame {
    w: u32,
    left: u32,
    /// The x of the slots' labels.
    label_x: u32,
    /// A bar's height.
    bar_h: f64,
}

const FRAME: Frame = Frame {
    w: W as u32,
    left: LEFT as u32,
    label_x: LEFT as u32 - 3,
    bar_h: ROW - 4.0,
};

/// One backend's timeline as `slots.html` draws it, in px to a tenth.
#[derive(Serialize)]
pub(crate) struct TimelineShape<'a> {
    frame: &'static Frame,
    backend: &'a str,
    slots: u32,
    /// The rows drawn, when fewer than its slots.
    first_shown: Option<u32>,
    height: u32,
    /// Each row's label and line.
    rows: Vec<[f64; 2]>,
    bars: Vec<BarShape<'a>>,
    holders: Vec<HolderShape>,
    /// The time under it: x, anchor, label.
    ticks: [(f64, &'static str, &'static str); 3],
    foot: f64,
    holding: Vec<HoldLine<'a>>,
    /// The first 20 waiting, and how many more.
    waiting: Vec<WaitLine<'a>>,
    more_waiting: usize,
    legend: &'a [(String, &'static str)],
}

/// A finished request's bar: prefill from `x` to `split` lighter, decode to `x + w` full; a
/// lost one dashed, with what ended it marked at `mark`.
#[derive(Serialize)]
struct BarShape<'a> {
    title: &'a str,
    colour: &'static str,
    lost: Option<&'static str>,
    error: bool,
    x: f64,
    y: f64,
    w: f64,
    split: f64,
    decode_w: f64,
    mark: [f64; 2],
}

/// A request holding its slot now: a bar from `x` to the right edge.
#[derive(Serialize)]
struct HolderShape {
    slot: u32,
    title: String,
    colour: &'static str,
    x: f64,
    y: f64,
    w: f64,
}

/// A line of the list of who holds each slot.
#[derive(Serialize)]
struct HoldLine<'a> {
    slot: u32,
    client: &'a str,
    class: &'static str,
    held: String,
    left: String,
}

/// A line of the list of requests waiting.
#[derive(Serialize)]
struct WaitLine<'a> {
    client: &'a str,
    class: &'static str,
    waited: String,
    predicted: String,
}

/// The most waiting requests listed beside a timeline.
const LISTED: usize = 20;

/// A timeline laid out for `slots.html`.
pub(crate) fn shape(t: &TimelineView) -> TimelineShape<'_> {
    let rows = t.slots.min(ROWS);
    let span = SPAN.as_secs_f64();
    let foot = f64::from(rows) * ROW + FOOT - 2.0;
    TimelineShape {
        frame: &FRAME,
        backend: &t.backend,
        slots: t.slots,
        first_shown: (t.slots > ROWS).then_some(ROWS),
        height: rows * ROW as u32 + FOOT as u32,
        rows: (0..rows)
            .map(|r| {
                let y = f64::from(r) * ROW;
                [y + ROW - 4.0, y + ROW]
            })
            .collect(),
        bars: t.bars.iter().map(bar).collect(),
        holders: t.holding.iter().map(holder).collect(),
        ticks: [
            (tenth(x(span)), "start", "-10 min"),
            (tenth(x(span / 2.0)), "middle", "-5 min"),
            (tenth(x(0.0)), "end", "now"),
        ],
        foot: tenth(foot),
        holding: t
            .holding
            .iter()
            .map(|h| HoldLine {
                slot: h.slot,
                client: h.client.as_deref().unwrap_or(ANOTHER),
                class: h.class,
                held: format!("{:.1}", h.held),
                left: format!("{:.1}", h.left),
            })
            .collect(),
        waiting: t
            .queue
            .iter()
            .take(LISTED)
            .map(|(client, class, waited, predicted)| WaitLine {
                client,
                class,
                waited: format!("{waited:.1}"),
                predicted: format!("{predicted:.1}"),
            })
            .collect(),
        more_waiting: t.queue.len().saturating_sub(LISTED),
        legend: &t.legend,
    }
}

/// The x of a moment `ago` seconds before now on a timeline's ten minutes.
fn x(ago: f64) -> f64 {
    let span = SPAN.as_secs_f64();
    LEFT + (1.0 - ago.min(span) / span) * (W - LEFT)
}

/// One finished request's bar on its slot's row.
fn bar(b: &BarView) -> BarShape<'_> {
    let y = f64::from(b.slot) * ROW + 2.0;
    let (x0, x1) = (x(b.start), x(b.end).max(x(b.start) + 1.0));
    let split = b.first.map_or(x0, |f| x(f).clamp(x0, x1));
    let (lost, mark) = match b.lost {
        None => (None, [0.0, 0.0]),
        Some(Lost::Preempted) => (Some("preempted"), [x1 - 3.5, y - 2.0]),
        Some(Lost::Failed) => (Some("failed"), [x1 - 3.0, y]),
    };
    BarShape {
        title: &b.title,
        colour: b.colour,
        lost,
        error: b.error,
        x: tenth(x0),
        y: tenth(y),
        w: tenth(x1 - x0),
        split: tenth(split),
        decode_w: tenth((x1 - split).max(0.0)),
        mark: mark.map(tenth),
    }
}

/// A request holding its slot now: a bar from its grant to now, outlined in its colour.
fn holder(h: &HoldView) -> HolderShape {
    let x0 = x(h.held).min(W - 2.0);
    let title = match h.client.as_deref() {
        None => format!("slot {}: {ANOTHER} · holding it {:.1} s", h.slot, h.held),
        Some(c) => format!(
            "slot {}: {c} · {} · holding it {:.1} s, {:.1} s left predicted",
            h.slot, h.class, h.held, h.left
        ),
    };
    HolderShape {
        slot: h.slot,
        title,
        colour: h.colour,
        x: tenth(x0),
        y: tenth(f64::from(h.slot) * ROW + 2.0),
        w: tenth((W - x0).max(2.0)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::http::status::palette::PALETTE;

    /// `timelines` as the page draws them.
    fn drawn(timelines: &[TimelineView]) -> String {
        let timelines: Vec<_> = timelines.iter().map(shape).collect();
        super::super::templates::render("slots.html", minijinja::context! { timelines }).unwrap()
    }

    fn bar(slot: u32, start: Instant, client: Option<&str>, error: bool) -> Bar {
        lost_bar(slot, start, client, error, None)
    }

    fn lost_bar(
        slot: u32,
        start: Instant,
        client: Option<&str>,
        error: bool,
        lost: Option<Lost>,
    ) -> Bar {
        Bar {
            slot,
            start,
            first: Some(start + Duration::from_secs(2)),
            end: start + Duration::from_secs(10),
            client: client.map(|c| Arc::new(c.to_string())),
            lost,
            alias: Arc::new("frank".into()),
            status: if error { 502 } else { 200 },
            error,
            prompt: 100,
            output: 20,
            gpu_s: 9.5,
            requests: 1,
        }
    }

    #[test]
    fn bars_are_drawn_per_slot_in_their_clients_colours() {
        let now = Instant::now();
        let t0 = now - Duration::from_secs(60);
        let bars = [
            bar(0, t0, Some("ann"), false),
            bar(1, t0, Some("bob<"), true),
            lost_bar(
                1,
                t0 + Duration::from_secs(20),
                None,
                false,
                Some(Lost::Failed),
            ),
            lost_bar(
                0,
                t0 + Duration::from_secs(20),
                Some("bob<"),
                false,
                Some(Lost::Preempted),
            ),
            bar(5, t0, Some("ann"), false),
        ];
        let names = ["ann", "bob<"];
        let v = view("gpu", 2, &bars, now, &names, None);
        assert_eq!(v.bars.len(), 4, "slot 5 of 2 is not drawn");
        assert_eq!(
            v.legend,
            vec![
                ("ann".into(), PALETTE[1]),
                ("bob<".into(), PALETTE[2]),
                (NO_CLIENT.into(), PALETTE[0])
            ]
        );
        let out = drawn(&[v]);
        assert!(out.contains(">slot 0</text>") && out.contains(">slot 1</text>"));
        assert!(!out.contains(">slot 2</text>"));
        assert!(
            out.contains("ann · frank · 100 prompt + 20 output tokens · 9.50 GPU-s · status 200"),
            "{out}"
        );
        assert!(out.contains("bob&lt;"), "names are escaped: {out}");
        assert!(out.contains("stroke=\"#cf222e\""), "the error is outlined");
        assert!(
            out.contains(
                "slot 1: no client · frank · failed after 10.0 s on its slot, before an answer"
            ),
            "{out}"
        );
        assert!(
            out.contains("slot 0: bob&lt; · frank · preempted after 10.0 s on its slot"),
            "{out}"
        );
        // Each lost bar dashed and marked: ▼ preempted, a red ✕ failed.
        assert_eq!(out.matches("data-lost=\"preempted\"").count(), 1);
        assert_eq!(out.matches("data-lost=\"failed\"").count(), 1);
        assert_eq!(out.matches("stroke-dasharray").count(), 2);
        assert!(out.contains(">-10 min</text>") && out.contains(">now</text>"));
        // Prefill lighter, decode full: two rects a bar.
        assert_eq!(out.matches("fill-opacity=\"0.45\"").count(), 2);
        // A client sees its own bars named, the others grey.
        let v = view("gpu", 2, &bars, now, &names, Some("ann"));
        assert_eq!(
            v.legend,
            vec![("ann".into(), PALETTE[1]), (NO_CLIENT.into(), PALETTE[0])]
        );
        assert_eq!(v.bars[1].colour, OTHER);
        assert_eq!(v.bars[1].title, "slot 1: another client");
        assert!(v.bars[3]
            .title
            .starts_with("slot 0: another client · preempted after"));
    }

    #[test]
    fn a_slot_held_now_is_a_bar_open_to_now_and_a_line_beside() {
        let now = Instant::now();
        let mut v = view("gpu", 2, &[], now, &["ann"], None);
        let held = |slot, client: Option<&str>, colour| HoldView {
            slot,
            client: client.map(str::to_string),
            colour,
            class: "batch",
            held: 90.0,
            left: 12.5,
        };
        v.holding = vec![held(0, Some("ann<"), PALETTE[1]), held(1, None, OTHER)];
        let out = drawn(&[v.clone()]);
        assert!(
            out.contains(
                "<li>slot 0 · ann&lt; · batch · 90.0 s so far · 12.5 s left, predicted</li>"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "<title>slot 0: ann&lt; · batch · holding it 90.0 s, 12.5 s left predicted</title>"
            ),
            "{out}"
        );
        assert!(
            out.contains("<title>slot 1: another client · holding it 90.0 s</title>"),
            "{out}"
        );
        // From 90 s ago to the right edge: an eighth of the ten minutes' width, outlined.
        let x0 = LEFT + (1.0 - 90.0 / SPAN.as_secs_f64()) * (W - LEFT);
        let rect = format!("<rect x=\"{x0:.1}\" y=\"2.0\" width=\"{:.1}\"", W - x0);
        assert!(out.contains(&rect), "{rect} in {out}");
        assert!(out.contains(&format!("stroke=\"{}\" stroke-width=\"1.5\"", PALETTE[1])));
        v.holding.clear();
        let out = drawn(&[v]);
        assert!(
            out.contains("holding</b> <span class=\"dim\">none</span>"),
            "{out}"
        );
    }

    #[test]
    fn the_queue_lists_each_waiting_request() {
        let mut v = view("gpu", 2, &[], Instant::now(), &["ann"], None);
        let out = drawn(&[v.clone()]);
        assert!(
            out.contains("waiting</b> <span class=\"dim\">none</span>"),
            "{out}"
        );
        v.queue = (0..22)
            .map(|i| (format!("c<{i}>"), "batch", 1.25, 4.0))
            .collect();
        let out = drawn(&[v]);
        assert!(
            out.contains("<li>c&lt;0&gt; · batch · waited 1.2 s · predicted 4.0 s</li>"),
            "{out}"
        );
        assert_eq!(out.matches("<li>").count(), 20);
        assert!(out.contains("and 2 more"), "{out}");
    }
}
