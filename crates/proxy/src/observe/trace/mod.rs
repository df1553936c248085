//! Traces: a server span for each model-routed request and a client span for each attempt at
//! a backend, named and attributed by the OpenTelemetry GenAI conventions, continuing the
//! client's W3C trace context and handing the attempt's on to the backend; exported over OTLP.
//! Off (no tracer, nothing read or sent) while `[tracing]` names no endpoint.

mod export;
pub(crate) mod names;
mod span;

use std::sync::Arc;
use std::time::Instant;

use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Tracer as _, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{ParentBasedSampler, Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub(crate) use span::{Attempt, End, RequestTrace};

use crate::config::Tracing;
use crate::observe::metrics::SpansDropped;
use crate::wire::Endpoint;

/// The tracer of one `[tracing]` setting: its provider (sampler, resource, export queue).
/// Kept across reloads while the setting is unchanged.
pub struct Tracer {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    settings: Tracing,
    propagator: TraceContextPropagator,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("url", &self.settings.url)
            .field("sample_ratio", &self.settings.sample_ratio)
            .finish_non_exhaustive()
    }
}

impl Tracer {
    /// The tracer for `settings`, its export thread started; lost spans are counted in
    /// `dropped`.
    pub(crate) fn start(
        settings: &Tracing,
        dropped: SpansDropped,
    ) -> Result<Tracer, export::StartError> {
        let resource = Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let queue = export::start(settings, &resource, dropped)?;
        let sampler = sampler(settings.sample_ratio);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("switchboard");
        Ok(Tracer {
            provider,
            tracer,
            settings: settings.clone(),
            propagator: TraceContextPropagator::new(),
        })
    }

    /// The setting it was made for.
    pub(crate) fn settings(&self) -> &Tracing {
        &self.settings
    }

    /// Whether prompts and answers go into spans.
    pub(crate) fn captures_content(&self) -> bool {
        self.settings.capture_content
    }

    /// The trace of a request to `endpoint` that arrived at `started` with `headers`: its
    /// server span begun, a child of the client's `traceparent` where it sent one.
    pub(crate) fn request(
        self: &Arc<Self>,
        headers: &HeaderMap,
        endpoint: Endpoint,
        started: Instant,
        request_id: &str,
    ) -> Box<RequestTrace> {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let operation = names::operation(endpoint);
        let wall = span::wall_clock(started);
        let mut span = self
            .tracer
            .span_builder(operation)
            .with_kind(SpanKind::Server)
            .with_start_time(wall)
            .start_with_context(&self.tracer, &parent);
        // The sampler reads no attributes: an unsampled span is given none.
        if span.is_recording() {
            span.set_attributes([
                KeyValue::new(names::OPERATION, operation),
                KeyValue::new(names::HTTP_METHOD, "POST"),
                KeyValue::new(names::URL_PATH, names::path(endpoint)),
                KeyValue::new(names::REQUEST_ID, request_id.to_string()),
            ]);
        }
        Box::new(RequestTrace::new(
            Arc::clone(self),
            span,
            operation,
            started,
        ))
    }

    fn sdk(&self) -> &SdkTracer {
        &self.tracer
    }

    fn propagator(&self) -> &TraceContextPropagator {
        &self.propagator
    }
}

/// Who decides whether a server span is recorded: the ratio, on its trace id, for a trace
/// that begins here and for a client's sampled one alike (a client's flag may lower the share
/// recorded, never raise it past `sample_ratio`); a client's unsampled trace is not recorded.
/// An attempt follows its server span.
fn sampler(ratio: f64) -> ParentBasedSampler {
    Sampler::parent_based(Sampler::TraceIdRatioBased(ratio))
        .with_remote_parent_sampled(Sampler::TraceIdRatioBased(ratio))
        .with_remote_parent_not_sampled(Sampler::AlwaysOff)
        .with_local_parent_sampled(Sampler::AlwaysOn)
        .with_local_parent_not_sampled(Sampler::AlwaysOff)
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // The export thread sends what is queued and ends once the last span is gone.
        let _ = self.provider.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::Context;
    use opentelemetry_sdk::trace::{SamplingDecision, ShouldSample as _};

    use super::*;

    /// Whether a server span of trace `id` is recorded at `ratio`, under a client's parent
    /// sampled or not (`None`: no parent).
    fn recorded(ratio: f64, id: u128, parent: Option<bool>) -> bool {
        let trace = TraceId::from(id);
        let cx = parent.map(|sampled| {
            let flags = if sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            };
            let span = SpanContext::new(trace, SpanId::from(7), flags, true, TraceState::NONE);
            Context::new().with_remote_span_context(span)
        });
        let r =
            sampler(ratio).should_sample(cx.as_ref(), trace, "chat", &SpanKind::Server, &[], &[]);
        r.decision == SamplingDecision::RecordAndSample
    }

    #[test]
    fn a_clients_sampled_flag_never_raises_the_share_past_the_ratio() {
        // The ratio reads the trace id's low half: 1 is in any share above 0, all ones in none
        // below 1.
        let (low, high) = (1u128, u128::MAX);
        for parent in [None, Some(true)] {
            assert!(!recorded(0.0, low, parent), "ratio 0: nothing ({parent:?})");
            assert!(recorded(0.5, low, parent), "{parent:?}");
            assert!(!recorded(0.5, high, parent), "{parent:?}");
            assert!(recorded(1.0, high, parent), "{parent:?}");
        }
        assert!(
            !recorded(1.0, low, Some(false)),
            "an unsampled parent is followed"
        );
    }
}
