//! What the Messages and Responses endpoints of the simulator share: reading a request into
//! the chat generation plan, and a paced SSE body of named events (`ttft` before the first,
//! `token_delay` before each token after the first, the gate after the first, `fail_after`).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use super::dialects::dialect;
use super::frame::{Counts, Failure, Field, Kind};
use super::generation::{End, Generation};
use super::gpu::CacheUse;
use super::plan::{GenRequest, Plan};
use super::reply;
use super::state::Shared;
use super::tokenize::{count_prompt_tokens, prompt_ids, thinking_enabled};

/// One event of a paced stream; `token`: it carries a generated token.
pub(crate) struct Step {
    pub(crate) bytes: Bytes,
    pub(crate) token: bool,
}

/// `event: <type>` with `v` as its data.
pub(crate) fn named(v: &Value) -> Bytes {
    let name = v["type"].as_str().unwrap_or("message");
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// A Messages or Responses request as the simulator plans it: the chat body it stands for
/// (its prompt counted by the chat template), its budget and whether it streams.
pub(crate) struct ApiRequest {
    pub(crate) chat: Value,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) stream: bool,
    /// llama.cpp's `id_slot`, as sent.
    pub(crate) id_slot: Option<i64>,
    /// What it says of the prompt cache.
    pub(crate) cache: CacheUse,
}

impl ApiRequest {
    /// The generation plan, or the failure the backend answers with.
    pub(crate) fn plan(&self, sh: &Shared) -> Result<(GenRequest, Plan), Failure> {
        let flavor = sh.flavor();
        let req = GenRequest {
            kind: Kind::Chat,
            stream: self.stream,
            include_usage: false,
            max_tokens: self.max_tokens,
            prompt_tokens: count_prompt_tokens(flavor, &self.chat),
            thinking: thinking_enabled(&self.chat),
            id_slot: self.id_slot,
            cache: self.cache.clone(),
            prompt: sh.gpu.is_some().then(|| prompt_ids(&self.chat)),
        };
        let plan = Plan::new(&sh.cfg, dialect(flavor), &req)?;
        Ok((req, plan))
    }
}

/// The body parsed as a JSON object, or the failure.
pub(crate) fn parse_body(raw: &[u8]) -> Result<Value, Failure> {
    let body: Value = serde_json::from_slice(raw).map_err(|e| Failure::Json {
        line: e.line(),
        column: e.column(),
        detail: e.to_string(),
    })?;
    if !body.is_object() {
        return Err(Failure::Invalid(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    Ok(body)
}

/// The generated tokens as `(field, text)`, in order.
pub(crate) fn tokens(plan: &Plan) -> Vec<(Field, String)> {
    (0..plan.tokens)
        .map(|i| {
            let mut t = String::new();
            let f = plan.write_token(i, &mut t);
            (f, t)
        })
        .collect()
}

/// The counts of a generation, its times as the pacing (or the GPU model) makes them.
pub(crate) fn counts(sh: &Shared, gen: &Generation, plan: &Plan) -> Counts {
    if let Some(c) = gen.gpu_counts(plan) {
        return c;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Counts {
        prompt: plan.prompt,
        completion: plan.tokens,
        reasoning: plan.reasoning_tokens(),
        prompt_ms: ms(sh.cfg.ttft),
        predicted_ms: ms(sh
            .cfg
            .token_delay
            .saturating_mul(plan.tokens.saturating_sub(1))),
        cached: None,
    }
}

/// Waits as long as the whole generation would take (a whole answer).
pub(crate) async fn wait_whole(sh: &Shared, gen: &mut Generation, plan: &Plan) {
    if gen.run_gpu(plan).await {
        return;
    }
    let d = sh.cfg.ttft
        + sh.cfg
            .token_delay
            .saturating_mul(plan.tokens.saturating_sub(1));
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

struct Paced {
    sh: Arc<Shared>,
    steps: std::vec::IntoIter<Step>,
    gen: Generation,
    counts: Counts,
    emitted: u32,
    tokens: u32,
    gate: Option<tokio::sync::watch::Receiver<bool>>,
    ended: bool,
}

impl Paced {
    async fn next(&mut self) -> Option<io::Result<Bytes>> {
        if self.ended {
            return None;
        }
        if self.sh.cfg.fail_after == Some(self.emitted) {
            // Let the server flush what was sent so far: a body error drops unflushed bytes.
            tokio::task::yield_now().await;
            self.ended = true;
            self.gen.end(End::Failed);
            return Some(Err(io::Error::other("simulated backend failure")));
        }
        let Some(step) = self.steps.next() else {
            self.ended = true;
            self.gen.end(End::Completed);
            reply::count_generation(&self.sh, &self.counts);
            return None;
        };
        if self.emitted == 0 {
            self.gen.before_first(self.sh.cfg.ttft).await;
        } else if let Some(mut gate) = self.gate.take() {
            let _ = gate.wait_for(|open| *open).await;
        }
        if step.token {
            self.gen
                .before_token(self.tokens, self.sh.cfg.token_delay)
                .await;
            self.tokens += 1;
        }
        self.emitted += 1;
        Some(Ok(step.bytes))
    }
}

/// A 200 event stream of `steps`; the generation already holds its slot.
pub(crate) fn respond(
    sh: Arc<Shared>,
    gen: Generation,
    steps: Vec<Step>,
    counts: Counts,
) -> Response {
    let flavor = sh.flavor();
    let gate = sh.cfg.gate.then(|| sh.gate.subscribe());
    let paced = Paced {
        sh,
        steps: steps.into_iter(),
        gen,
        counts,
        emitted: 0,
        tokens: 0,
        gate,
        ended: false,
    };
    let body = futures_util::stream::unfold(paced, |mut p| async move {
        let item = p.next().await?;
        Some((item, p))
    });
    reply::sse(flavor, Body::from_stream(body))
}
