//! Token usage as the Responses API reports it: `input_tokens`, `output_tokens` and
//! `output_tokens_details.reasoning_tokens`, in the final response of a stream (llama.cpp adds
//! its `timings` beside it) or of a whole answer.

use serde::Deserialize;
use serde_json::Value;

use crate::usage::{Timings, Usage};

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    output_tokens_details: Option<Details>,
    input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
struct Details {
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct InputDetails {
    cached_tokens: Option<u64>,
}

fn usage_with(u: WireUsage, timings: Option<&Value>) -> Usage {
    let timings = timings.and_then(Timings::of_value);
    let speed = |k: fn(&Timings) -> Option<f64>| timings.as_ref().and_then(k);
    Usage {
        prompt: u.input_tokens,
        completion: u.output_tokens,
        reasoning: u.output_tokens_details.and_then(|d| d.reasoning_tokens),
        cached: u.input_tokens_details.and_then(|d| d.cached_tokens),
        prefill_tps: speed(|t| t.prompt_per_second),
        decode_tps: speed(|t| t.predicted_per_second),
        timings,
    }
}

/// The usage of a response object (a stream's final event carries one), with llama.cpp's
/// `timings` when it sent them.
pub(crate) fn of_response(response: &Value, timings: Option<&Value>) -> Option<Usage> {
    let u = response.get("usage").filter(|u| u.is_object())?;
    let u = WireUsage::deserialize(u).ok()?;
    Some(usage_with(u, timings))
}

#[derive(Deserialize)]
struct Answer {
    usage: Option<WireUsage>,
}

/// The usage of a whole Responses answer; `None` without one.
pub(crate) fn of_answer(body: &[u8]) -> Option<Usage> {
    let a: Answer = serde_json::from_slice(body).ok()?;
    Some(usage_with(a.usage?, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_and_reasoning_tokens() {
        // A real llama-server's answer (`responses_01`).
        let body = br#"{"completed_at":1796117996,"id":"resp_fDMF","model":"tiny-qwen3","object":"response","output":[{"content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"&[_tac"}],"id":"msg_S5vu","role":"assistant","status":"completed","type":"message"}],"status":"completed","usage":{"input_tokens":17,"output_tokens":6,"total_tokens":23,"input_tokens_details":{"cached_tokens":16}}}"#;
        let u = of_answer(body).unwrap();
        assert_eq!((u.prompt, u.completion, u.reasoning), (17, 6, None));
        let r = serde_json::json!({"usage": {"input_tokens": 9, "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 2}}});
        let t = serde_json::json!({"prompt_per_second": 3998.0, "predicted_per_second": 715.9});
        let u = of_response(&r, Some(&t)).unwrap();
        assert_eq!((u.prompt, u.completion, u.reasoning), (9, 4, Some(2)));
        assert_eq!((u.prefill_tps, u.decode_tps), (Some(3998.0), Some(715.9)));
        assert!(of_response(&serde_json::json!({"usage": null}), None).is_none());
    }
}
