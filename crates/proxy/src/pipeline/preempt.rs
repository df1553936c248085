//! Preemption before the first byte: a request of a lower class holding a slot an
//! `interactive` request waits for gives it up while it has sent its client nothing — its
//! answer's head is awaited, and a stream's first piece, with an ear open for the scheduler's
//! word ([`crate::fleet::slots`]). Its exchange is dropped (the backend sees its connection
//! close, as at a client's hang-up) and the request goes back to its queue, first of its
//! client's: its client only waits longer.

use std::future::Future;
use std::pin::Pin;

use axum::http::header;
use futures_util::StreamExt;

use super::send::Failed;
use crate::fleet::slots::SlotPermit;
use crate::upstream::exchange::Answer;

/// `send`'s result, unless the slot was asked for first (`None`). The exchange is awaited
/// where it was pinned (its future is large: moving it is a copy of every byte of it).
pub(crate) async fn sent<F: Future<Output = Result<Answer, Failed>>>(
    slot: &mut SlotPermit,
    mut send: Pin<&mut F>,
) -> Option<Result<Answer, Failed>> {
    if !slot.preemptible() {
        return Some(send.await);
    }
    tokio::select! {
        sent = &mut send => Some(sent),
        () = slot.preempted() => None,
    }
}

/// `answer` once its first piece is read (a stream's; a whole answer's head is its end),
/// after which the request is preempted no more; `None` when the slot was asked for first.
pub(crate) async fn first_piece(slot: &mut SlotPermit, mut answer: Answer) -> Option<Answer> {
    if !slot.preemptible() {
        return Some(answer);
    }
    let streamed = answer
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if streamed && answer.status.is_success() {
        let first = tokio::select! {
            first = answer.body.next() => first,
            () = slot.preempted() => return None,
        };
        if let Some(first) = first {
            let rest = std::mem::replace(&mut answer.body, futures_util::stream::empty().boxed());
            answer.body = futures_util::stream::once(async move { first })
                .chain(rest)
                .boxed();
        }
    }
    slot.started().then_some(answer)
}
