//! Token counting strategies: free byte bound, local tokenizer and template, backend, estimate.

pub(crate) mod backend;
pub mod bound;
pub(crate) mod cache;
pub(crate) mod chunk;
pub(crate) mod estimate;
pub(crate) mod gate;
pub(crate) mod json;
pub mod local;
pub(crate) mod preprocess;
pub(crate) mod special;
pub(crate) mod template;
pub(crate) mod tojson;
mod transport;

use std::sync::Arc;

use crate::config::{CountKind, MediaCosts, TokenizerFiles};
use crate::flavor::Flavor;
use backend::BackendCounter;
pub use backend::{SetupError, TransportError};
use estimate::Estimator;
use local::{LoadError, LocalCounter};

/// How a prompt's token count was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// The free byte bound cleared the request; nothing was tokenized.
    Bound,
    /// The model's tokenizer and chat template, in process.
    Local,
    /// The backend's own tokenize endpoints.
    Backend,
    /// A bytes-per-token estimate.
    Estimate,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Bound => "bound",
            Method::Local => "local",
            Method::Backend => "backend",
            Method::Estimate => "estimate",
        }
    }
}

/// Why a count was made another way than the alias's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// The local template engine failed on a request the backend may take.
    Template,
    /// More text to count than `server.count_limit_bytes`.
    TooLarge,
    /// No turn to count within `server.count_queue_timeout_ms`.
    Busy,
}

/// Why a count could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// The request is not a chat request the backend would accept.
    #[error("{0}")]
    Invalid(String),
    /// The chat template refused the request with its own `raise_exception`.
    #[error("chat template refused the request: {0}")]
    Refused(String),
    /// The template engine failed on this request (an undefined value, say) where the
    /// backend's engine may not: the request is counted another way (see [`Fallback`]).
    #[error("chat template failed: {0}")]
    Template(String),
    /// The render went past its steps, output or time ([`template::Budget`]) on this request.
    #[error("the chat template exceeded its render budget ({0}) on this request")]
    Budget(template::Budget),
    /// More text not counted yet than `server.count_limit_bytes` allows.
    #[error("the request has {bytes} bytes of prompt text to count, more than server.count_limit_bytes ({limit})")]
    TooLarge { bytes: usize, limit: usize },
    /// No turn to count came within `server.count_queue_timeout_ms`.
    #[error("{running} token counts are running and no turn came within {waited:?} (server.count_concurrency, server.count_queue_timeout_ms)")]
    Busy {
        running: usize,
        waited: std::time::Duration,
    },
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
    /// The backend's tokenize endpoints failed; `status` when it answered.
    #[error("token counting at {backend} failed: {detail}")]
    Backend {
        /// The backend's config name (never its address).
        backend: String,
        status: Option<u16>,
        detail: String,
    },
    #[error("token counting task failed: {0}")]
    Task(String),
}

/// Why an alias's counter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    #[error("count = \"local\" needs tokenizer = {{ file, config }} (tokenizer.json and tokenizer_config.json)")]
    NoTokenizer,
    #[error(transparent)]
    Local(#[from] LoadError),
    #[error(transparent)]
    Backend(#[from] SetupError),
}

/// Counts prompt tokens for one alias. Cheap to share in an `Arc`.
pub struct Counter {
    inner: Inner,
    /// The backend's own count, for a request the local template cannot render (local
    /// counting only; `None` where the backend's flavour has no tokenize endpoints).
    spare: Option<BackendCounter>,
    /// The estimate, for a request that cannot be counted otherwise.
    estimate: Estimator,
}

enum Inner {
    Local(Arc<LocalCounter>),
    Backend(BackendCounter),
    Estimate(Estimator),
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter")
            .field("method", &self.kind())
            .finish()
    }
}

impl Counter {
    /// Built at config validation. `kind` `None` means local when a tokenizer is given, else
    /// estimate. The error names what is wrong (missing file, template fails to compile, ...).
    pub fn new(
        kind: Option<CountKind>,
        tokenizer: Option<&TokenizerFiles>,
        flavor: Flavor,
        backend_url: &str,
        upstream_model: &str,
    ) -> Result<Counter, CounterError> {
        let kind = kind.unwrap_or(if tokenizer.is_some() {
            CountKind::Local
        } else {
            CountKind::Estimate
        });
        let mut spare = None;
        let inner = match kind {
            CountKind::Local => {
                let files = tokenizer.ok_or(CounterError::NoTokenizer)?;
                // A runtime with no tokenize endpoint has no spare.
                spare = BackendCounter::new(flavor, backend_url, upstream_model).ok();
                Inner::Local(Arc::new(LocalCounter::load(files, flavor)?))
            }
            CountKind::Backend => {
                Inner::Backend(BackendCounter::new(flavor, backend_url, upstream_model)?)
            }
            CountKind::Estimate => Inner::Estimate(Estimator::new()),
        };
        Ok(Counter {
            inner,
            spare,
            estimate: Estimator::new(),
        })
    }

    /// Name the backend in errors and authenticate with its key (backend counting, and the
    /// backend count a local counter falls back to).
    pub(crate) fn identify_backend(
        &mut self,
        name: &str,
        authorization: Option<&http::HeaderValue>,
    ) {
        if let Inner::Backend(b) = &mut self.inner {
            b.identify(name, authorization);
        }
        if let Some(b) = &mut self.spare {
            b.identify(name, authorization);
        }
    }

    /// A local counter over an already loaded tokenizer and template (tests, benches, CLI).
    pub fn from_local(local: LocalCounter) -> Counter {
        Counter {
            inner: Inner::Local(Arc::new(local)),
            spare: None,
            estimate: Estimator::new(),
        }
    }

    pub fn kind(&self) -> Method {
        match self.inner {
            Inner::Local(_) => Method::Local,
            Inner::Backend(_) => Method::Backend,
            Inner::Estimate(_) => Method::Estimate,
        }
    }

    /// The local counter, when this alias counts locally.
    pub fn local(&self) -> Option<&LocalCounter> {
        match &self.inner {
            Inner::Local(l) => Some(l),
            _ => None,
        }
    }

    /// Exact (or estimated) prompt token count of a chat request body (JSON bytes, `model`
    /// already rewritten), media parts costed by `media`. Local counting runs on the
    /// blocking pool (and its fragments on rayon), never on the async workers.
    pub async fn count_prompt(
        &self,
        client: &dyn crate::tokens::backend::Transport,
        body: &[u8],
        media: &MediaCosts,
    ) -> Result<u32, CountError> {
        let body = bytes::Bytes::copy_from_slice(body);
        self.count_within(client, body, media, usize::MAX).await
    }

    /// [`Self::count_prompt`] refusing with [`CountError::TooLarge`] past `limit` bytes to
    /// count: of prompt text not in the fragment cache (local counting), of body (backend
    /// counting). The estimate has no limit (it reads the body once).
    pub(crate) async fn count_within(
        &self,
        client: &dyn crate::tokens::backend::Transport,
        body: bytes::Bytes,
        media: &MediaCosts,
        limit: usize,
    ) -> Result<u32, CountError> {
        match &self.inner {
            Inner::Local(local) => {
                let local = Arc::clone(local);
                let media = *media;
                tokio::task::spawn_blocking(move || local.count_within(&body, &media, limit))
                    .await
                    .map_err(|e| CountError::Task(e.to_string()))?
            }
            Inner::Backend(_) if body.len() > limit => Err(CountError::TooLarge {
                bytes: body.len(),
                limit,
            }),
            Inner::Backend(b) => b.count(client, &body, media).await,
            Inner::Estimate(e) => e.count(&body, media),
        }
    }

    /// The backend's own count, where a local counter has one to fall back to.
    pub(crate) async fn count_spare(
        &self,
        client: &dyn crate::tokens::backend::Transport,
        body: &[u8],
        media: &MediaCosts,
    ) -> Option<Result<u32, CountError>> {
        match &self.spare {
            Some(b) => Some(b.count(client, body, media).await),
            None => None,
        }
    }

    /// The estimate of a body (what every fallback ends in).
    pub(crate) fn estimate(&self, body: &[u8], media: &MediaCosts) -> Result<u32, CountError> {
        match &self.inner {
            Inner::Estimate(e) => e.count(body, media),
            _ => self.estimate.count(body, media),
        }
    }

    /// Feeds back what the backend reported for a request: `prompt_bytes` as measured by
    /// [`prompt_bytes`] on the forwarded body, `prompt_tokens` from `usage.prompt_tokens`.
    /// Only the estimator learns from it.
    pub(crate) fn observe(&self, prompt_bytes: usize, prompt_tokens: u32) {
        if let Inner::Estimate(e) = &self.inner {
            e.observe(prompt_bytes, prompt_tokens);
        }
    }
}

/// The measure the estimator learns from: bytes of the string values under `messages` and
/// `tools`, media parts excluded (the body length when the body is not a chat request).
pub(crate) fn prompt_bytes(body: &[u8]) -> usize {
    estimate::text_bytes(body).unwrap_or(body.len())
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_is_shareable_and_methods_label() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Counter>();
        let labels: Vec<&str> = [
            Method::Bound,
            Method::Local,
            Method::Backend,
            Method::Estimate,
        ]
        .iter()
        .map(|m| m.as_str())
        .collect();
        assert_eq!(labels, ["bound", "local", "backend", "estimate"]);
    }
}
