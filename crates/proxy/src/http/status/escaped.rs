//! Names with markup in them (aliases, backends, clients, batches, the stores) come out
//! escaped in every panel of the status page, in text and in attributes.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::clients::ClientView;
use super::palette::PALETTE;
use super::slots::{BarView, HoldView, TimelineView};
use super::usage::LedgerView;
use super::view::{AliasView, BackendView, CostView, Fleet, SharedView};
use crate::batches::store::BatchRow;
use crate::ledger::{Daily, DAYS};
use crate::observe::window::{Point, Summary};

/// A name that would be a script, break out of a quoted attribute and start an entity.
const NAME: &str = "<script>alert(\"x&y\")</script>'";
/// `NAME` as minijinja's escaper writes it.
const ESCAPED: &str = "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;&#x2f;script&gt;&#x27;";

fn alias() -> AliasView {
    AliasView {
        name: NAME.into(),
        description: Some(NAME.into()),
        old_names: vec![NAME.into()],
        context_window: None,
        backends: vec![BackendView {
            name: NAME.into(),
            flavor: "llamacpp",
            url: format!("http://gpu1:8000/{NAME}"),
            state: "up",
            busy: 0,
            slots: 2,
            queue_limit: 8,
            cost: CostView::default(),
            queue: Vec::new(),
        }],
        inflight: 0,
        queued: 0,
        prompt_tokens: 0,
        cached_tokens: 0,
        last_5m: Summary::default(),
        series: vec![Point::default(); 30],
    }
}

fn timeline() -> TimelineView {
    TimelineView {
        backend: NAME.into(),
        slots: 2,
        bars: vec![BarView {
            slot: 0,
            start: 60.0,
            first: Some(50.0),
            end: 10.0,
            colour: PALETTE[1],
            lost: None,
            error: false,
            title: format!("slot 0: {NAME} · {NAME} · status 200"),
        }],
        legend: vec![(NAME.into(), PALETTE[1])],
        queue: vec![(NAME.into(), "batch", 1.0, 2.0)],
        holding: vec![HoldView {
            slot: 1,
            client: Some(NAME.into()),
            colour: PALETTE[1],
            class: "batch",
            held: 3.0,
            left: 4.0,
        }],
    }
}

fn client() -> ClientView {
    ClientView {
        name: NAME.into(),
        priority: "batch",
        aliases: Some(vec![NAME.into()]),
        inflight: 0,
        queued: 0,
        max_concurrent: None,
        tokens_5m: 0,
        gpu_5m: 1.0,
        gpu_steps: Some([1.0 / 30.0; 30]),
        colour: PALETTE[1],
        limits: Vec::new(),
        month: Vec::new(),
    }
}

fn ledger() -> LedgerView {
    let mut daily = Daily::default();
    daily.clients.insert(NAME.into(), [(10, 36.0); DAYS]);
    LedgerView {
        at: NAME.into(),
        trouble: Some(NAME.into()),
        waiting: 1,
        dropped: 0,
        daily: Arc::new(daily),
        only: None,
    }
}

fn fleet() -> Fleet {
    Fleet {
        version: "0.0.0",
        now: UNIX_EPOCH + Duration::from_secs(1_735_689_599),
        started: 1_735_689_000,
        reload: None,
        shared: Some(SharedView {
            store: NAME.into(),
            up: true,
        }),
        aliases: vec![alias()],
        clients: vec![client()],
        ledger: Some(ledger()),
        timelines: vec![timeline()],
        batches: vec![BatchRow {
            id: NAME.into(),
            client: NAME.into(),
            endpoint: NAME.into(),
            status: crate::batches::BatchState::InProgress,
            total: 2,
            ..BatchRow::default()
        }],
    }
}

#[test]
fn a_name_with_markup_in_it_comes_out_escaped_in_every_panel() {
    let html = super::html::render(&fleet(), "n").unwrap_or_else(|e| panic!("{e}"));
    // Nowhere as written, and the page's own script the only one.
    assert!(!html.contains(NAME), "{html}");
    assert!(!html.contains("alert(\""), "{html}");
    assert_eq!(html.matches("<script").count(), 1, "{html}");
    let e = ESCAPED;
    for (panel, shown) in [
        (
            "header",
            format!("shared state {e}: <span class=\"ok\">up</span>"),
        ),
        (
            "header",
            format!(" · usage ledger {e}: <span class=\"bad\">writes failing</span> ({e})"),
        ),
        (
            "aliases",
            format!("<tr data-alias=\"{e}\"><td class=\"alias\"><b>{e}</b>"),
        ),
        (
            "aliases",
            format!("<div class=\"desc\">{e}</div><div class=\"old\">also answers to {e}</div>"),
        ),
        (
            "aliases",
            format!("data-backend=\"{e}\"><span class=\"state up\">up</span> <b>{e}</b>"),
        ),
        (
            "aliases",
            format!("<div class=\"url\">http:&#x2f;&#x2f;gpu1:8000&#x2f;{e}</div>"),
        ),
        (
            "aliases",
            format!("<tr class=\"charts\" data-charts=\"{e}\">"),
        ),
        (
            "slots",
            format!("<div class=\"timeline\" data-timeline=\"{e}\"><h3>{e} <span"),
        ),
        (
            "slots",
            format!("<title>2 slots of {e}, last 10 minutes</title>"),
        ),
        (
            "slots",
            format!("<g><title>slot 0: {e} · {e} · status 200</title>"),
        ),
        (
            "slots",
            format!("<g data-holding=\"1\"><title>slot 1: {e} · batch · holding it"),
        ),
        ("slots", format!("<li>slot 1 · {e} · batch · 3.0 s so far")),
        ("slots", format!("<li>{e} · batch · waited 1.0 s")),
        ("slots", format!("</svg> {e}</span>")),
        (
            "clients",
            format!("<tr><td>{e}</td><td>batch</td><td>{e}</td>"),
        ),
        (
            "batches",
            format!("<tr><td>{e}</td><td>{e}</td><td>{e}</td><td>in_progress</td>"),
        ),
        ("usage", format!("<tr><td>{e}</td><td><span class=\"fig\">")),
    ] {
        assert!(html.contains(&shown), "{panel}: {shown} in {html}");
    }
}
