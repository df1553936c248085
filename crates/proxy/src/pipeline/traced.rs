//! What the steps tell the request's trace, where it is sampled: the request as resolved, each
//! attempt at a backend as it starts and as it fails. Nothing is read while tracing is off or
//! the request's trace is not sampled.

use super::call::Incoming;
use super::call::Routed;
use super::choose::Chosen;
use super::send::Failed;
use crate::config::Alias;
use crate::fleet::conversation::ConversationId;
use crate::observe::record::Record;
use crate::observe::trace::Attempt;
use crate::upstream::failure::Kind;
use crate::wire::facts;

/// The model asked for, the output limit, the conversation (`id`, read once by the caller), the
/// client, the prompt.
pub(crate) fn resolved(
    rec: &mut Record,
    req: &Incoming,
    routed: &Routed,
    id: Option<&ConversationId>,
) {
    let Some(t) = rec.traced() else {
        return;
    };
    let max = req.adapter.requested_output(&req.body).ok().flatten();
    t.resolved(&routed.view.model, max.map(u64::from), routed.view.stream);
    t.alias(routed.route.alias.name());
    if let Some(id) = id {
        t.conversation(&String::from_utf8_lossy(&id.id));
    }
    if let Some(kind) = request_kind(&req.headers) {
        t.request_kind(&kind);
    }
    if let Some(c) = &req.caller {
        t.client(c.name());
    }
    if t.captures_content() {
        if let Some(prompt) = prompt_of(&req.body) {
            t.input(&prompt);
        }
    }
}

/// What kind of request Codex CLI says this is (`request_kind` of its `x-codex-turn-metadata`
/// JSON: a turn, a compaction, a sub-agent's turn).
fn request_kind(headers: &axum::http::HeaderMap) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Turn {
        request_kind: Option<String>,
    }
    let v = headers.get(CODEX_TURN_METADATA)?;
    serde_json::from_slice::<Turn>(v.as_bytes())
        .ok()?
        .request_kind
}

/// The header Codex CLI describes each request's turn in.
const CODEX_TURN_METADATA: &str = "x-codex-turn-metadata";

/// The prompt as the client wrote it: its `messages` (chat, Messages) or `input` (Responses).
fn prompt_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    ["messages", "input", "prompt"]
        .iter()
        .find_map(|k| v.get(*k))
        .map(ToString::to_string)
}

/// An attempt at `chosen`, a replica of `alias`, begins.
pub(crate) fn attempt(
    rec: &mut Record,
    alias: &Alias,
    chosen: &Chosen,
    translated: bool,
    resent: bool,
) {
    let Some(t) = rec.traced() else {
        return;
    };
    let b = &chosen.replica.backend;
    t.attempt(&Attempt {
        backend: &b.name,
        flavor: b.flavor.as_str(),
        authority: &b.authority,
        model: &alias.upstream_model,
        alias: &alias.name,
        queued: chosen.queued,
        affinity: chosen.affinity.map(|a| match a {
            crate::fleet::balance::AffinityResult::hit => "hit",
            crate::fleet::balance::AffinityResult::moved => "moved",
            crate::fleet::balance::AffinityResult::new => "new",
        }),
        resent,
        predicted_wait: chosen.predicted_wait,
        predicted_work: chosen.job.as_ref().map_or(0.0, |j| j.predicted.total()),
    });
    if translated {
        t.translated("chat_completions");
    }
}

/// The attempt's slot went to an interactive request before any byte reached the client.
pub(crate) fn preempted(rec: &mut Record, chosen: &Chosen) {
    tracing::info!(
        target: "switchboard::request",
        request_id = rec.request_id.to_str().unwrap_or_default(),
        backend = chosen.replica.name(),
        held_ms = chosen.job.as_ref().map(|j| j.held().as_secs_f64() * 1000.0),
        "preempted: its slot went to an interactive request; back in its queue"
    );
    if let Some(t) = rec.traced() {
        t.preempted(chosen.replica.name());
    }
}

/// The attempt failed before any byte reached the client.
pub(crate) fn failed(rec: &mut Record, failed: &Failed) {
    let Some(t) = rec.traced() else {
        return;
    };
    let status = match failed {
        Failed::Answer(a, _) => Some(a.status.as_u16()),
        _ => None,
    };
    let kind = match failed {
        Failed::Error(e, _) if e.dropped() => "dropped".to_string(),
        Failed::Error(e, _) if e.kind == Kind::Local => "proxy_overloaded".to_string(),
        Failed::Error(e, _) if e.held_by_backend() => {
            e.to_client().parts().3.unwrap_or("upstream").to_string()
        }
        other => format!("{:?}", other.reason()),
    };
    t.attempt_failed(&kind, status);
}

/// A whole answer as the backend sent it: its model, finish reason and (captured) text.
pub(crate) fn answer(rec: &mut Record, body: &[u8]) {
    let Some(t) = rec.traced() else {
        return;
    };
    let f = facts::read(body);
    t.response(f.model.as_deref(), f.finish.as_deref());
    if let Some(text) = f.text {
        t.output(&text);
    }
}

/// One stream event's data as the backend sent it: read in full for the model (until it is
/// known), a finish reason, or (captured) text; other events are passed over unread.
pub(crate) fn event(rec: &mut Record, data: &[u8]) {
    let Some(t) = rec.traced() else {
        return;
    };
    if !t.captures_content() && t.knows_model() && !facts::may_finish(data) {
        return;
    }
    let f = facts::read(data);
    t.response(f.model.as_deref(), f.finish.as_deref());
    if let Some(text) = f.text {
        t.output(&text);
    }
}
