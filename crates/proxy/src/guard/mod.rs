//! The context guard: the free bound first, an exact count only when the bound cannot clear.

mod api;
pub mod canonical;
pub(crate) mod count;
mod endpoints;

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::{Alias, GuardConfig, MediaCosts};
use crate::error::{bounded, ProxyError};
use crate::tokens::bound::{PromptView, ViewError};
use crate::tokens::gate::CountGate;
use crate::tokens::{CountError, Counter, CounterError, Fallback, Method};
use crate::wire::payload::apply_edits;
use crate::wire::request::span_of;

pub use api::{check_counted, check_request, clamp_request, raw_bound, Counted};
pub use endpoints::count_response;

/// One alias's guard settings (config keys `context_window`, `count`, `tokenizer`,
/// `media_tokens`, `clamp_max_tokens`).
#[derive(Clone)]
pub struct GuardSpec {
    /// Tokens per conversation (per slot): prompt plus requested output must fit.
    pub window: u32,
    pub counter: Arc<Counter>,
    pub media: MediaCosts,
    /// Lower an over-large `max_tokens` to fit instead of rejecting, when the prompt fits.
    pub(crate) clamp_max_tokens: bool,
    /// The turns and byte limit every count of the server shares.
    pub(crate) gate: Arc<CountGate>,
}

impl GuardSpec {
    /// The guard of `alias` over `window` tokens, its counter built: this loads the tokenizer
    /// of a local count.
    pub(crate) fn build(
        cfg: &GuardConfig,
        window: u32,
        alias: &Alias,
        gate: Arc<CountGate>,
    ) -> Result<GuardSpec, CounterError> {
        let backend = &alias.backend;
        let mut counter = Counter::new(
            Some(cfg.count),
            cfg.tokenizer.as_ref(),
            backend.flavor,
            &backend.url,
            &alias.upstream_model,
        )?;
        counter.identify_backend(&backend.name, backend.api_key.as_ref());
        Ok(GuardSpec {
            window,
            counter: Arc::new(counter),
            media: cfg.media,
            clamp_max_tokens: cfg.clamp_max_tokens,
            gate,
        })
    }

    /// A guard over a built counter, default media costs, and a gate of its own with no byte
    /// limit (tests, benches, CLI).
    pub fn with_counter(counter: Arc<Counter>, window: u32, clamp_max_tokens: bool) -> GuardSpec {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        GuardSpec {
            window,
            counter,
            media: MediaCosts::default(),
            clamp_max_tokens,
            gate: Arc::new(CountGate::unlimited(cores)),
        }
    }
}

impl std::fmt::Debug for GuardSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardSpec")
            .field("window", &self.window)
            .field("method", &self.counter.kind())
            .field("media", &self.media)
            .field("clamp_max_tokens", &self.clamp_max_tokens)
            .finish()
    }
}

/// What the guard decided about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward as is.
    Pass { method: Method },
    /// Forward with the output limit lowered to `max_tokens` (see [`clamp_body`]).
    Clamp { max_tokens: u32, method: Method },
    /// Answer OpenAI's context-length 400 without contacting the backend.
    Over {
        prompt: u32,
        completion: Option<u32>,
        method: Method,
        estimate: bool,
    },
}

impl Verdict {
    pub(crate) fn method(&self) -> Method {
        match *self {
            Verdict::Pass { method }
            | Verdict::Clamp { method, .. }
            | Verdict::Over { method, .. } => method,
        }
    }

    /// `Over` → [`ProxyError::ContextLengthExceeded`]; the others → `None`.
    pub fn into_error(self, window: u32) -> Option<ProxyError> {
        match self {
            Verdict::Over {
                prompt,
                completion,
                estimate,
                ..
            } => Some(ProxyError::ContextLengthExceeded {
                window,
                prompt,
                completion,
                estimate,
            }),
            _ => None,
        }
    }
}

/// What the guard decided, and why its count was made another way, if it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    pub verdict: Verdict,
    pub(crate) fallback: Option<Fallback>,
    /// The prompt's tokens where they were counted (`None`: the byte bound decided).
    pub(crate) prompt: Option<u32>,
}

/// Bound first, exact count only when the bound cannot clear. Errors only for a malformed
/// body (invalid JSON, messages, or token limits) or a counting failure.
///
/// The request fits when prompt + requested output ≤ window, the requested output being
/// `max_completion_tokens` or `max_tokens`; without either, when the prompt alone is below
/// the window (a prompt that fills the window leaves no room to answer).
pub async fn check(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
) -> Result<Verdict, ProxyError> {
    check_chat(spec, client, body, None)
        .await
        .map(|c| c.verdict)
}

/// [`check`], with the fallback the count took; `who`: the client asking, if any.
pub(crate) async fn check_chat(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
    who: Option<u64>,
) -> Result<Checked, ProxyError> {
    let view = PromptView::parse(body).map_err(view_error)?;
    let output = view.requested_output();
    if fits(view.prompt_bound(&spec.media), output, spec.window) {
        return Ok(Checked {
            verdict: Verdict::Pass {
                method: Method::Bound,
            },
            fallback: None,
            prompt: None,
        });
    }
    let chat = bytes::Bytes::copy_from_slice(body);
    counted(
        spec,
        output,
        count::count(spec, client, chat, count::Use::Guard, who).await?,
    )
}

/// The verdict on a counted prompt.
fn counted(spec: &GuardSpec, output: Option<u32>, c: count::Count) -> Result<Checked, ProxyError> {
    Ok(Checked {
        verdict: decide(
            c.tokens,
            output,
            spec.window,
            spec.clamp_max_tokens,
            c.method,
        ),
        fallback: c.fallback,
        prompt: Some(c.tokens),
    })
}

/// The verdict for a counted prompt.
pub(crate) fn decide(
    prompt: u32,
    output: Option<u32>,
    window: u32,
    clamp: bool,
    method: Method,
) -> Verdict {
    if fits(u64::from(prompt), output, window) {
        Verdict::Pass { method }
    } else if clamp && output.is_some() && prompt < window {
        Verdict::Clamp {
            max_tokens: window - prompt,
            method,
        }
    } else {
        Verdict::Over {
            prompt,
            completion: output,
            method,
            estimate: method == Method::Estimate,
        }
    }
}

fn fits(prompt: u64, output: Option<u32>, window: u32) -> bool {
    match output {
        Some(out) => prompt + u64::from(out) <= u64::from(window),
        None => prompt < u64::from(window),
    }
}

#[derive(Deserialize)]
struct Limits<'a> {
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
}

/// Rewrites whichever of `max_completion_tokens` / `max_tokens` the client sent (both when
/// both were sent) to `max_tokens`, leaving every other byte of the body as it was.
pub fn clamp_body(body: &[u8], max_tokens: u32) -> Result<Vec<u8>, ProxyError> {
    let limits: Limits =
        serde_json::from_slice(body).map_err(|e| ProxyError::InvalidJson(bounded(e)))?;
    let value = max_tokens.to_string().into_bytes();
    let edits = [limits.max_tokens, limits.max_completion_tokens]
        .into_iter()
        .flatten()
        .map(|raw| (span_of(body, raw), value.clone()))
        .collect();
    Ok(apply_edits(body, edits))
}

pub(crate) fn view_error(e: ViewError) -> ProxyError {
    match e {
        ViewError::Json(m) => ProxyError::InvalidJson(m),
        ViewError::Messages => ProxyError::InvalidRequest(e.to_string()),
        ViewError::Param { param, message } => ProxyError::InvalidParam { param, message },
    }
}

/// How a counting failure reaches the client.
pub fn count_error(e: CountError) -> ProxyError {
    match e {
        CountError::Invalid(_)
        | CountError::Refused(_)
        | CountError::Template(_)
        | CountError::Budget(_)
        | CountError::Tokenizer(_) => ProxyError::InvalidRequest(e.to_string()),
        CountError::TooLarge { bytes, limit } => ProxyError::CountTooLarge { bytes, limit },
        CountError::Busy { running, waited } => ProxyError::CountBusy { running, waited },
        // The backend refused the request itself (a bad message); its auth failing is ours.
        CountError::Backend {
            status: Some(status),
            detail,
            ..
        } if (400..500).contains(&status) && status != 401 && status != 403 => {
            ProxyError::InvalidRequest(detail)
        }
        CountError::Backend {
            backend,
            status,
            detail,
        } => match status {
            None => ProxyError::UpstreamConnect { backend },
            Some(_) => ProxyError::UpstreamProtocol { backend, detail },
        },
        CountError::Task(detail) => ProxyError::UpstreamProtocol {
            backend: "token counter".into(),
            detail,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn decide_follows_the_window_rules() {
        let m = Method::Local;
        assert_eq!(
            decide(90, Some(10), 100, false, m),
            Verdict::Pass { method: m }
        );
        assert_eq!(
            decide(91, Some(10), 100, false, m),
            Verdict::Over {
                prompt: 91,
                completion: Some(10),
                method: m,
                estimate: false
            }
        );
        assert_eq!(decide(99, None, 100, false, m), Verdict::Pass { method: m });
        assert_eq!(
            decide(100, None, 100, true, m),
            Verdict::Over {
                prompt: 100,
                completion: None,
                method: m,
                estimate: false
            }
        );
        assert_eq!(
            decide(91, Some(50), 100, true, m),
            Verdict::Clamp {
                max_tokens: 9,
                method: m
            }
        );
        assert_eq!(
            decide(100, Some(50), 100, true, Method::Estimate),
            Verdict::Over {
                prompt: 100,
                completion: Some(50),
                method: Method::Estimate,
                estimate: true
            }
        );
    }

    #[test]
    fn over_renders_openai_error() {
        let v = Verdict::Over {
            prompt: 7554,
            completion: Some(1000),
            method: Method::Local,
            estimate: false,
        };
        let e = v.into_error(8192).unwrap();
        let (status, _, _, code) = e.parts();
        assert_eq!(status.as_u16(), 400);
        assert_eq!(code, Some("context_length_exceeded"));
        assert!(e.to_string().starts_with("This model's maximum context length is 8192 tokens. However, you requested 8554 tokens"));
        assert!(Verdict::Pass {
            method: Method::Bound
        }
        .into_error(1)
        .is_none());
    }

    #[test]
    fn counting_failures_map_to_client_or_upstream_errors() {
        let code = |e: CountError| count_error(e).parts().3;
        assert_eq!(
            code(CountError::Template("boom".into())),
            Some("invalid_request")
        );
        assert_eq!(
            code(CountError::Invalid("no role".into())),
            Some("invalid_request")
        );
        let backend = |status| CountError::Backend {
            backend: "gpu-box".into(),
            status,
            detail: "x".into(),
        };
        assert_eq!(code(backend(Some(400))), Some("invalid_request"));
        assert_eq!(code(backend(Some(401))), Some("bad_gateway"));
        let e = count_error(backend(Some(500)));
        assert_eq!(e.parts().3, Some("bad_gateway"));
        assert!(e.to_string().contains("gpu-box"), "{e}");
        assert!(matches!(
            count_error(backend(None)),
            ProxyError::UpstreamConnect { .. }
        ));
    }

    #[test]
    fn clamp_rewrites_only_the_limits() {
        let body = br#"{"model":"m", "max_tokens" : 5000,"messages":[{"role":"user","content":"max_tokens: 5000"}],"max_completion_tokens":6000}"#;
        let out = clamp_body(body, 123).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"model":"m", "max_tokens" : 123,"messages":[{"role":"user","content":"max_tokens: 5000"}],"max_completion_tokens":123}"#
        );
        let only = br#"{"max_tokens":null,"max_completion_tokens":9}"#;
        assert_eq!(
            clamp_body(only, 1).unwrap(),
            br#"{"max_tokens":null,"max_completion_tokens":1}"#
        );
        assert!(clamp_body(b"{", 1).is_err());
    }
}
