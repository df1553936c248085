//! A span's size in an OTLP export, reckoned from above without encoding it: its strings'
//! bytes plus the most each protobuf field and message wrapper can add.

use opentelemetry::{Array, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;

/// The most a field's tag and length prefix take (a length under 2^35).
const FIELD: usize = 6;
/// A span's fixed fields at most: trace, span and parent ids, kind, times, flags, status
/// code, dropped counts, each with its tag, and the span's own wrapper.
const SPAN: usize = 128;
/// Room left in an export for its resource and scope, which are sent once per request.
const ENVELOPE: usize = 4 << 10;

/// The bytes of spans an export of at most `max` bytes may carry.
pub(crate) fn budget(max: usize) -> usize {
    max.saturating_sub(ENVELOPE)
}

/// The bytes `span` takes in an export request, or more (never fewer).
pub(crate) fn of(span: &SpanData) -> usize {
    let events: usize = span
        .events
        .iter()
        .map(|e| SPAN / 4 + FIELD + e.name.len() + attributes(&e.attributes))
        .sum();
    let links: usize = span
        .links
        .iter()
        .map(|l| SPAN / 2 + l.span_context.trace_state().header().len() + attributes(&l.attributes))
        .sum();
    SPAN + FIELD
        + span.name.len()
        + span.span_context.trace_state().header().len()
        + status(&span.status)
        + attributes(&span.attributes)
        + events
        + links
}

fn status(status: &opentelemetry::trace::Status) -> usize {
    match status {
        opentelemetry::trace::Status::Error { description } => FIELD + description.len(),
        _ => 0,
    }
}

fn attributes(kv: &[KeyValue]) -> usize {
    // Each: the KeyValue's wrapper, its key, the AnyValue's wrapper and its value's field.
    kv.iter()
        .map(|kv| 4 * FIELD + kv.key.as_str().len() + value(&kv.value))
        .sum()
}

fn value(v: &Value) -> usize {
    match v {
        Value::String(s) => s.as_str().len(),
        Value::Array(a) => array(a),
        // A varint or a fixed64 at most.
        _ => 10,
    }
}

fn array(a: &Array) -> usize {
    // Each element its own AnyValue in the ArrayValue.
    let each = 2 * FIELD;
    match a {
        Array::String(v) => v.iter().map(|s| each + s.as_str().len()).sum(),
        Array::Bool(v) => v.len() * (each + 1),
        Array::I64(v) => v.len() * (each + 10),
        Array::F64(v) => v.len() * (each + 8),
        _ => 0,
    }
}
