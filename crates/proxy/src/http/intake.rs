//! Request intake shared by the handlers: request id, client auth, content type, size-limited body.

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};

use crate::clients::Caller;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::Instant;

use crate::error::{Echo, ProxyError};
use crate::live::Snapshot;
use crate::observe::record::Record;
use crate::wire::Adapter;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request id: the client's `x-request-id` when it sent a sane one (visible ASCII, 1 to
/// 128 bytes; copied, so the request's buffer is not held), else a new one. Kept as the header
/// value it is echoed in.
pub(crate) fn request_id(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| HeaderValue::from_str(v).ok())
        .unwrap_or_else(new_request_id)
}

/// 32 random hex digits (without `format!`, which costs more than the rest of the id), from
/// the per-thread generator.
fn new_request_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let n: u128 = rand::random();
    let mut id = [0u8; 32];
    for (pair, byte) in id.chunks_exact_mut(2).zip(n.to_be_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    // Hex digits are visible ASCII: never refused.
    HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("-"))
}

/// The client whose key the request presents (`None` when no key is configured); 401 for a
/// missing or unknown key.
pub(crate) fn identify(snap: &Snapshot, headers: &HeaderMap) -> Result<Option<Caller>, ProxyError> {
    snap.clients.identify(headers).map(|c| c.cloned())
}

pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), ProxyError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    // Compared as bytes: a value that is not text is no JSON type either.
    let value = ct.as_bytes();
    let end = memchr::memchr(b';', value).unwrap_or(value.len());
    let essence = value[..end].trim_ascii();
    let json_suffix =
        essence.len() >= 5 && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json");
    if essence.eq_ignore_ascii_case(b"application/json") || json_suffix {
        Ok(())
    } else {
        Err(ProxyError::UnsupportedContentType(Echo::new(
            &String::from_utf8_lossy(value),
        )))
    }
}

/// How long a client may take over a request's body: between two of its pieces (and from the
/// head to the first), and in all.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyTime {
    pub(crate) idle: Duration,
    pub(crate) total: Duration,
}

impl BodyTime {
    pub(crate) fn of(server: &crate::config::Server) -> BodyTime {
        BodyTime {
            idle: server.client.body_timeout,
            total: server.client.body_total_timeout,
        }
    }

    /// The next `piece` of a body read until `end` (its total time from the head on): within
    /// the idle time from now and by `end`, else [`ProxyError::BodyTimeout`]. A piece already
    /// here is taken without a timer being armed.
    pub(crate) async fn piece<T>(
        self,
        end: Instant,
        piece: impl std::future::Future<Output = T>,
    ) -> Result<T, ProxyError> {
        let due = end.min(Instant::now() + self.idle);
        tokio::time::timeout_at(due, piece).await.map_err(|_| {
            let total = due >= end;
            ProxyError::BodyTimeout {
                waited: if total { self.total } else { self.idle },
                total,
            }
        })
    }
}

/// The body, whole, within `limit` bytes and the time `time` allows; a body that stalls or
/// trickles past it is [`ProxyError::BodyTimeout`] (its answer closes the connection).
pub(crate) async fn read_body<B>(
    body: B,
    limit: usize,
    time: BodyTime,
    headers: &HeaderMap,
) -> Result<Bytes, ProxyError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| {
        if e.downcast_ref::<LengthLimitError>().is_some() {
            ProxyError::PayloadTooLarge { limit }
        } else {
            ProxyError::InvalidRequest(format!("failed to read the request body: {e}"))
        }
    };
    // Held once: a body of one piece as it came, a longer one gathered into a buffer made to
    // its declared size as the pieces come (each piece freed once copied).
    let mut body = std::pin::pin!(Limited::new(body, limit));
    let mut first: Option<Bytes> = None;
    let mut gathered: Option<BytesMut> = None;
    let end = Instant::now() + time.total;
    loop {
        let Some(frame) = time.piece(end, body.frame()).await? else {
            break;
        };
        let Ok(data) = frame.map_err(failed)?.into_data() else {
            continue;
        };
        match (&mut gathered, first.take()) {
            (Some(buf), _) => buf.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(one)) => {
                let size = declared.unwrap_or(0).max(one.len() + data.len());
                let mut buf = BytesMut::with_capacity(size);
                buf.extend_from_slice(&one);
                buf.extend_from_slice(&data);
                gathered = Some(buf);
            }
        }
    }
    Ok(gathered.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze))
}

/// The intake every model-routed endpoint shares after the client is identified
/// ([`identify`]): content type, the body within its size, time and nesting limits.
pub(crate) async fn routed_body<B>(
    snap: &Snapshot,
    headers: &HeaderMap,
    body: B,
) -> Result<Bytes, ProxyError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    check_content_type(headers)?;
    let server = &snap.config.server;
    let body = read_body(body, server.body_limit, BodyTime::of(server), headers).await?;
    within_limits(server, &body)?;
    Ok(body)
}

/// A body had whole (read, or a batch's line) held to what intake allows: at most
/// `body_limit_bytes`, nested no deeper than `json_depth_limit` — refused before any backend's
/// parser meets it (one may drop the connection on it).
pub(crate) fn within_limits(server: &crate::config::Server, body: &[u8]) -> Result<(), ProxyError> {
    if body.len() > server.body_limit {
        return Err(ProxyError::PayloadTooLarge {
            limit: server.body_limit,
        });
    }
    if switchboard_json::depth::deeper_than(body, server.client.json_depth_limit) {
        return Err(ProxyError::TooDeep {
            limit: server.client.json_depth_limit,
        });
    }
    Ok(())
}

/// The answer to the client: the error rendered in the API's envelope if there is one, the
/// record marked complete with its status, and the request id echoed.
pub(crate) fn respond(
    rec: &mut Record,
    adapter: &dyn Adapter,
    result: Result<Response, ProxyError>,
) -> Response {
    let mut resp = match result {
        Ok(resp) => resp,
        Err(e) => {
            rec.error = Some(e.to_string());
            if let Some(t) = rec.traced() {
                t.error_type(e.parts().3.unwrap_or("error"));
            }
            adapter.error_response(e)
        }
    };
    rec.status = resp.status().as_u16();
    rec.completed = true;
    resp.headers_mut()
        .insert(REQUEST_ID, rec.request_id.clone());
    resp
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with_type(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(ct).unwrap_or(HeaderValue::from_static("x")),
        );
        h
    }

    #[test]
    fn new_request_ids_are_32_random_hex_digits() {
        let (a, b) = (new_request_id(), new_request_id());
        assert_eq!(a.len(), 32);
        assert!(a
            .as_bytes()
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("client-id-1"));
        assert_eq!(request_id(&h), "client-id-1");
        h.insert(REQUEST_ID, HeaderValue::from_static(""));
        assert_eq!(request_id(&h).len(), 32);
        // Not visible ASCII, or too long: a new one.
        h.insert(REQUEST_ID, HeaderValue::from_bytes(b"id\xff").unwrap());
        assert_eq!(request_id(&h).len(), 32);
        h.insert(REQUEST_ID, HeaderValue::from_str(&"a".repeat(129)).unwrap());
        assert_eq!(request_id(&h).len(), 32);
        h.insert(REQUEST_ID, HeaderValue::from_str(&"a".repeat(128)).unwrap());
        assert_eq!(request_id(&h).len(), 128);
    }

    fn pieces(
        parts: &[&'static str],
    ) -> impl http_body::Body<Data = Bytes, Error = std::io::Error> {
        let frames = parts
            .iter()
            .map(|p| {
                Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(p.as_bytes())))
            })
            .collect::<Vec<_>>();
        http_body_util::StreamBody::new(futures_util::stream::iter(frames))
    }

    const T: BodyTime = BodyTime {
        idle: Duration::from_secs(2),
        total: Duration::from_secs(10),
    };

    /// A body that sends `parts`, each `gap` after the one before, then ends or (`stall`)
    /// sends nothing more.
    fn timed(
        parts: Vec<&'static str>,
        gap: Duration,
        stall: bool,
    ) -> impl http_body::Body<Data = Bytes, Error = std::io::Error> {
        use futures_util::StreamExt;
        let sent = futures_util::stream::iter(parts).then(move |p| async move {
            tokio::time::sleep(gap).await;
            Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(p.as_bytes())))
        });
        let tail = futures_util::stream::pending().take(usize::from(stall));
        http_body_util::StreamBody::new(sent.chain(tail))
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_cut_at_the_idle_limit() {
        let started = Instant::now();
        let body = timed(vec!["{\"mo"], Duration::from_millis(500), true);
        let r = read_body(body, 64, T, &HeaderMap::new()).await;
        assert!(
            matches!(r, Err(ProxyError::BodyTimeout { total: false, .. })),
            "{r:?}"
        );
        // The first piece after 0.5 s, then nothing for the idle limit.
        assert_eq!(started.elapsed(), Duration::from_millis(2500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_is_cut_at_the_total_limit() {
        let started = Instant::now();
        let body = timed(vec!["x"; 1000], Duration::from_millis(500), false);
        let r = read_body(body, 4096, T, &HeaderMap::new()).await;
        assert!(
            matches!(r, Err(ProxyError::BodyTimeout { total: true, .. })),
            "{r:?}"
        );
        assert_eq!(started.elapsed(), T.total);
        let e = ProxyError::BodyTimeout {
            waited: T.total,
            total: true,
        };
        assert_eq!(
            e.to_string(),
            "the request body was not received within 10s"
        );
        assert_eq!(e.parts().0.as_u16(), 408);
        let resp = axum::response::IntoResponse::into_response(e);
        assert_eq!(resp.headers()[header::CONNECTION], "close");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_within_both_limits_is_read_whole() {
        let body = timed(
            vec!["{", "\"a\"", ":", "1", "}"],
            Duration::from_millis(1900),
            false,
        );
        let r = read_body(body, 64, T, &HeaderMap::new()).await;
        assert_eq!(r.unwrap(), "{\"a\":1}");
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_one_buffer_within_its_limit() {
        let none = HeaderMap::new();
        let one = read_body(pieces(&["{\"a\":1}"]), 64, T, &none)
            .await
            .unwrap();
        assert_eq!(one, "{\"a\":1}");
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
        let many = read_body(pieces(&["{\"a\"", ":", "12}", "", "  "]), 64, T, &declared).await;
        assert_eq!(many.unwrap(), "{\"a\":12}  ");
        let over = read_body(pieces(&["0123456789", "0123456789"]), 15, T, &none).await;
        assert!(matches!(
            over,
            Err(ProxyError::PayloadTooLarge { limit: 15 })
        ));
        declared.insert(header::CONTENT_LENGTH, HeaderValue::from_static("16"));
        let said = read_body(pieces(&["x"]), 15, T, &declared).await;
        assert!(matches!(
            said,
            Err(ProxyError::PayloadTooLarge { limit: 15 })
        ));
    }

    #[test]
    fn json_content_types_are_accepted_and_others_refused() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/json ;charset=UTF-8",
            "application/vnd.api+json",
            "application/merge-patch+JSON",
        ] {
            assert!(check_content_type(&with_type(ok)).is_ok(), "{ok}");
        }
        assert!(
            check_content_type(&HeaderMap::new()).is_ok(),
            "no content type"
        );
        for bad in [
            "text/plain",
            "json",
            "+jso",
            "application/jsonx",
            "multipart/form-data",
        ] {
            assert!(check_content_type(&with_type(bad)).is_err(), "{bad}");
        }
        // A value that is not text is named in the error, not dropped.
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_bytes(b"application/json\xff").unwrap(),
        );
        match check_content_type(&h) {
            Err(ProxyError::UnsupportedContentType(ct)) => {
                assert_eq!(ct.to_string(), "application/json\u{fffd}")
            }
            other => panic!("{other:?}"),
        }
    }
}
