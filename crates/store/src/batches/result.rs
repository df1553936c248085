//! What one run of a batch line comes to: its output or error line, as OpenAI writes them
//! (`id`, `custom_id`, `response` with `status_code`, `request_id` and `body`, `error`), or
//! another run later — decided from the answer's status and error code, as a value.

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::store::Outcome;

/// An answer to a line: its status, request id, body, and the error code its body names.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub request_id: String,
    pub body: bytes::Bytes,
    /// Its `Retry-After`, in seconds, when it has one.
    pub retry_after_s: Option<u64>,
}

impl Answer {
    /// The `error.code` (or Anthropic's `error.type`) of its body, when it has one.
    pub(crate) fn code(&self) -> Option<String> {
        let v: Value = serde_json::from_slice(&self.body).ok()?;
        let e = v.get("error")?;
        let code = e.get("code").filter(|c| c.is_string()).or(e.get("type"))?;
        code.as_str().map(str::to_string)
    }
}

/// Error codes of the proxy's own that say the line was not run (its queue was full or its
/// wait ran out, its client's rate limit, a budget of its client's day or month spent): it
/// runs later, its retries untouched.
const NOT_RUN: [&str; 4] = [
    "overloaded",
    "queue_timeout",
    "rate_limit_exceeded",
    "insufficient_quota",
];

/// How the run of a line, its `attempts`-th (from 1), that got `answer` ends: done on a 2xx,
/// failed on an answer no run would change, else run again `retry_after_ms` after `now_ms`, or
/// after the answer's own `Retry-After` when that is longer (a spent budget's reset) —
/// counted against `retries` unless the line was not run at all.
pub(crate) fn decide(
    custom_id: &str,
    answer: &Answer,
    attempts: u64,
    retries: u64,
    now_ms: i64,
    retry_after_ms: i64,
) -> Outcome {
    let wait = answer
        .retry_after_s
        .map_or(retry_after_ms, |s| retry_after_ms.max(s as i64 * 1000));
    let later = |counted| Outcome::Again {
        not_before: now_ms + wait,
        counted,
    };
    let status = answer.status;
    if (200..300).contains(&status) {
        return Outcome::Done(line(custom_id, Some(answer), None));
    }
    let code = answer.code();
    if code.as_deref().is_some_and(|c| NOT_RUN.contains(&c)) {
        return later(false);
    }
    let transient = status >= 500 || status == 429 || status == 408;
    if transient && attempts <= retries {
        return later(true);
    }
    Outcome::Failed(line(custom_id, Some(answer), None))
}

/// A line that ends without an answer of its own: `code` and `message` say why
/// (`batch_expired`, `batch_cancelled`).
pub(crate) fn unanswered(custom_id: &str, code: &str, message: &str) -> String {
    line(custom_id, None, Some((code, message)))
}

fn line(custom_id: &str, answer: Option<&Answer>, error: Option<(&str, &str)>) -> String {
    let response = answer.map(|a| {
        // The body as the backend wrote it when it is JSON; as a string when it is not.
        let body = std::str::from_utf8(&a.body)
            .ok()
            .and_then(|s| RawValue::from_string(s.trim().to_string()).ok())
            .map_or_else(|| json!(String::from_utf8_lossy(&a.body)), |raw| json!(raw));
        json!({"status_code": a.status, "request_id": a.request_id, "body": body})
    });
    let error = error.map(|(code, message)| json!({"code": code, "message": message}));
    let id = format!("batch_req_{}", super::hex_id());
    json!({"id": id, "custom_id": custom_id, "response": response, "error": error}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            request_id: "r1".into(),
            body: bytes::Bytes::from(body.to_string()),
            retry_after_s: None,
        }
    }

    fn error(code: &str) -> String {
        format!(r#"{{"error":{{"message":"m","type":"t","param":null,"code":"{code}"}}}}"#)
    }

    #[test]
    fn the_decision_for_each_kind_of_answer() {
        let again = |counted| Outcome::Again {
            not_before: 1500,
            counted,
        };
        let d = |a: &Answer, attempts| decide("c", a, attempts, 2, 1000, 500);
        assert!(matches!(
            d(&answer(200, r#"{"id":"x"}"#), 1),
            Outcome::Done(_)
        ));
        // Refused before it ran: later, however often.
        for code in NOT_RUN {
            assert_eq!(d(&answer(429, &error(code)), 99), again(false), "{code}");
        }
        // Not before its own Retry-After when that is longer: a day's budget resets in an hour.
        let spent = Answer {
            retry_after_s: Some(3600),
            ..answer(429, &error("insufficient_quota"))
        };
        let hour = Outcome::Again {
            not_before: 1000 + 3_600_000,
            counted: false,
        };
        assert_eq!(d(&spent, 1), hour);
        let soon = Answer {
            retry_after_s: Some(0),
            ..answer(503, &error("bad_gateway"))
        };
        assert_eq!(d(&soon, 1), again(true));
        // A backend's failure: later while retries are left, then the error file.
        for status in [500, 502, 503, 504, 429, 408] {
            let a = answer(status, &error("bad_gateway"));
            assert_eq!(d(&a, 1), again(true), "{status}");
            assert_eq!(d(&a, 2), again(true), "{status}");
            assert!(matches!(d(&a, 3), Outcome::Failed(_)), "{status}");
        }
        // The request's own fault: the error file at once.
        let a = answer(400, &error("context_length_exceeded"));
        assert!(matches!(d(&a, 1), Outcome::Failed(_)));
    }

    #[test]
    fn output_lines_carry_the_body_as_json_and_errors_their_code() {
        let Outcome::Done(out) = decide("c-1", &answer(200, "{\"a\": [1, 2]}\n"), 1, 0, 0, 0)
        else {
            panic!()
        };
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["custom_id"], "c-1");
        assert!(v["id"].as_str().unwrap().starts_with("batch_req_"));
        assert_eq!(v["response"]["status_code"], 200);
        assert_eq!(v["response"]["request_id"], "r1");
        assert_eq!(v["response"]["body"]["a"][1], 2);
        assert_eq!(v["error"], Value::Null);
        let v: Value = serde_json::from_str(&unanswered("c-2", "batch_expired", "late")).unwrap();
        assert_eq!(v["response"], Value::Null);
        assert_eq!(v["error"]["code"], "batch_expired");
        // A body that is no JSON is kept as a string.
        let Outcome::Failed(out) = decide("c", &answer(400, "no json"), 1, 0, 0, 0) else {
            panic!()
        };
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["response"]["body"], "no json");
    }
}
