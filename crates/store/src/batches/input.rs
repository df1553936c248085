//! A batch's input file read and checked, as `POST /v1/batches` promises: every line a JSON
//! object with a `custom_id` unique in the file, `method` POST, `url` the batch's endpoint,
//! and a `body` within `server.body_limit_bytes` whose `model` is an alias the client may use.
//! Errors as OpenAI reports them: a code, a message, the parameter and the line (from 1). A
//! body is copied out of the file only once it is found good.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// One line to run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Line {
    /// Its number in the file, from 1 (blank lines counted).
    pub(crate) line: u64,
    pub(crate) custom_id: String,
    pub(crate) model: String,
    /// Its `body`, as written.
    pub(crate) body: String,
}

/// What is wrong with the file or one of its lines.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LineError {
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) param: Option<&'static str>,
    pub(crate) line: Option<u64>,
}

impl LineError {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "line": self.line,
        })
    }
}

/// The most errors reported of one file.
const MAX_ERRORS: usize = 100;

#[derive(Deserialize)]
struct RawLine<'a> {
    custom_id: Option<Value>,
    method: Option<Value>,
    url: Option<Value>,
    #[serde(borrow)]
    body: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Peek {
    model: Option<Value>,
    stream: Option<Value>,
}

/// The lines of `text` for a batch of `endpoint`, at most `max_lines`, each body at most
/// `max_body` bytes; `usable`: whether a model names an alias the batch's client may use.
/// Every error found (up to a hundred) when any line is wrong: the batch then fails as a whole,
/// none of it run.
pub(crate) fn read(
    text: &[u8],
    endpoint: &str,
    max_lines: u64,
    max_body: usize,
    usable: &dyn Fn(&str) -> bool,
) -> Result<Vec<Line>, Vec<LineError>> {
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let n = i as u64 + 1;
        if raw.trim_ascii().is_empty() {
            continue;
        }
        if lines.len() as u64 + errors.len() as u64 >= max_lines {
            return Err(vec![LineError {
                code: "too_many_tasks",
                message: format!(
                    "the file has more than {max_lines} requests, the most a batch may have"
                ),
                param: None,
                line: None,
            }]);
        }
        match line(raw, n, (endpoint, max_body), usable, &mut seen) {
            Ok(l) => lines.push(l),
            Err(e) if errors.len() < MAX_ERRORS => errors.push(e),
            Err(_) => {}
        }
    }
    if lines.is_empty() && errors.is_empty() {
        errors.push(LineError {
            code: "empty_file",
            message: "the input file has no requests".into(),
            param: None,
            line: None,
        });
    }
    if errors.is_empty() {
        Ok(lines)
    } else {
        Err(errors)
    }
}

/// Line `n`, `raw`, of a batch of `endpoint` whose bodies may have `max_body` bytes.
fn line(
    raw: &[u8],
    n: u64,
    (endpoint, max_body): (&str, usize),
    usable: &dyn Fn(&str) -> bool,
    seen: &mut HashSet<String>,
) -> Result<Line, LineError> {
    let err = |code, param, message: String| LineError {
        code,
        message,
        param,
        line: Some(n),
    };
    let parsed: RawLine<'_> = serde_json::from_slice(raw).map_err(|e| {
        err(
            "invalid_json_line",
            None,
            format!("line {n} is not a JSON object: {e}"),
        )
    })?;
    let custom_id = match parsed.custom_id {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => {
            return Err(err(
                "missing_required_parameter",
                Some("custom_id"),
                format!("line {n} has no custom_id string"),
            ))
        }
    };
    if parsed.method.as_ref().and_then(Value::as_str) != Some("POST") {
        return Err(err(
            "invalid_request",
            Some("method"),
            format!("line {n}: method must be POST"),
        ));
    }
    if parsed.url.as_ref().and_then(Value::as_str) != Some(endpoint) {
        return Err(err(
            "invalid_url",
            Some("url"),
            format!("line {n}: url must be the batch's endpoint {endpoint}"),
        ));
    }
    let Some(body) = parsed.body.filter(|b| b.get().starts_with('{')) else {
        return Err(err(
            "missing_required_parameter",
            Some("body"),
            format!("line {n} has no body object"),
        ));
    };
    let model = model_of(body.get(), n, max_body, usable)?;
    if !seen.insert(custom_id.clone()) {
        return Err(err(
            "duplicate_custom_id",
            Some("custom_id"),
            format!("line {n}: the custom_id {custom_id:?} is used by an earlier line"),
        ));
    }
    Ok(Line {
        line: n,
        custom_id,
        model,
        body: body.get().to_string(),
    })
}

/// The model line `n`'s `body` names, the body checked as intake checks a request's: within
/// `max_body` bytes (before it is read any further), readable, naming a model the client may
/// use, not streamed.
fn model_of(
    body: &str,
    n: u64,
    max_body: usize,
    usable: &dyn Fn(&str) -> bool,
) -> Result<String, LineError> {
    let err = |code, param, message: String| LineError {
        code,
        message,
        param,
        line: Some(n),
    };
    // As intake refuses a request's body past the limit: before it is read any further.
    if body.len() > max_body {
        return Err(err(
            "request_too_large",
            Some("body"),
            format!(
                "line {n}: the body has {} bytes, more than the limit of {max_body} bytes \
                 (server.body_limit_bytes)",
                body.len()
            ),
        ));
    }
    let peek: Peek = serde_json::from_str(body).map_err(|e| {
        err(
            "invalid_request",
            Some("body"),
            format!("line {n}: the body is not readable: {e}"),
        )
    })?;
    let Some(Value::String(model)) = peek.model else {
        return Err(err(
            "missing_required_parameter",
            Some("body.model"),
            format!("line {n}: the body names no model"),
        ));
    };
    if !usable(&model) {
        return Err(err(
            "model_not_found",
            Some("body.model"),
            format!("line {n}: the model {model:?} does not exist or you do not have access to it"),
        ));
    }
    if peek
        .stream
        .as_ref()
        .is_some_and(|s| s != &Value::Bool(false))
    {
        return Err(err(
            "invalid_request",
            Some("body.stream"),
            format!("line {n}: a batch's requests are answered whole: stream is not supported"),
        ));
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &str = "/v1/chat/completions";
    /// The bodies' limit in these tests.
    const LIMIT: usize = 100;

    fn ok(model: &str) -> bool {
        model == "a"
    }

    fn chat_line(id: &str, body: &str) -> String {
        format!(r#"{{"custom_id":"{id}","method":"POST","url":"{CHAT}","body":{body}}}"#)
    }

    #[test]
    fn good_lines_keep_their_body_as_written_and_their_numbers() {
        let body = r#"{ "model" : "a", "messages":[{"role":"user","content":"h\u00e9"}] }"#;
        let text = format!("{}\n\n  \n{}\n", chat_line("x", body), chat_line("y", body));
        let got = read(text.as_bytes(), CHAT, 10, LIMIT, &ok).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].body, body);
        assert_eq!((got[0].line, got[1].line), (1, 4));
        assert_eq!(
            (got[1].custom_id.as_str(), got[1].model.as_str()),
            ("y", "a")
        );
    }

    #[test]
    fn each_kind_of_bad_line_is_named_with_its_code_param_and_line() {
        let good = r#"{"model":"a","messages":[]}"#;
        let over = format!(r#"{{"model":"a","pad":"{}"}}"#, "x".repeat(LIMIT));
        let cases: [(String, &str, Option<&str>); 9] = [
            ("{not json".into(), "invalid_json_line", None),
            (
                format!(r#"{{"method":"POST","url":"{CHAT}","body":{good}}}"#),
                "missing_required_parameter",
                Some("custom_id"),
            ),
            (
                chat_line("a", good).replace("POST", "GET"),
                "invalid_request",
                Some("method"),
            ),
            (
                chat_line("a", good).replace(CHAT, "/v1/embeddings"),
                "invalid_url",
                Some("url"),
            ),
            (
                chat_line("a", "[1]"),
                "missing_required_parameter",
                Some("body"),
            ),
            (
                chat_line("a", r#"{"messages":[]}"#),
                "missing_required_parameter",
                Some("body.model"),
            ),
            (
                chat_line("a", r#"{"model":"b"}"#),
                "model_not_found",
                Some("body.model"),
            ),
            (
                chat_line("a", r#"{"model":"a","stream":true}"#),
                "invalid_request",
                Some("body.stream"),
            ),
            (chat_line("a", &over), "request_too_large", Some("body")),
        ];
        for (bad, code, param) in cases {
            let text = format!("{}\n{bad}\n", chat_line("first", good));
            let errs = read(text.as_bytes(), CHAT, 10, LIMIT, &ok).unwrap_err();
            assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
            assert_eq!((errs[0].code, errs[0].param), (code, param), "{bad}");
            assert_eq!(errs[0].line, Some(2), "{bad}");
        }
    }

    #[test]
    fn a_body_of_the_limit_passes_and_one_byte_more_does_not() {
        let at = |n: usize| {
            let body = format!(r#"{{"model":"a","pad":"{}"}}"#, "x".repeat(n - 22));
            assert_eq!(body.len(), n);
            read(chat_line("a", &body).as_bytes(), CHAT, 10, LIMIT, &ok)
        };
        assert_eq!(at(LIMIT).unwrap().len(), 1);
        let errs = at(LIMIT + 1).unwrap_err();
        assert_eq!((errs[0].code, errs[0].line), ("request_too_large", Some(1)));
        assert!(errs[0].message.contains("101 bytes"), "{}", errs[0].message);
    }

    #[test]
    fn a_repeated_custom_id_an_empty_file_and_too_many_lines_fail_the_file() {
        let good = chat_line("a", r#"{"model":"a"}"#);
        let errs = read(format!("{good}\n{good}").as_bytes(), CHAT, 10, LIMIT, &ok).unwrap_err();
        assert_eq!(
            (errs[0].code, errs[0].line),
            ("duplicate_custom_id", Some(2))
        );
        let errs = read(b"\n \n", CHAT, 10, LIMIT, &ok).unwrap_err();
        assert_eq!(errs[0].code, "empty_file");
        let three: String = (0..3)
            .map(|i| chat_line(&i.to_string(), r#"{"model":"a"}"#) + "\n")
            .collect();
        assert_eq!(
            read(three.as_bytes(), CHAT, 2, LIMIT, &ok).unwrap_err()[0].code,
            "too_many_tasks"
        );
        assert_eq!(
            read(three.as_bytes(), CHAT, 3, LIMIT, &ok).unwrap().len(),
            3
        );
    }
}
