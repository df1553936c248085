//! The status page rendered for an admin key at a large fleet's scale: 100 aliases over 10
//! backends of 16 slots, each backend's timeline full (600 bars) and every slot held by a
//! named client's request, 1,000 named clients each with GPU time in the last five minutes
//! (the busiest charted). Prints
//! the page's size; criterion gives the render time (the whole handler: snapshot, gathering,
//! HTML).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue};
use switchboard_proxy::config::Priority;
use switchboard_proxy::fleet::slots::SlotPermit;
use switchboard_proxy::fleet::ticket::Ticket;
use switchboard_proxy::fleet::timeline::{Bar, Lost, MOST};
use switchboard_proxy::live::AppState;

const ALIASES: usize = 100;
const BACKENDS: usize = 10;
const CLIENTS: usize = 1000;

fn fleet() -> AppState {
    let mut toml = String::from("[server]\nadmin_keys_env = \"SB_BENCH_ADMIN\"\n");
    std::env::set_var("SB_BENCH_ADMIN", "admin-key");
    for b in 0..BACKENDS {
        toml.push_str(&format!(
            "[backends.gpu-{b}]\nurl = \"http://127.0.0.1:{}\"\nflavor = \"llamacpp\"\nslots = 16\n",
            20_000 + b
        ));
    }
    for a in 0..ALIASES {
        toml.push_str(&format!(
            "[aliases.alias-{a}]\nbackend = \"gpu-{}\"\ndescription = \"alias number {a}\"\n",
            a % BACKENDS
        ));
    }
    for c in 0..CLIENTS {
        let var = format!("SB_BENCH_CLIENT_{c}");
        std::env::set_var(&var, format!("client-key-{c}"));
        toml.push_str(&format!(
            "[clients.client-{c}]\nkey_env = \"{var}\"\ntokens_per_minute = 100000\ntokens_per_day = 10000000\n"
        ));
    }
    let config = switchboard_proxy::config::from_toml(&toml).unwrap();
    AppState::new(config, None).unwrap()
}

/// Every backend's timeline full: bars of every client across its slots; every slot held by
/// a request of a client late in the list (the permits returned hold them); every client with
/// GPU time in the last five minutes.
fn fill(state: &AppState) -> Vec<SlotPermit> {
    let snap = state.live.load_full();
    let now = Instant::now();
    let mut held = Vec::new();
    for (i, c) in snap.clients.callers().iter().enumerate() {
        c.state.recent.add(now, 1000, 500 + i as u64);
    }
    for b in 0..BACKENDS {
        let replica = snap.replica(&format!("gpu-{b}")).unwrap();
        for s in 0..16 {
            let client = &snap.clients.callers()[CLIENTS - 1 - b * 16 - s];
            let ticket = Ticket {
                class: Priority::Batch,
                client: client.state.id,
                ..Ticket::plain(now)
            };
            held.push(replica.slots.try_acquire_for(ticket).unwrap());
        }
        for i in 0..MOST {
            let start = now - Duration::from_millis(((MOST - i) * 900) as u64);
            replica.slots.timeline.push(Bar {
                slot: (i % 16) as u32,
                start,
                first: Some(start + Duration::from_millis(200)),
                end: start + Duration::from_millis(800),
                client: Some(Arc::new(format!("client-{}", i % CLIENTS))),
                lost: (i % 50 == 0).then_some(Lost::Preempted),
                alias: Arc::new(format!("alias-{}", b)),
                status: 200,
                error: i % 97 == 0,
                prompt: 4000,
                output: 300,
                gpu_s: 2.5,
                requests: 1,
            });
        }
    }
    held
}

fn render(c: &mut Criterion) {
    let state = fleet();
    let _held = fill(&state);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_static("Bearer admin-key"),
    );
    let page = || {
        rt.block_on(async {
            let resp =
                switchboard_proxy::http::status::page(State(state.clone()), headers.clone()).await;
            axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap()
        })
    };
    let body = page();
    eprintln!(
        "status page: {ALIASES} aliases, {BACKENDS} backends with full timelines, {CLIENTS} clients: {} bytes",
        body.len()
    );
    assert!(body.len() > 100_000);
    c.bench_function("status_page_render_100_aliases_1000_clients", |b| {
        b.iter(page)
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = render
}
criterion_main!(benches);
