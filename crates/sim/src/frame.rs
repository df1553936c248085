//! What every dialect must say, and the per-request SSE frame built from it.

use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;

/// Which endpoint a generation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Text,
}

/// Where a generated token goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Reasoning,
    Content,
}

/// Token counts and timings of one generation.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub(crate) prompt: u32,
    pub(crate) completion: u32,
    /// Tokens that went to the reasoning field.
    pub(crate) reasoning: u32,
    pub(crate) prompt_ms: f64,
    pub(crate) predicted_ms: f64,
    /// Prompt tokens read from the KV cache (GPU mode only; `None`: not simulated).
    pub(crate) cached: Option<u32>,
}

/// A finished non-stream answer.
#[derive(Debug)]
pub(crate) struct Answer<'a> {
    pub(crate) kind: Kind,
    pub(crate) id: &'a str,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) reasoning: Option<String>,
    pub(crate) content: String,
    pub(crate) finish: &'static str,
    pub(crate) counts: Counts,
}

/// Why a request is refused before generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The body is not valid JSON.
    Json {
        line: usize,
        column: usize,
        detail: String,
    },
    /// A required member is absent.
    Missing(&'static str),
    /// Some other malformed input.
    Invalid(String),
    /// The prompt (or prompt plus `max_tokens`) does not fit the window.
    Overflow {
        prompt: u32,
        max_tokens: Option<u32>,
        window: u32,
    },
}

/// The wire shapes of one backend flavour.
pub(crate) trait Dialect: Sync {
    /// `data: {…"choices":[` and `]…` around each stream chunk's choice (object left open).
    fn head_tail(&self, kind: Kind, id: &str, created: u64, model_json: &str) -> (String, String);
    /// The first chat chunk's choice, announcing the assistant role.
    fn role_choice(&self) -> &'static str;
    fn token_choice(&self, kind: Kind, field: Field, text: &str, out: &mut String);
    fn finish_choice(&self, kind: Kind, finish: &str, out: &mut String);
    /// Members appended to every ordinary chunk.
    fn chunk_extra(&self) -> &'static str {
        ""
    }
    /// Members appended to the finish chunk.
    fn finish_extra(&self, _usage_chunk: bool, _counts: &Counts) -> String {
        String::new()
    }
    /// Members of the usage-only chunk (after `"choices":[]`).
    fn usage_extra(&self, counts: &Counts) -> String;
    /// Whether a stream ends with a usage chunk, given `stream_options`.
    fn include_usage(&self, stream_options: Option<&Value>) -> bool {
        stream_options
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
    /// Whether the request is over the context window.
    fn overflows(&self, prompt: u32, max_tokens: Option<u32>, window: u32) -> bool;
    fn body(&self, answer: &Answer<'_>) -> Value;
    fn error(&self, failure: &Failure) -> (StatusCode, Value);
    fn not_found(&self, method: &str, path: &str) -> (StatusCode, Value);
}

/// Prebuilt pieces of one stream's chunks; each event is one allocation.
pub(crate) struct Frame {
    dialect: &'static dyn Dialect,
    kind: Kind,
    head: String,
    tail: String,
    /// Events written with Python's separators (`", "`, `": "`).
    spaced: bool,
}

pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

impl Frame {
    pub(crate) fn new(
        dialect: &'static dyn Dialect,
        kind: Kind,
        id: &str,
        created: u64,
        model_json: &str,
    ) -> Self {
        let (head, tail) = dialect.head_tail(kind, id, created, model_json);
        Self {
            dialect,
            kind,
            head,
            tail,
            spaced: false,
        }
    }

    /// Write the events with Python's separators.
    pub(crate) fn spaced(mut self, spaced: bool) -> Self {
        self.spaced = spaced;
        self
    }

    fn event(&self, choice: impl FnOnce(&mut String), extra: &str) -> Bytes {
        let mut out = String::with_capacity(self.head.len() + self.tail.len() + extra.len() + 96);
        out.push_str(&self.head);
        choice(&mut out);
        out.push_str(&self.tail);
        out.push_str(extra);
        out.push_str("}\n\n");
        if self.spaced {
            if let Some(json) = out
                .strip_prefix("data: ")
                .and_then(|o| o.strip_suffix("\n\n"))
            {
                out = format!("data: {}\n\n", python_separators(json));
            }
        }
        Bytes::from(out)
    }

    pub(crate) fn role(&self) -> Bytes {
        let role = self.dialect.role_choice();
        self.event(|o| o.push_str(role), self.dialect.chunk_extra())
    }

    pub(crate) fn token(&self, field: Field, text: &str) -> Bytes {
        self.event(
            |o| self.dialect.token_choice(self.kind, field, text, o),
            self.dialect.chunk_extra(),
        )
    }

    pub(crate) fn finish(&self, finish: &str, usage_chunk: bool, counts: &Counts) -> Bytes {
        let mut extra = self.dialect.chunk_extra().to_owned();
        extra.push_str(&self.dialect.finish_extra(usage_chunk, counts));
        self.event(|o| self.dialect.finish_choice(self.kind, finish, o), &extra)
    }

    pub(crate) fn usage(&self, counts: &Counts) -> Bytes {
        self.event(|_| {}, &self.dialect.usage_extra(counts))
    }
}

/// Compact JSON text as Python's `json.dumps` writes it: `", "` and `": "` between items.
pub(crate) fn python_separators(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 8);
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        out.push(c);
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if c == ',' || c == ':' {
            out.push(' ');
        }
    }
    out
}

/// Appends `s` as a JSON string literal.
pub(crate) fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&Value::from(s).to_string());
    }
}

/// Tokens per second over `ms` milliseconds, finite even for zero time.
pub(crate) fn per_second(n: u32, ms: f64) -> f64 {
    f64::from(n) * 1000.0 / ms.max(0.001)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn python_separators_space_only_outside_strings() {
        let compact = r#"{"a":[1,2],"b":"x, y: \"z\",\\","usage":{"prompt_tokens":3}}"#;
        let spaced = python_separators(compact);
        assert_eq!(
            spaced,
            r#"{"a": [1, 2], "b": "x, y: \"z\",\\", "usage": {"prompt_tokens": 3}}"#
        );
        let a: Value = serde_json::from_str(compact).unwrap();
        let b: Value = serde_json::from_str(&spaced).unwrap();
        assert_eq!(a, b);
    }
}
