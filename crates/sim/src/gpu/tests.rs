//! The slot model on tokio's paused clock: slot choice, cached prefixes, cancellation, times.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Gpu, Lease, Start};
use crate::config::GpuSim;
use switchboard_wire::flavor::Flavor;

const GPU: GpuSim = GpuSim {
    prefill_tps: 1000.0,
    decode_tps: 10.0,
    prefill_half_depth: 0,
    decode_half_depth: 0,
    batch: 512,
};

fn seq(from: u32, n: u32) -> Arc<[u32]> {
    (from..from + n).collect()
}

fn now(gpu: &Arc<Gpu>, prompt: &Arc<[u32]>, pin: Option<usize>) -> Lease {
    match gpu.start(Arc::clone(prompt), pin) {
        Start::Now(l) => l,
        Start::Wait(_) => panic!("expected a free slot"),
    }
}

async fn run(mut lease: Lease, decode: u32) {
    lease.prefill().await;
    for _ in 0..decode {
        lease.decode().await;
    }
}

#[tokio::test(start_paused = true)]
async fn next_turn_reuses_prompt_and_output_less_the_last_token() {
    let gpu = Gpu::new(GPU, Flavor::Llamacpp, 2);
    let first = seq(0, 1000);
    let mut lease = now(&gpu, &first, None);
    assert_eq!(
        (lease.slot(), lease.cached(), lease.prompt_n()),
        (0, 0, 1000)
    );
    lease.set_output((5000..5010).collect());
    let t0 = Instant::now();
    run(lease, 10).await;
    // 1000 tokens at 1000 t/s, then 10 steps at 10 t/s.
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    let mut next: Vec<u32> = (0..1000).chain(5000..5010).collect();
    next.extend(9000..9100);
    let lease = now(&gpu, &next.into(), None);
    assert_eq!((lease.slot(), lease.cached()), (0, 1009));
    assert_eq!(gpu.busy(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_whole_cached_prompt_still_evaluates_its_last_token() {
    let gpu = Gpu::new(GPU, Flavor::Llamacpp, 1);
    let p = seq(0, 100);
    run(now(&gpu, &p, None), 0).await;
    let lease = now(&gpu, &p, None);
    assert_eq!((lease.cached(), lease.prompt_n()), (99, 1));
}

#[tokio::test(start_paused = true)]
async fn cancelled_prefill_leaves_the_chunks_it_finished() {
    let gpu = Gpu::new(GPU, Flavor::Llamacpp, 1);
    let p = seq(0, 2000);
    let mut lease = now(&gpu, &p, None);
    // Chunks of 512 end at 0.512 s and 1.024 s; the third would end at 1.536 s.
    let cut = tokio::time::timeout(Duration::from_millis(1200), lease.prefill()).await;
    assert!(cut.is_err());
    drop(lease);
    assert_eq!(gpu.slots()[0].cached_tokens, 1024);
    let again = now(&gpu, &p, None);
    assert_eq!((again.cached(), again.prompt_n()), (1024, 976));
    assert_eq!(gpu.busy(), Duration::from_millis(1200));
}

#[tokio::test(start_paused = true)]
async fn pinned_request_waits_for_its_slot_in_order() {
    let gpu = Gpu::new(GPU, Flavor::Llamacpp, 2);
    let holder = now(&gpu, &seq(0, 10), Some(0));
    let Start::Wait(first) = gpu.start(seq(100, 10), Some(0)) else {
        panic!("slot 0 is busy");
    };
    let Start::Wait(second) = gpu.start(seq(200, 10), Some(0)) else {
        panic!("slot 0 is busy");
    };
    // Slot 1 is free for anyone else.
    let other = now(&gpu, &seq(300, 10), None);
    assert_eq!(other.slot(), 1);
    drop(holder);
    let first = first.wait().await.expect("slot 0");
    assert_eq!(first.slot(), 0);
    assert_eq!(gpu.pin(Some(5)), Some(1), "wraps around as llama.cpp does");
    assert_eq!(gpu.pin(Some(-1)), None);
    drop(first);
    assert_eq!(second.wait().await.expect("slot 0").slot(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_takes_the_slot_with_the_longest_common_prefix() {
    let gpu = Gpu::new(GPU, Flavor::Llamacpp, 3);
    let (a, b) = (seq(0, 100), seq(1000, 100));
    let (la, lb) = (now(&gpu, &a, None), now(&gpu, &b, None));
    assert_eq!((la.slot(), lb.slot()), (0, 1));
    run(la, 0).await;
    run(lb, 0).await;
    let b_more: Vec<u32> = (1000..1100).chain(7..20).collect();
    let l = now(&gpu, &b_more.into(), None);
    assert_eq!((l.slot(), l.cached()), (1, 100));
    // No slot shares enough: the least recently used idle one (slot 2, never used).
    let l2 = now(&gpu, &seq(5000, 100), None);
    assert_eq!(l2.slot(), 2);
}

#[tokio::test(start_paused = true)]
async fn queued_requests_start_in_order_as_slots_free() {
    let gpu = Gpu::new(GPU, Flavor::Llamacpp, 1);
    let holder = now(&gpu, &seq(0, 10), None);
    let Start::Wait(first) = gpu.start(seq(100, 10), None) else {
        panic!("busy");
    };
    let Start::Wait(second) = gpu.start(seq(200, 10), None) else {
        panic!("busy");
    };
    drop(first);
    drop(holder);
    assert_eq!(second.wait().await.expect("slot").slot(), 0);
    assert!(
        !gpu.slots()[0].busy,
        "the lease was dropped with its ticket's wait"
    );
}

#[tokio::test(start_paused = true)]
async fn vllm_shares_its_prefix_cache_across_slots_by_blocks() {
    let gpu = Gpu::new(GPU, Flavor::Vllm, 2);
    let a = seq(0, 100);
    let hold = now(&gpu, &seq(500, 10), None);
    assert_eq!(gpu.pin(Some(1)), None, "vLLM has no id_slot");
    run(now(&gpu, &a, None), 0).await;
    drop(hold);
    let more: Vec<u32> = (0..100).chain(200..250).collect();
    let l = now(&gpu, &more.into(), None);
    assert_eq!(
        l.slot(),
        1,
        "the least recently used slot, not the one that ran `a` last"
    );
    assert_eq!(l.cached(), 96, "100 shared tokens, six whole blocks");
}

#[tokio::test(start_paused = true)]
async fn rates_slow_with_depth() {
    let cfg = GpuSim {
        prefill_half_depth: 1000,
        decode_half_depth: 1000,
        ..GPU
    };
    let gpu = Gpu::new(cfg, Flavor::Llamacpp, 1);
    let lease = now(&gpu, &seq(0, 1000), None);
    let (prefill, decode) = lease.model_ms(2);
    // 512 at depth 0 (0.512 s), 488 at depth 512 (0.488 * 1.512 s).
    assert!(
        (prefill - (512.0 + 488.0 * 1.512)).abs() < 1e-6,
        "{prefill}"
    );
    // Step 0 at depth 1000, step 1 at depth 1000 (the first token is not in the cache yet).
    assert!((decode - 2.0 * 100.0 * 2.0).abs() < 1e-6, "{decode}");
    let t0 = Instant::now();
    run(lease, 2).await;
    let took = t0.elapsed().as_secs_f64() * 1000.0;
    assert!((took - prefill - decode).abs() < 1.0, "{took}");
}
