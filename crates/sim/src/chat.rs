//! Generation endpoints: `/v1/chat/completions` and `/v1/completions`, stream or not.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;

use super::dialects::dialect;
use super::frame::{Answer, Counts, Failure, Kind};
use super::generation::{End, Generation};
use super::plan::{self, GenRequest, Plan};
use super::reply;
use super::sglang;
use super::sse_body::{self, millis};
use super::state::Shared;
use switchboard_wire::flavor::Flavor;

pub(crate) async fn chat(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    generate(sh, Kind::Chat, &body).await
}

pub(crate) async fn completions(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    generate(sh, Kind::Text, &body).await
}

async fn generate(sh: Arc<Shared>, kind: Kind, raw: &[u8]) -> Response {
    let flavor = sh.flavor();
    let failing = sh.fail_status.load(std::sync::atomic::Ordering::SeqCst);
    if let Some(status) = StatusCode::from_u16(failing).ok().filter(|_| failing != 0) {
        let body = serde_json::json!({"error": {"message": "simulated failure", "code": failing}});
        return reply::json(flavor, status, &body);
    }
    let d = dialect(flavor);
    let req = match plan::parse(sh.gpu.is_some(), flavor, d, kind, raw) {
        Ok(r) => r,
        Err(f) => return reply::failure(&sh, &f),
    };
    let plan = match Plan::new(&sh.cfg, d, &req) {
        Ok(p) => p,
        // SGLang reports a stream's context error inside a 200 event stream.
        Err(f @ Failure::Overflow { .. }) if req.stream && flavor == Flavor::Sglang => {
            return reply::sse(flavor, sglang::stream_error(&f).into());
        }
        Err(f) => return reply::failure(&sh, &f),
    };
    let Some(gen) = Generation::start(&sh, &req, &plan).await else {
        return reply::empty(flavor, StatusCode::SERVICE_UNAVAILABLE);
    };
    if req.stream {
        sse_body::respond(sh, &req, plan, gen)
    } else {
        answer(&sh, &req, plan, gen).await
    }
}

/// Waits as long as the whole generation would take, then answers in one body.
async fn answer(sh: &Shared, req: &GenRequest, plan: Plan, mut gen: Generation) -> Response {
    let cfg = &sh.cfg;
    let counts = if gen.run_gpu(&plan).await {
        gen.gpu_counts(&plan).unwrap_or_default()
    } else {
        let start = Instant::now();
        if !cfg.ttft.is_zero() {
            tokio::time::sleep(cfg.ttft).await;
        }
        let first = Instant::now();
        let rest = cfg
            .token_delay
            .saturating_mul(plan.tokens.saturating_sub(1));
        if !rest.is_zero() {
            tokio::time::sleep(rest).await;
        }
        Counts {
            prompt: plan.prompt,
            completion: plan.tokens,
            reasoning: plan.reasoning_tokens(),
            prompt_ms: millis(first - start),
            predicted_ms: millis(first.elapsed()),
            cached: None,
        }
    };
    let (reasoning, content) = plan.texts();
    let id = sh.next_id();
    let answer = Answer {
        kind: req.kind,
        id: &id,
        created: reply::unix_now(),
        model: &cfg.model,
        reasoning,
        content,
        finish: plan.finish,
        counts,
    };
    let body = dialect(sh.flavor()).body(&answer);
    gen.end(End::Completed);
    reply::count_generation(sh, &counts);
    reply::json(sh.flavor(), StatusCode::OK, &body)
}
