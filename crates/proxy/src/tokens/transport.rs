//! The upstream client as the transport of backend token counting (`backend.rs`): the bridge
//! between the two stays here, so the upstream crate knows nothing of counting.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, HeaderMap, HeaderValue};

use super::backend::{CountTarget, Transport, TransportError};
use crate::upstream::{chain, read_all, Client, Origin, SMALL_ANSWER_LIMIT};

impl Transport for Client {
    fn post_json<'a>(
        &'a self,
        to: &'a CountTarget,
        path: &'a str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(u16, Bytes), TransportError>> {
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            let origin = Origin {
                name: &to.name,
                authority: &to.authority,
                path_prefix: &to.path_prefix,
                tls: to.tls,
                connect: None,
                auth: to.authorization.as_ref(),
            };
            let exchange = async {
                let resp = self
                    .post(origin, path, headers, body.into())
                    .await
                    .map_err(|e| TransportError::Failed(e.to_string()))?;
                let status = resp.status.as_u16();
                let text = read_all(resp.body, SMALL_ANSWER_LIMIT)
                    .await
                    .map_err(|e| TransportError::Failed(chain(e.as_ref())))?;
                Ok((status, text))
            };
            tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| TransportError::TimedOut(timeout))?
        })
    }
}
