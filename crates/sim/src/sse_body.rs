//! The SSE body of one streamed generation: paced events, the gate, `fail_after`, cancel.
//!
//! Events: the role chunk (chat only), one chunk per token, the finish chunk, the
//! usage-only chunk when asked for, then `data: [DONE]`. `ttft` comes before the first
//! event and `token_delay` before each token after the first; a gated stream waits for
//! the gate after its first event. Dropping the body mid-way drops the [`Generation`],
//! which counts as cancelled and frees the slot.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::watch;

use super::dialects::dialect;
use super::frame::Kind;
use super::frame::{Counts, Frame, DONE};
use super::generation::{End, Generation};
use super::plan::{GenRequest, Plan};
use super::reply;
use super::state::Shared;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Role,
    Tokens,
    Finish,
    Usage,
    Done,
    End,
}

struct Events {
    sh: Arc<Shared>,
    frame: Frame,
    plan: Plan,
    include_usage: bool,
    gen: Generation,
    gate: Option<watch::Receiver<bool>>,
    stage: Stage,
    next_token: u32,
    emitted: u32,
    start: Instant,
    first_token: Option<Instant>,
    counts: Counts,
    text: String,
}

/// Answers with an SSE stream; the generation already holds its slot.
pub(crate) fn respond(sh: Arc<Shared>, req: &GenRequest, plan: Plan, gen: Generation) -> Response {
    let id = sh.next_id();
    let created = reply::unix_now();
    let frame = Frame::new(dialect(sh.flavor()), req.kind, &id, created, &sh.model_json)
        .spaced(sh.cfg.spaced_json);
    let gate = sh.cfg.gate.then(|| sh.gate.subscribe());
    let events = Events {
        frame,
        plan,
        include_usage: req.include_usage,
        gen,
        gate,
        stage: if req.kind == Kind::Chat {
            Stage::Role
        } else {
            Stage::Tokens
        },
        next_token: 0,
        emitted: 0,
        start: Instant::now(),
        first_token: None,
        counts: Counts::default(),
        text: String::with_capacity(32),
        sh,
    };
    let flavor = events.sh.flavor();
    let body = futures_util::stream::unfold(events, |mut ev| async move {
        let item = ev.next().await?;
        Some((item, ev))
    });
    reply::sse(flavor, Body::from_stream(body))
}

impl Events {
    async fn next(&mut self) -> Option<io::Result<Bytes>> {
        if self.stage == Stage::End {
            return None;
        }
        if self.sh.cfg.fail_after == Some(self.emitted) {
            // Let the server flush what was sent so far: a body error drops unflushed bytes.
            tokio::task::yield_now().await;
            self.stage = Stage::End;
            self.gen.end(End::Failed);
            return Some(Err(io::Error::other("simulated backend failure")));
        }
        if self.sh.cfg.stall_after == Some(self.emitted) {
            // Hold the connection and send nothing more, until the client goes.
            std::future::pending::<()>().await;
        }
        if self.emitted == 0 {
            self.gen.before_first(self.sh.cfg.ttft).await;
        } else if let Some(mut gate) = self.gate.take() {
            // An error means the simulator is gone: nothing left to wait for.
            let _ = gate.wait_for(|open| *open).await;
        }
        let event = self.produce().await;
        self.emitted += 1;
        Some(Ok(event))
    }

    async fn produce(&mut self) -> Bytes {
        loop {
            match self.stage {
                Stage::Role => {
                    self.stage = Stage::Tokens;
                    return self.frame.role();
                }
                Stage::Tokens if self.next_token < self.plan.tokens => {
                    let delay = self.sh.cfg.token_delay;
                    self.gen.before_token(self.next_token, delay).await;
                    self.first_token.get_or_insert_with(Instant::now);
                    self.text.clear();
                    let field = self.plan.write_token(self.next_token, &mut self.text);
                    self.next_token += 1;
                    return self.frame.token(field, &self.text);
                }
                Stage::Tokens => self.stage = Stage::Finish,
                Stage::Finish => {
                    self.counts = self.counts();
                    self.stage = if self.include_usage {
                        Stage::Usage
                    } else {
                        Stage::Done
                    };
                    return self
                        .frame
                        .finish(self.plan.finish, self.include_usage, &self.counts);
                }
                Stage::Usage => {
                    self.stage = Stage::Done;
                    return self.frame.usage(&self.counts);
                }
                Stage::Done | Stage::End => {
                    self.stage = Stage::End;
                    self.gen.end(End::Completed);
                    reply::count_generation(&self.sh, &self.counts);
                    return Bytes::from_static(DONE);
                }
            }
        }
    }

    fn counts(&self) -> Counts {
        if let Some(c) = self.gen.gpu_counts(&self.plan) {
            return c;
        }
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        Counts {
            prompt: self.plan.prompt,
            completion: self.plan.tokens,
            reasoning: self.plan.reasoning_tokens(),
            prompt_ms: millis(first - self.start),
            predicted_ms: millis(now - first),
            cached: None,
        }
    }
}

pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
