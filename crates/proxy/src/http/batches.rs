//! The Files and Batch endpoints, as OpenAI documents them: `/v1/files` (multipart upload,
//! list, get, content, delete) and `/v1/batches` (create, get, cancel, list). Thin: the caller
//! named (a client, or an admin key that sees all), the request parsed, [`crate::batches`]
//! called, its objects rendered; errors in OpenAI's envelope. Also what the batch runner is
//! handed to run a line: the whole pipeline ([`super::routed::line`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::intake::{self, BodyTime, REQUEST_ID};
use super::usage::is_admin;
use crate::batches::result::Answer;
use crate::batches::runner::{self, Serve};
use crate::batches::store::STATUSES;
use crate::batches::{Batches, Owner};
use crate::clients::Caller;
use crate::error::{Echo, ProxyError};
use crate::live::{AppState, Snapshot};

type Q = Query<HashMap<String, String>>;

/// The Batch API's state and who asks, or the error that answers.
fn open(state: &AppState, headers: &HeaderMap) -> Result<(Arc<Batches>, Owner), ProxyError> {
    let batches = state.batches.clone().map_err(ProxyError::BatchesOff)?;
    let snap = state.live.load();
    let owner = match is_admin(&snap, headers) {
        true => Owner {
            client: "-".into(),
            admin: true,
        },
        false => {
            let caller = intake::identify(&snap, headers)?;
            Owner {
                client: caller.map_or("-".to_string(), |c| c.owner().to_string()),
                admin: false,
            }
        }
    };
    Ok((batches, owner))
}

fn answered(r: Result<Value, ProxyError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A page's `limit` (1 to 100, `default` when unset).
fn limit(q: &HashMap<String, String>, default: i64) -> Result<i64, ProxyError> {
    match q.get("limit") {
        None => Ok(default),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| ProxyError::InvalidParam {
                param: "limit",
                message: format!("limit {:?} is not a number from 1 to 10000", Echo::new(v)),
            }),
    }
}

fn page(data: Vec<Value>, more: bool) -> Value {
    let id = |v: Option<&Value>| v.and_then(|v| v.get("id")).cloned();
    json!({
        "object": "list",
        "first_id": id(data.first()),
        "last_id": id(data.last()),
        "has_more": more,
        "data": data,
    })
}

/// `POST /v1/files`: a multipart form with `purpose` and `file` ([`super::upload`]).
pub(crate) async fn upload(State(state): State<AppState>, request: Request) -> Response {
    let (head, body) = request.into_parts();
    answered(
        async {
            let (batches, owner) = open(&state, &head.headers)?;
            let snap = state.live.load();
            let limits = snap.config.batches;
            let time = BodyTime::of(&snap.config.server);
            let form = super::upload::read(&batches, &head.headers, body, &limits, time).await?;
            let row = batches
                .upload(&owner, form.filename, form.purpose, form.content, &limits)
                .await?;
            Ok(row.to_json())
        }
        .await,
    )
}

/// `GET /v1/files`: the caller's files, newest first (`order=asc`: oldest), paged by `after`.
pub(crate) async fn files(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Q,
) -> Response {
    answered(
        async {
            let (batches, owner) = open(&state, &headers)?;
            let asc = q.get("order").is_some_and(|o| o == "asc");
            let (rows, more) = batches
                .files(
                    &owner,
                    q.get("purpose").cloned(),
                    q.get("after").cloned(),
                    asc,
                    limit(&q, 10_000)?,
                )
                .await?;
            Ok(page(rows.iter().map(|f| f.to_json()).collect(), more))
        }
        .await,
    )
}

/// `GET /v1/files/{id}`.
pub(crate) async fn file(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    answered(
        async {
            let (batches, owner) = open(&state, &headers)?;
            Ok(batches.file(&owner, &id).await?.to_json())
        }
        .await,
    )
}

/// `GET /v1/files/{id}/content`.
pub(crate) async fn content(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let got = async {
        let (batches, owner) = open(&state, &headers)?;
        batches.content(&owner, &id).await
    }
    .await;
    match got {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/files/{id}`.
pub(crate) async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    answered(
        async {
            let (batches, owner) = open(&state, &headers)?;
            let f = batches.delete(&owner, &id).await?;
            Ok(json!({"id": f.id, "object": "file", "deleted": true}))
        }
        .await,
    )
}

/// `POST /v1/batches`'s body.
#[derive(Deserialize)]
struct NewBatch {
    input_file_id: Option<String>,
    endpoint: Option<String>,
    completion_window: Option<String>,
    metadata: Option<Value>,
}

/// `POST /v1/batches`.
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answered(
        async {
            let (batches, owner) = open(&state, &headers)?;
            intake::check_content_type(&headers)?;
            let new: NewBatch = serde_json::from_slice(&body)
                .map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
            let missing = |param| ProxyError::InvalidParam {
                param,
                message: format!("{param} is required"),
            };
            let metadata = match new.metadata {
                None | Some(Value::Null) => None,
                Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => {
                    Some(Value::Object(m).to_string())
                }
                Some(_) => {
                    return Err(ProxyError::InvalidParam {
                        param: "metadata",
                        message: "metadata must be an object of at most 16 string values".into(),
                    })
                }
            };
            let limits = state.live.load().config.batches;
            let row = batches
                .create(
                    &owner,
                    new.input_file_id.ok_or_else(|| missing("input_file_id"))?,
                    new.endpoint.ok_or_else(|| missing("endpoint"))?,
                    new.completion_window
                        .ok_or_else(|| missing("completion_window"))?,
                    metadata,
                    &limits,
                )
                .await?;
            Ok(row.to_json())
        }
        .await,
    )
}

/// `GET /v1/batches/{id}`.
pub(crate) async fn batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    answered(
        async {
            let (batches, owner) = open(&state, &headers)?;
            Ok(batches.batch(&owner, &id).await?.to_json())
        }
        .await,
    )
}

/// `POST /v1/batches/{id}/cancel`.
pub(crate) async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    answered(
        async {
            let (batches, owner) = open(&state, &headers)?;
            Ok(batches.cancel(&owner, &id).await?.to_json())
        }
        .await,
    )
}

/// `GET /v1/batches`: the caller's batches, newest first, paged by `after` (`limit` 20 by
/// default).
pub(crate) async fn batches(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Q,
) -> Response {
    answered(
        async {
            let (batches, owner) = open(&state, &headers)?;
            let (rows, more) = batches
                .batches(&owner, q.get("after").cloned(), limit(&q, 20)?)
                .await?;
            Ok(page(rows.iter().map(|b| b.to_json()).collect(), more))
        }
        .await,
    )
}

/// The batch runner for `state`, when the Batch API is on: a task until the process ends.
pub fn spawn_runner(state: &AppState) {
    if let Ok(batches) = &state.batches {
        let serve: Arc<dyn Serve> = Arc::new(Lines(state.clone()));
        tokio::spawn(runner::run(Arc::clone(batches), serve));
    }
}

/// Lines served through the pipeline of `AppState`.
struct Lines(AppState);

/// The caller whose owner is `owner` in `snap` (`None`: `-`, the requests of no client's key);
/// a 401 for one whose key or client is gone.
fn caller(snap: &Snapshot, owner: &str) -> Result<Option<Caller>, ProxyError> {
    if owner == "-" {
        return Ok(None);
    }
    let found = snap.clients.owned_by(owner);
    found.cloned().map(Some).ok_or(ProxyError::Unauthorized)
}

impl Serve for Lines {
    fn line(&self, client: &str, endpoint: &str, body: Bytes) -> BoxFuture<'static, Answer> {
        let (state, client, endpoint) = (self.0.clone(), client.to_string(), endpoint.to_string());
        Box::pin(async move {
            let snap = state.live.load_full();
            let resp = match caller(&snap, &client) {
                Ok(c) => {
                    let (resp, queued) = super::routed::line(&state, c, &endpoint, body).await;
                    state.metrics.batches.waited(queued.as_secs_f64());
                    resp
                }
                Err(e) => e.into_response(),
            };
            let status = resp.status().as_u16();
            let retry_after_s = crate::upstream::exchange::retry_after_s(resp.headers());
            let request_id = resp
                .headers()
                .get(REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = match resp.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => Bytes::from(
                    json!({"error": {"message": format!("the answer broke off: {e}"),
                    "type": "server_error", "param": null, "code": "bad_gateway"}})
                    .to_string(),
                ),
            };
            let status = if body.is_empty() && status == 200 {
                502
            } else {
                status
            };
            Answer {
                status,
                request_id,
                body,
                retry_after_s,
            }
        })
    }

    fn usable(&self, client: &str, model: &str) -> bool {
        let snap = self.0.live.load();
        let Some(route) = snap.routes.resolve(model) else {
            return false;
        };
        match caller(&snap, client) {
            Ok(c) => c.is_none_or(|c| c.may_use(route.alias.name())),
            Err(_) => false,
        }
    }

    fn body_limit(&self) -> usize {
        self.0.live.load().config.server.body_limit
    }

    fn limits(&self) -> crate::config::Batches {
        self.0.live.load().config.batches
    }

    /// Counted under the owner's client (`anonymous` for a key of `server.api_keys_env`), or
    /// the owner as it is when it is gone.
    fn counted(&self, alias: &str, owner: &str, outcome: &'static str) {
        let snap = self.0.live.load();
        let client = snap.clients.owned_by(owner).map_or(owner, Caller::name);
        self.0.metrics.batches.line(alias, client, outcome);
    }

    fn statuses(&self, by: &[(String, i64)]) {
        self.0.metrics.batches.statuses(&STATUSES, by);
    }
}
