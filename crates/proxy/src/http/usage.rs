//! The usage API, in the shape of OpenAI's organisation usage API so tools written for it
//! read Switchboard's: `GET /v1/organization/usage/completions` (admin keys: every client)
//! and `GET /v1/usage` (a client's key: its own usage; a key of `server.api_keys_env`: that
//! key's, its owner's), read from the ledger.
//!
//! OpenAI's `model` is the alias, and its `api_key_id` and `project_id` are the client. The
//! buckets are UTC minutes, hours or days (`bucket_width` `1m`, `1h`, `1d`); a page holds
//! `limit` of them from `start_time` (or from `page`, the `next_page` of the one before), each
//! with one result per group (none for a bucket without requests).

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde_json::{json, Value};

use super::intake;
use crate::error::ProxyError;
use crate::ledger::{self, Bucketed};
use crate::live::{AppState, Snapshot};

/// `GET /v1/organization/usage/completions`: every client's usage, for admin keys.
pub(crate) async fn organization(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let snap = state.live.load_full();
    if !is_admin(&snap, &headers) {
        return ProxyError::AdminOnly.into_response();
    }
    answer(&snap, None, query.as_deref()).await
}

/// `GET /v1/usage`: the caller's own usage (an admin key's: everyone's).
pub(crate) async fn own(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let snap = state.live.load_full();
    let only = match is_admin(&snap, &headers) {
        true => None,
        false => match intake::identify(&snap, &headers) {
            Ok(caller) => Some(caller.map_or("-".to_string(), |c| c.owner().to_string())),
            Err(e) => return e.into_response(),
        },
    };
    answer(&snap, only, query.as_deref()).await
}

/// Whether the request presents an admin key (`server.admin_keys_env`).
pub(super) fn is_admin(snap: &Snapshot, headers: &HeaderMap) -> bool {
    snap.config.server.admin_keys.as_ref().is_some_and(|keys| {
        crate::clients::presented(headers).is_some_and(|k| crate::clients::one_of(keys, k))
    })
}

async fn answer(snap: &Snapshot, only: Option<String>, query: Option<&str>) -> Response {
    let Some(ledger) = &snap.config.ledger else {
        return ProxyError::NoLedger.into_response();
    };
    let q = match Query::parse(query.unwrap_or(""), ledger::now_ms() / 1000) {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    let url = ledger.url.clone();
    let (from, to) = (q.first_ms(), q.last_ms());
    let width = q.width_ms;
    // A key's usage is its owner's: read from the owners' roll-ups; an admin key's from the
    // clients' (which every version writes).
    let owner = only.clone();
    let read = tokio::task::spawn_blocking(move || {
        ledger::with_store(&url, move |s| s.buckets(width, from, to, owner.as_deref()))
    })
    .await;
    match read {
        Ok(Ok(rows)) => Json(q.page(&rows, only.as_deref())).into_response(),
        Ok(Err(detail)) => ProxyError::database(detail).into_response(),
        Err(e) => ProxyError::database(e).into_response(),
    }
}

/// What a usage request asks for.
#[derive(Debug, Clone, PartialEq)]
struct Query {
    width_ms: i64,
    /// The first bucket's start and the end of the range, in seconds.
    start: i64,
    end: i64,
    limit: i64,
    by_model: bool,
    by_client: bool,
    models: Vec<String>,
    clients: Vec<String>,
}

impl Query {
    fn parse(query: &str, now: i64) -> Result<Query, ProxyError> {
        let bad = |param: &'static str, message: &str| ProxyError::InvalidParam {
            param,
            message: message.to_string(),
        };
        let (mut start, mut end, mut width, mut limit, mut page) = (None, None, None, None, None);
        let (mut by_model, mut by_client) = (false, false);
        let (mut models, mut clients) = (Vec::new(), Vec::new());
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            let int = |param| {
                v.parse::<i64>()
                    .map_err(|_| bad(param, "must be an integer"))
            };
            match k.trim_end_matches("[]") {
                "start_time" => start = Some(int("start_time")?),
                "end_time" => end = Some(int("end_time")?),
                "limit" => limit = Some(int("limit")?),
                "page" => page = Some(v.to_string()),
                "bucket_width" => width = Some(v.to_string()),
                "group_by" => {
                    for g in v.split(',') {
                        match g {
                            "model" => by_model = true,
                            "api_key_id" | "project_id" => by_client = true,
                            "user_id" | "batch" | "service_tier" => {}
                            _ => return Err(bad("group_by", "must be model, api_key_id, project_id, user_id, batch or service_tier")),
                        }
                    }
                }
                "models" => models.push(v.to_string()),
                "api_key_ids" | "project_ids" => clients.push(v.to_string()),
                _ => {}
            }
        }
        let (width_ms, default_limit, max_limit) = match width.as_deref().unwrap_or("1d") {
            "1m" => (60_000, 60, 1440),
            "1h" => (3_600_000, 24, 168),
            "1d" => (86_400_000, 7, 31),
            _ => return Err(bad("bucket_width", "must be 1m, 1h or 1d")),
        };
        let mut start = start.ok_or_else(|| bad("start_time", "is required"))?;
        if let Some(p) = page {
            start = decode_page(&p).ok_or_else(|| bad("page", "is not a page of this API"))?;
        }
        let limit = limit.unwrap_or(default_limit);
        if !(1..=max_limit).contains(&limit) {
            return Err(bad(
                "limit",
                &format!("must be between 1 and {max_limit} for this bucket_width"),
            ));
        }
        let end = end.unwrap_or(now.max(start));
        if end < start || start < 0 {
            return Err(bad("end_time", "must not be before start_time"));
        }
        let width_s = width_ms / 1000;
        Ok(Query {
            width_ms,
            start: start.div_euclid(width_s) * width_s,
            end,
            limit,
            by_model,
            by_client,
            models,
            clients,
        })
    }

    fn first_ms(&self) -> i64 {
        self.start * 1000
    }

    /// The end of the last bucket of the page, in milliseconds.
    fn last_ms(&self) -> i64 {
        (self.start * 1000 + self.limit * self.width_ms).min(self.end * 1000)
    }

    /// The page: its buckets from `start`, each with its results, of `rows` (those of owner
    /// `only`, where set) grouped as asked.
    fn page(&self, rows: &[Bucketed], only: Option<&str>) -> Value {
        let width = self.width_ms / 1000;
        let mut data = Vec::new();
        let mut at = self.start;
        while at < self.end && (data.len() as i64) < self.limit {
            let in_bucket = rows.iter().filter(|r| r.start_ms / 1000 == at).filter(|r| {
                only.is_none_or(|o| r.owner == o)
                    && (self.models.is_empty() || self.models.contains(&r.alias))
                    && (self.clients.is_empty() || self.clients.contains(&r.client))
            });
            let mut groups: Vec<(Option<&str>, Option<&str>, Sums)> = Vec::new();
            for r in in_bucket {
                let model = self.by_model.then_some(r.alias.as_str());
                let client = self.by_client.then_some(r.client.as_str());
                let sums = Sums {
                    requests: r.requests,
                    input: r.prompt_tokens,
                    cached: r.cached_tokens,
                    output: r.output_tokens,
                };
                match groups.iter_mut().find(|g| g.0 == model && g.1 == client) {
                    Some(g) => g.2.add(&sums),
                    None => groups.push((model, client, sums)),
                }
            }
            let results: Vec<Value> = groups
                .into_iter()
                .map(|(model, client, sums)| {
                    json!({
                        "object": "organization.usage.completions.result",
                        "input_tokens": sums.input,
                        "output_tokens": sums.output,
                        "input_cached_tokens": sums.cached,
                        "input_audio_tokens": 0,
                        "output_audio_tokens": 0,
                        "num_model_requests": sums.requests,
                        "project_id": client,
                        "user_id": null,
                        "api_key_id": client,
                        "model": model,
                        "batch": null,
                        "service_tier": null,
                    })
                })
                .collect();
            data.push(json!({
                "object": "bucket",
                "start_time": at,
                "end_time": (at + width).min(self.end.max(at + 1)),
                "results": results,
            }));
            at += width;
        }
        let more = at < self.end;
        json!({
            "object": "page",
            "data": data,
            "has_more": more,
            "next_page": more.then(|| encode_page(at)),
        })
    }
}

/// One result's sums: requests, and their input (cached among them) and output tokens.
struct Sums {
    requests: i64,
    input: i64,
    cached: i64,
    output: i64,
}

impl Sums {
    fn add(&mut self, other: &Sums) {
        self.requests += other.requests;
        self.input += other.input;
        self.cached += other.cached;
        self.output += other.output;
    }
}

fn encode_page(start: i64) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!("page_{}", b64.encode(start.to_string()))
}

fn decode_page(page: &str) -> Option<i64> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let bytes = b64.decode(page.strip_prefix("page_")?).ok()?;
    String::from_utf8(bytes).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    fn rows() -> Vec<Bucketed> {
        let r = |day: i64, alias: &str, client: &str, n: i64| Bucketed {
            start_ms: day * DAY * 1000,
            alias: alias.into(),
            client: client.into(),
            owner: client.into(),
            requests: n,
            prompt_tokens: 10 * n,
            cached_tokens: n,
            output_tokens: 2 * n,
        };
        vec![
            r(20_000, "a", "ann", 1),
            r(20_000, "b", "ann", 2),
            r(20_000, "a", "bob", 4),
            r(20_002, "a", "bob", 8),
        ]
    }

    #[test]
    fn buckets_page_by_limit_and_group_as_asked() {
        let now = 20_010 * DAY;
        let q = Query::parse(
            &format!(
                "start_time={}&limit=2&group_by=model&group_by=api_key_id",
                20_000 * DAY + 5
            ),
            now,
        )
        .unwrap();
        let page = q.page(&rows(), None);
        assert_eq!(page["object"], "page");
        assert_eq!(page["data"].as_array().unwrap().len(), 2);
        assert_eq!(page["data"][0]["start_time"], 20_000 * DAY);
        assert_eq!(page["data"][0]["end_time"], 20_001 * DAY);
        assert_eq!(page["data"][0]["results"].as_array().unwrap().len(), 3);
        assert_eq!(page["data"][1]["results"], json!([]));
        assert_eq!(page["has_more"], true);
        let next = page["next_page"].as_str().unwrap();
        let q2 = Query::parse(&format!("start_time=0&limit=2&page={next}"), now).unwrap();
        let page2 = q2.page(&rows(), None);
        assert_eq!(page2["data"][0]["start_time"], 20_002 * DAY);
        assert_eq!(page2["data"][0]["results"][0]["num_model_requests"], 8);
    }

    #[test]
    fn ungrouped_a_bucket_sums_everyone_and_a_client_sees_its_own() {
        let q = Query::parse(
            &format!("start_time={}&limit=1", 20_000 * DAY),
            20_010 * DAY,
        )
        .unwrap();
        let all = q.page(&rows(), None);
        let result = &all["data"][0]["results"][0];
        assert_eq!(result["num_model_requests"], 7);
        assert_eq!(result["input_tokens"], 70);
        assert_eq!(result["model"], Value::Null);
        let own = q.page(&rows(), Some("ann"));
        assert_eq!(own["data"][0]["results"][0]["num_model_requests"], 3);
    }

    #[test]
    fn a_bad_parameter_is_named() {
        for (query, param) in [
            ("", "start_time"),
            ("start_time=x", "start_time"),
            ("start_time=0&bucket_width=2h", "bucket_width"),
            ("start_time=0&bucket_width=1d&limit=32", "limit"),
            ("start_time=0&group_by=color", "group_by"),
            ("start_time=0&page=nope", "page"),
            ("start_time=10&end_time=5", "end_time"),
        ] {
            match Query::parse(query, 1000) {
                Err(ProxyError::InvalidParam { param: p, .. }) => assert_eq!(p, param, "{query}"),
                other => panic!("{query}: {other:?}"),
            }
        }
    }
}
