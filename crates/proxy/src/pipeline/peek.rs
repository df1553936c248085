//! SGLang reports a context overflow inside an HTTP 200 stream: its first event is read before
//! the client's headers are committed.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

use crate::error::ProxyError;
use crate::guard;
use crate::upstream::BodyStream;
use crate::upstream::BoxError;

/// Read the stream until its first complete event (or `limit` passes, or `event_limit` bytes
/// came without an event's end) and say whether that event is a context error. Returns what
/// was read, to be sent on unchanged otherwise.
pub(crate) async fn first_event(
    upstream: &mut BodyStream,
    limit: Duration,
    event_limit: usize,
    window: u32,
) -> (Vec<Result<Bytes, BoxError>>, Option<ProxyError>) {
    let mut read = Vec::new();
    let mut seen = Vec::new();
    // How much of `seen` holds no event end (each byte is searched a bounded number of times).
    let mut searched = 0usize;
    let deadline = tokio::time::Instant::now() + limit;
    while let Ok(Some(item)) = tokio::time::timeout_at(deadline, upstream.next()).await {
        let chunk = match &item {
            Ok(c) => c.clone(),
            Err(_) => {
                read.push(item);
                break;
            }
        };
        read.push(item);
        seen.extend_from_slice(&chunk);
        if crate::wire::stream::event_end_after(&seen, searched).is_some() {
            if let Some(data) = crate::wire::stream::first_payload(&seen) {
                return (read, guard::canonical::from_sse_event(data, window));
            }
            break;
        }
        searched = seen.len();
        if searched > event_limit {
            break;
        }
    }
    (read, None)
}
