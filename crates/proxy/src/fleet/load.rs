//! Load as the backends themselves report it, so that the choice of a replica sees the traffic
//! of every process in front of them: where each runtime reports it is its
//! [`crate::runtime::Runtime::load`] (llama.cpp's busy slots, the request counts of vLLM and
//! SGLang in their metrics). What a reading shows beyond this process's own
//! requests at that moment is the other processes' share; the choice counts that share on top
//! of the process's own requests now (which it knows exactly, reading or not).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::config::Backend;
use crate::fleet::discovery::{self, NoAnswer};
use crate::lock::Locked;
use crate::runtime::Load;
use crate::upstream::Client;

/// Why a backend's load could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error(transparent)]
    NoAnswer(#[from] NoAnswer),
    #[error("{flavor} reports no load")]
    NoSource { flavor: &'static str },
    #[error("GET {path} answered {status}")]
    Status { path: &'static str, status: u16 },
    #[error("{0}")]
    NotText(std::str::Utf8Error),
    #[error("no {0} in the metrics")]
    NoMetric(&'static str),
    #[error("{0}")]
    BadSlots(serde_json::Error),
}

/// The requests a backend has (running and waiting) by its answer `body` at `source`.
pub(crate) fn reading(source: Load, body: &[u8]) -> Result<u32, LoadError> {
    match source {
        Load::Slots => busy_slots(body),
        Load::Metrics(names) => {
            let text = std::str::from_utf8(body).map_err(LoadError::NotText)?;
            let mut total = 0.0;
            for name in names {
                total += metric_sum(text, name).ok_or(LoadError::NoMetric(name))?;
            }
            Ok(total.max(0.0).round().min(f64::from(u32::MAX)) as u32)
        }
    }
}

/// Read `backend`'s load from the first of its runtime's load sources that answers 2xx.
pub(crate) async fn read(
    client: &Client,
    backend: &Backend,
    timeout: Duration,
) -> Result<u32, LoadError> {
    let mut last = LoadError::NoSource {
        flavor: backend.flavor.as_str(),
    };
    for &source in backend.flavor.runtime().load {
        match discovery::get(client, backend, source.path(), timeout).await? {
            (200..=299, body) => return reading(source, &body),
            (status, _) => {
                last = LoadError::Status {
                    path: source.path(),
                    status,
                }
            }
        }
    }
    Err(last)
}

#[derive(Deserialize)]
struct Slot {
    #[serde(default)]
    is_processing: bool,
}

/// The slots of a llama.cpp `/slots` answer that are processing a request.
fn busy_slots(body: &[u8]) -> Result<u32, LoadError> {
    let slots: Vec<Slot> = serde_json::from_slice(body).map_err(LoadError::BadSlots)?;
    Ok(slots.iter().filter(|s| s.is_processing).count() as u32)
}

/// The sum of the samples of family `name` (any labels) in Prometheus text `text`; `None` when
/// it has none. Comment lines are skipped; a sample is `name`, optional `{labels}`, the value,
/// an optional timestamp.
pub(crate) fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut sum: Option<f64> = None;
    for line in text.lines() {
        let line = line.trim_start();
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = match rest.as_bytes().first() {
            Some(b'{') => after_labels(rest)?,
            Some(b' ' | b'\t') => rest,
            // Another family whose name starts with this one's, or a bare name.
            _ => continue,
        };
        let value = rest.split_whitespace().next()?;
        let v: f64 = value.parse().ok()?;
        if v.is_finite() {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// What follows the `{…}` label set that `s` starts with (quoted values may hold `}`).
fn after_labels(s: &str) -> Option<&str> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(&s[i + 1..]),
            _ => {}
        }
    }
    None
}

/// How old a reading taken every `interval` may be and still count: three intervals (a
/// backend that does not answer in that time has its reading set aside, and each process
/// counts its own requests only).
pub(crate) fn max_age(interval: Duration) -> Duration {
    interval.saturating_mul(3)
}

/// The requests the choice counts on a backend: this process's own now, and the other
/// processes' as of the last reading.
pub(crate) fn combined(own: u32, others: Option<u32>) -> u32 {
    own.saturating_add(others.unwrap_or(0))
}

/// The last reading of one backend's load: the requests it had beyond this process's own.
#[derive(Debug, Default)]
pub(crate) struct Reported {
    reading: Mutex<Option<Reading>>,
}

#[derive(Debug, Clone, Copy)]
struct Reading {
    others: u32,
    at: Instant,
}

impl Reported {
    /// The backend reported `busy` requests in a reading begun at `at`, when this process had
    /// `own` on it (the more of its count as the reading began and ended: a request of its own
    /// the backend may not show yet is not taken for another process's); `None`: it could not
    /// be read, and its last reading is no longer used.
    pub(crate) fn set(&self, busy: Option<u32>, own: u32, at: Instant) {
        let reading = busy.map(|busy| Reading {
            others: busy.saturating_sub(own),
            at,
        });
        *self.reading.locked() = reading;
    }

    /// The requests of other processes on the backend by its last reading, taken within
    /// `max_age` of `now`; `None` without such a reading.
    pub(crate) fn others(&self, now: Instant, max_age: Duration) -> Option<u32> {
        let reading = *self.reading.locked();
        let r = reading?;
        (now.saturating_duration_since(r.at) <= max_age).then_some(r.others)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The body of a captured answer (its head dropped).
    fn captured(text: &str) -> &str {
        text.split_once("\r\n\r\n")
            .or_else(|| text.split_once("\n\n"))
            .map_or(text, |(_, b)| b)
    }

    #[test]
    fn busy_slots_are_those_processing() {
        let body = br#"[{"id":0,"is_processing":true,"n_ctx":4096},{"id":1,"is_processing":false},{"id":2,"is_processing":true}]"#;
        assert_eq!(reading(Load::Slots, body).ok(), Some(2));
        assert!(reading(Load::Slots, b"{\"error\":1}").is_err());
    }

    #[test]
    fn reads_a_real_llama_server_answer() {
        let slots = include_str!("../../../../tests/fixtures/discovery/llamacpp_slots.txt");
        assert_eq!(
            reading(Load::Slots, captured(slots).as_bytes()).ok(),
            Some(0)
        );
        let metrics = include_str!("../../../../tests/fixtures/discovery/llamacpp_metrics.txt");
        let names = crate::flavor::Flavor::Llamacpp.runtime().load[1];
        assert_eq!(reading(names, captured(metrics).as_bytes()).ok(), Some(0));
        assert_eq!(
            metric_sum(captured(metrics), "llamacpp:prompt_tokens_total"),
            Some(4110.0)
        );
    }

    #[test]
    fn metric_samples_of_a_family_are_summed_across_labels() {
        let text = "# HELP vllm:num_requests_running Number of requests.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"a}b\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"a\\\"b\"} 2.0 1700000000\n\
            vllm:num_requests_running_total 40\n\
            vllm:num_requests_waiting{model_name=\"m\"} 1\n";
        assert_eq!(metric_sum(text, "vllm:num_requests_running"), Some(5.0));
        let vllm = crate::flavor::Flavor::Vllm.runtime().load[0];
        assert_eq!(reading(vllm, text.as_bytes()).ok(), Some(6));
        let sglang = crate::flavor::Flavor::Sglang.runtime().load[0];
        let e = reading(sglang, text.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("sglang:num_running_reqs"), "{e}");
        assert_eq!(metric_sum("x 1\n", "x_total"), None);
        assert_eq!(metric_sum("x NaN\n", "x"), None);
    }

    #[test]
    fn a_reading_counts_other_processes_requests_until_it_is_old() {
        let r = Reported::default();
        let age = Duration::from_secs(1);
        let t0 = Instant::now();
        assert_eq!(r.others(t0, age), None);
        // The backend has 3, this process 1 of them: 2 are another's.
        r.set(Some(3), 1, t0);
        assert_eq!(r.others(t0, age), Some(2));
        assert_eq!(combined(1, r.others(t0, age)), 3);
        // Its own not shown yet: nobody else's.
        r.set(Some(1), 2, t0);
        assert_eq!(r.others(t0, age), Some(0));
        assert_eq!(r.others(t0 + Duration::from_secs(2), age), None);
        r.set(None, 0, t0);
        assert_eq!(r.others(t0, age), None);
        assert_eq!(combined(3, None), 3);
    }
}
