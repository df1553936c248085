//! The upstream exchange: header filtering, backend auth, send with a header timeout; a failure
//! told as an [`UpstreamError`], and the metric reasons of failures. [`Exchange`] is the seam
//! the pipeline's own tests answer through, without sockets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::StreamExt;
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use switchboard_wire::payload::Payload;

use crate::failure::UpstreamError;
use crate::hop;
use crate::watch::ConnWatch;
#[cfg(test)]
use crate::TooLong;
pub use crate::{read_all, read_within, Held};
use crate::{BodyStream, Client, Origin, SendError};

/// Anthropic-style clients send their key here instead of `Authorization`.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The client's headers as they go to the backend. `own_auth`: Switchboard checked the
/// client's key itself, so that key is not passed on. The fields `Connection` names are
/// removed; the fixed hop-by-hop ones are left out as the request is sent ([`send`]).
pub fn upstream_headers(mut headers: HeaderMap, backend: Origin<'_>, own_auth: bool) -> HeaderMap {
    hop::drop_named(&mut headers);
    if own_auth || backend.auth.is_some() {
        headers.remove(header::AUTHORIZATION);
        headers.remove(X_API_KEY);
    }
    if let Some(auth) = backend.auth {
        headers.insert(header::AUTHORIZATION, auth.clone());
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
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: BodyStream,
}

/// One request to a backend, as the pipeline hands it over.
pub struct Outbound<'a> {
    pub backend: Origin<'a>,
    /// What is learned of the backend's connections.
    pub watch: Option<&'a Arc<ConnWatch>>,
    pub path_and_query: &'a str,
    pub headers: HeaderMap,
    pub body: Payload,
    /// How long the answer's head may take, from the start.
    pub header_timeout: Duration,
}

/// Where a proxied request's exchange goes other than the pool: a backend scripted in the
/// pipeline's tests, so the choice of replicas, the attempt loop and the breaker run in paused
/// time with no socket. Served requests go to [`send`] directly (no boxed future on their way).
pub trait Exchange: Send + Sync + std::fmt::Debug {
    fn post<'a>(&'a self, to: Outbound<'a>) -> BoxFuture<'a, Result<Answer, UpstreamError>>;
}

/// POST `to.body` to `to.backend` at its path; a failure says where it failed and whether a
/// byte of the request may have reached the backend ([`UpstreamError`]).
/// The client leaves the hop-by-hop fields out as it writes the request's head and reads the
/// answer's; `Connection` and the fields it names stay in the answer's map
/// ([`client_headers`]). A failed TLS handshake is a connect failure with its reason.
pub async fn send(client: &Client, to: Outbound<'_>) -> Result<Answer, UpstreamError> {
    let Outbound {
        backend,
        watch,
        path_and_query,
        headers,
        body,
        header_timeout,
    } = to;
    let started = Instant::now();
    let path = backend.path(path_and_query);
    let mut reached = false;
    // The pool is called here, not through `Client::post`: one future less on the way of
    // every proxied request.
    let failed = match client.tls_for(backend) {
        Err(e) => e,
        Ok(tls) => {
            let to = backend.target(tls.as_deref(), watch);
            let sent = client.pool().post(to, &path, headers, body, &mut reached);
            let outcome = tokio::time::timeout(header_timeout, sent).await;
            match outcome {
                Ok(Ok(r)) => {
                    return Ok(Answer {
                        status: r.status,
                        headers: r.headers,
                        body: r.body.boxed(),
                    })
                }
                Ok(Err(e)) => e,
                Err(_) => SendError::Timeout,
            }
        }
    };
    Err(UpstreamError::unanswered(
        backend.name,
        failed,
        reached,
        started.elapsed(),
    ))
}

/// Seconds a client should wait before retrying a loading backend.
pub fn retry_after(headers: &HeaderMap) -> u64 {
    retry_after_s(headers).unwrap_or(5)
}

/// The seconds of an answer's `Retry-After`, when it has them.
pub fn retry_after_s(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BoxError;
    use bytes::Bytes;

    fn backend(key: Option<&HeaderValue>) -> Origin<'_> {
        Origin {
            name: "b",
            authority: "127.0.0.1:1",
            path_prefix: "",
            tls: false,
            connect: Some(Duration::from_secs(1)),
            auth: key,
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
        let out = upstream_headers(h.clone(), backend(None), false);
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
        let key = HeaderValue::from_static("Bearer backend-key");
        let out = upstream_headers(h.clone(), backend(Some(&key)), false);
        assert_eq!(
            out.get(header::AUTHORIZATION).unwrap(),
            "Bearer backend-key"
        );
        let out = upstream_headers(h.clone(), backend(None), true);
        assert!(out.get(header::AUTHORIZATION).is_none());
    }

    fn chunks(parts: Vec<Result<&'static str, &'static str>>) -> BodyStream {
        futures_util::stream::iter(
            parts
                .into_iter()
                .map(|p| p.map(Bytes::from).map_err(BoxError::from)),
        )
        .boxed()
    }

    #[tokio::test]
    async fn read_all_joins_chunks_and_keeps_a_single_one_as_it_is() {
        assert_eq!(read_all(chunks(vec![]), 16).await.unwrap(), "");
        let one = read_all(chunks(vec![Ok("{\"a\":1}")]), 16).await.unwrap();
        assert_eq!(one, "{\"a\":1}");
        let three = read_all(chunks(vec![Ok("ab"), Ok("c"), Ok("def")]), 16).await;
        assert_eq!(three.unwrap(), "abcdef");
        for broken in [
            vec![Err("cut")],
            vec![Ok("ab"), Err("cut")],
            vec![Ok("ab"), Ok("c"), Err("cut"), Ok("never")],
        ] {
            let e = read_all(chunks(broken), 16).await.unwrap_err();
            assert_eq!(e.to_string(), "cut");
        }
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_held_no_further_and_relayed_whole() {
        let exact = read_within(chunks(vec![Ok("abc"), Ok("def")]), 6)
            .await
            .unwrap();
        assert!(matches!(exact, Held::Whole(b) if b == "abcdef"));
        for parts in [
            vec![Ok("abcdefg")],
            vec![Ok("abc"), Ok("defg"), Ok("hij")],
            vec![Ok("ab"), Ok("cd"), Ok("ef"), Ok("gh")],
        ] {
            let all: String = parts.iter().map(|p| p.unwrap()).collect();
            let Held::Over(rest) = read_within(chunks(parts), 6).await.unwrap() else {
                panic!("held past the limit");
            };
            let got: Vec<Bytes> = rest.map(Result::unwrap).collect().await;
            assert_eq!(got.concat(), all.as_bytes());
        }
        let e = read_all(chunks(vec![Ok("abc"), Ok("defg")]), 6)
            .await
            .unwrap_err();
        assert!(e.downcast_ref::<TooLong>().is_some(), "{e}");
    }
}
