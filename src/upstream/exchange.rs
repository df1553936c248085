//! The upstream exchange: header filtering, backend auth, send with a header timeout, error mapping.

use std::time::{Duration, Instant};

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt, TryStreamExt};
use prometheus_client::encoding::EncodeLabelValue;

use crate::config::Backend;
use crate::error::ProxyError;
use crate::upstream::hop;
use crate::upstream::{BoxError, Pool, SendError};

/// Why an upstream exchange failed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum UpstreamReason {
    connect,
    timeout,
    status_5xx,
    stream_broken,
}

/// The metric reason of an error [`send`] returned.
pub fn reason_of(e: &ProxyError) -> Option<UpstreamReason> {
    match e {
        ProxyError::UpstreamConnect { .. } | ProxyError::UpstreamProtocol { .. } => {
            Some(UpstreamReason::connect)
        }
        ProxyError::UpstreamTimeout { .. } => Some(UpstreamReason::timeout),
        _ => None,
    }
}

/// Anthropic-style clients send their key here instead of `Authorization`.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The client's headers as they go to the backend. `own_auth`: Switchboard checked the
/// client's key itself, so that key is not passed on. The fields `Connection` names are
/// removed; the fixed hop-by-hop ones are left out as the request is sent ([`send`]).
pub fn upstream_headers(mut headers: HeaderMap, backend: &Backend, own_auth: bool) -> HeaderMap {
    hop::drop_named(&mut headers);
    if own_auth || backend.api_key.is_some() {
        headers.remove(header::AUTHORIZATION);
        headers.remove(X_API_KEY);
    }
    if let Some(key) = &backend.api_key {
        if let Ok(mut v) = HeaderValue::from_str(&format!("Bearer {key}")) {
            v.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, v);
        }
    }
    if !headers.contains_key(header::CONTENT_TYPE) {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    headers
}

/// The backend's response headers as they go to the client: without `Connection` and the
/// fields it names. The other hop-by-hop fields were left out as the answer was received
/// ([`send`]).
pub fn client_headers(mut upstream: HeaderMap) -> HeaderMap {
    hop::drop_connection(&mut upstream);
    upstream
}

/// A backend's answer: status, headers and the body as a stream of chunks.
pub struct Answer {
    pub status: reqwest::StatusCode,
    pub headers: HeaderMap,
    pub body: BoxStream<'static, Result<Bytes, BoxError>>,
}

/// The whole body of an answer (a body that came in one piece is not copied).
pub async fn read_all<S>(mut body: S) -> Result<Bytes, BoxError>
where
    S: futures_util::Stream<Item = Result<Bytes, BoxError>> + Unpin,
{
    let Some(first) = body.next().await.transpose()? else {
        return Ok(Bytes::new());
    };
    let Some(second) = body.next().await.transpose()? else {
        return Ok(first);
    };
    let mut out = bytes::BytesMut::with_capacity(first.len() + second.len());
    out.extend_from_slice(&first);
    out.extend_from_slice(&second);
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out.freeze())
}

/// POST `body` to `backend` at `path_and_query`; errors mapped to what the client is told.
/// Plain-http backends go through the in-task pool, which leaves the hop-by-hop fields out as
/// it writes the request's head and reads the answer's; https ones through reqwest, which is
/// handed the request's map without them and whose answer's map is cleared of them here.
/// `Connection` and the fields it names stay in the answer's map ([`client_headers`]).
#[allow(clippy::too_many_arguments)]
pub async fn send(
    pool: &Arc<Pool>,
    client: &reqwest::Client,
    backend: &Backend,
    path_and_query: &str,
    mut headers: HeaderMap,
    body: Bytes,
    header_timeout: Duration,
) -> Result<Answer, ProxyError> {
    let started = Instant::now();
    let timed_out = || ProxyError::UpstreamTimeout {
        backend: backend.name.clone(),
        elapsed: started.elapsed(),
    };
    let connect = || ProxyError::UpstreamConnect {
        backend: backend.name.clone(),
    };
    if let Some(authority) = &backend.authority {
        let path = if backend.path_prefix.is_empty() {
            std::borrow::Cow::Borrowed(path_and_query)
        } else {
            std::borrow::Cow::Owned(format!("{}{}", backend.path_prefix, path_and_query))
        };
        let sent = pool.post(authority, &path, headers, body);
        return match tokio::time::timeout(header_timeout, sent).await {
            Ok(Ok(r)) => Ok(Answer {
                status: r.status,
                headers: r.headers,
                body: r.body.boxed(),
            }),
            Ok(Err(SendError::Connect(_))) => Err(connect()),
            Ok(Err(SendError::Protocol(detail))) => Err(ProxyError::UpstreamProtocol {
                backend: backend.name.clone(),
                detail,
            }),
            Err(_) => Err(timed_out()),
        };
    }
    hop::drop_request(&mut headers);
    let url = format!("{}{}", backend.url, path_and_query);
    let req = client.post(url).headers(headers).body(body);
    match tokio::time::timeout(header_timeout, req.send()).await {
        Ok(Ok(mut resp)) => {
            // The map is taken, not copied: the body stream needs nothing else of it.
            let mut headers = std::mem::take(resp.headers_mut());
            hop::drop_response(&mut headers);
            Ok(Answer {
                status: resp.status(),
                headers,
                body: resp
                    .bytes_stream()
                    .map_err(|e| BoxError::from(without_url(&e)))
                    .boxed(),
            })
        }
        Ok(Err(e)) if e.is_connect() => Err(connect()),
        Ok(Err(e)) if e.is_timeout() => Err(timed_out()),
        Ok(Err(e)) => Err(ProxyError::UpstreamProtocol {
            backend: backend.name.clone(),
            detail: without_url(&e),
        }),
        Err(_) => Err(timed_out()),
    }
}

/// A reqwest error's text without the URL (which would leak the backend's address to clients).
pub fn without_url(e: &reqwest::Error) -> String {
    let mut s = String::new();
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(err) = source {
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&err.to_string());
        source = err.source();
    }
    if s.is_empty() {
        s = "request failed".into();
    }
    s
}

/// Seconds a client should wait before retrying a loading backend.
pub fn retry_after(headers: &HeaderMap) -> u64 {
    headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn backend(key: Option<&str>) -> Backend {
        Backend {
            name: "b".into(),
            url: "http://127.0.0.1:1".into(),
            flavor: crate::flavor::Flavor::Llamacpp,
            authority: Some("127.0.0.1:1".into()),
            path_prefix: String::new(),
            slots: NonZeroU32::MIN,
            queue: 1,
            api_key: key.map(String::from),
            apis: crate::config::Apis::default_for(crate::flavor::Flavor::Llamacpp),
        }
    }

    #[test]
    fn drops_what_connection_names_and_replaces_auth() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer client"),
        );
        h.insert(
            hop::PROXY_CONNECTION,
            HeaderValue::from_static("keep-alive"),
        );
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        let out = upstream_headers(h.clone(), &backend(None), false);
        assert!(out.get("x-secret-hop").is_none());
        // The fixed hop-by-hop fields are left out as the request is written.
        assert!(out.contains_key(header::CONNECTION) && out.contains_key(hop::PROXY_CONNECTION));
        assert_eq!(out.get(header::AUTHORIZATION).unwrap(), "Bearer client");
        assert_eq!(out.get("x-request-id").unwrap(), "abc");
        assert_eq!(out.get(header::CONTENT_TYPE).unwrap(), "application/json");
        // The answer's other hop-by-hop fields are left out as it is received.
        let answer = client_headers(h.clone());
        assert!(answer.get("x-secret-hop").is_none());
        assert!(answer.get(header::CONNECTION).is_none());
        let out = upstream_headers(h.clone(), &backend(Some("backend-key")), false);
        assert_eq!(
            out.get(header::AUTHORIZATION).unwrap(),
            "Bearer backend-key"
        );
        let out = upstream_headers(h.clone(), &backend(None), true);
        assert!(out.get(header::AUTHORIZATION).is_none());
    }

    fn chunks(
        parts: Vec<Result<&'static str, &'static str>>,
    ) -> BoxStream<'static, Result<Bytes, BoxError>> {
        futures_util::stream::iter(
            parts
                .into_iter()
                .map(|p| p.map(Bytes::from).map_err(BoxError::from)),
        )
        .boxed()
    }

    #[tokio::test]
    async fn read_all_joins_chunks_and_keeps_a_single_one_as_it_is() {
        assert_eq!(read_all(chunks(vec![])).await.unwrap(), "");
        let one = read_all(chunks(vec![Ok("{\"a\":1}")])).await.unwrap();
        assert_eq!(one, "{\"a\":1}");
        let three = read_all(chunks(vec![Ok("ab"), Ok("c"), Ok("def")])).await;
        assert_eq!(three.unwrap(), "abcdef");
        for broken in [
            vec![Err("cut")],
            vec![Ok("ab"), Err("cut")],
            vec![Ok("ab"), Ok("c"), Err("cut"), Ok("never")],
        ] {
            let e = read_all(chunks(broken)).await.unwrap_err();
            assert_eq!(e.to_string(), "cut");
        }
    }
}
