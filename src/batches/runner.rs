//! The batch runner: one task for the process that validates new batches, runs their lines
//! through the pipeline it is handed ([`Serve`]) — at most `max_concurrent` of a batch and
//! `max_concurrent_per_client` of a client's at once, each as a request of the `idle` class —
//! commits each line's result with its state, and ends batches: completed when every line
//! has its result, expired at the end of their window, cancelled when asked, with their
//! output and error files written. After a restart it goes on from what was committed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::task::{Id, JoinSet};

use super::result::{decide, unanswered, Answer};
use super::store::{self, BatchRow, FileRow, Outcome};
use super::{db_error, hex_id, now_s, write_file, Batches};
use crate::config;
use crate::error::ProxyError;

/// What the runner needs of the proxy: a line served, what a client may use, the bounds of
/// `[batches]` now, and where its figures go.
pub trait Serve: Send + Sync + 'static {
    /// One line of `client`'s batch to `endpoint`, answered whole.
    fn line(&self, client: &str, endpoint: &str, body: Bytes) -> BoxFuture<'static, Answer>;
    /// Whether `model` names an alias `client` may use.
    fn usable(&self, client: &str, model: &str) -> bool;
    fn limits(&self) -> config::Batches;
    /// A line's run ended: `outcome` is `completed`, `failed`, `retried` or `deferred`.
    fn counted(&self, alias: &str, client: &str, outcome: &'static str);
    /// Batches by status, every status.
    fn statuses(&self, by: &[(String, i64)]);
}

/// A line running: its batch, its client, its number.
struct Running {
    batch: String,
    client: String,
    line: i64,
}

/// Runs batches until the process ends.
pub async fn run(batches: Arc<Batches>, serve: Arc<dyn Serve>) {
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut running: HashMap<Id, Running> = HashMap::new();
    let mut aborts: HashMap<Id, tokio::task::AbortHandle> = HashMap::new();
    loop {
        let r = step(&batches, &serve, &mut tasks, &mut running, &mut aborts).await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "batch runner: the ledger cannot be used now");
        }
        tokio::select! {
            () = batches.wake.notified() => {}
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => e.id(),
                };
                running.remove(&id);
                aborts.remove(&id);
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        while let Some(done) = tasks.try_join_next_with_id() {
            let id = match done {
                Ok((id, ())) => id,
                Err(e) => e.id(),
            };
            running.remove(&id);
            aborts.remove(&id);
        }
    }
}

/// One look at every batch not yet ended.
async fn step(
    batches: &Arc<Batches>,
    serve: &Arc<dyn Serve>,
    tasks: &mut JoinSet<()>,
    running: &mut HashMap<Id, Running>,
    aborts: &mut HashMap<Id, tokio::task::AbortHandle>,
) -> Result<(), ProxyError> {
    let limits = serve.limits();
    let (active, by) = batches
        .with(|db, _| {
            let active = store::active(db).map_err(db_error)?;
            let by = store::by_status(db).map_err(db_error)?;
            Ok((active, by))
        })
        .await?;
    serve.statuses(&by);
    batches.set_active(active.clone());
    let now = now_s();
    for b in active {
        let of_batch = |running: &HashMap<Id, Running>| {
            running.values().filter(|r| r.batch == b.id).count() as u64
        };
        let ending = match b.status.as_str() {
            store::VALIDATING => {
                validate(batches, serve, &b, &limits).await?;
                continue;
            }
            store::CANCELLING => Some(store::CANCELLED),
            store::IN_PROGRESS if now >= b.expires_at => Some(store::EXPIRED),
            store::FINALIZING => Some(store::COMPLETED),
            _ => None,
        };
        if let Some(status) = ending {
            // Its running lines stop (their upstream requests are cancelled); it ends once
            // they have.
            for (id, r) in running.iter() {
                if r.batch == b.id {
                    if let Some(a) = aborts.get(id) {
                        a.abort();
                    }
                }
            }
            if of_batch(running) == 0 {
                end(batches, &b, status).await?;
            }
            continue;
        }
        let of_client = running.values().filter(|r| r.client == b.client).count() as u64;
        let free = limits
            .max_concurrent
            .saturating_sub(of_batch(running))
            .min(limits.max_concurrent_per_client.saturating_sub(of_client));
        let id = b.id.clone();
        let lines_running: Vec<i64> = running
            .values()
            .filter(|r| r.batch == b.id)
            .map(|r| r.line)
            .collect();
        let now_ms = crate::ledger::now_ms();
        let (pending, left) = batches
            .with(move |db, _| {
                let p = store::pending(db, &id, now_ms, &lines_running, free as usize)
                    .map_err(db_error)?;
                Ok((p, store::left(db, &id).map_err(db_error)?))
            })
            .await?;
        if left == 0 && of_batch(running) == 0 {
            end(batches, &b, store::COMPLETED).await?;
            continue;
        }
        for p in pending {
            let line = p.line;
            let job = run_line(Arc::clone(batches), Arc::clone(serve), &b, p, &limits);
            let abort = tasks.spawn(job);
            running.insert(
                abort.id(),
                Running {
                    batch: b.id.clone(),
                    client: b.client.clone(),
                    line,
                },
            );
            aborts.insert(abort.id(), abort);
        }
    }
    Ok(())
}

/// One run of line `p` of batch `b`: served, decided, committed, counted.
fn run_line(
    batches: Arc<Batches>,
    serve: Arc<dyn Serve>,
    b: &BatchRow,
    p: store::Pending,
    limits: &config::Batches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (id, client, endpoint) = (b.id.clone(), b.client.clone(), b.endpoint.clone());
    let (retries, retry_after) = (limits.line_retries, limits.retry_after.as_millis() as i64);
    async move {
        let attempts = p.attempts + 1;
        let answer = serve
            .line(&client, &endpoint, Bytes::from(p.body.clone()))
            .await;
        let now_ms = crate::ledger::now_ms();
        let outcome = decide(
            &p.custom_id,
            &answer,
            attempts as u64,
            retries,
            now_ms,
            retry_after,
        );
        let (label, attempts) = match &outcome {
            Outcome::Done(_) => ("completed", attempts),
            Outcome::Failed(_) => ("failed", attempts),
            Outcome::Again { counted: true, .. } => ("retried", attempts),
            Outcome::Again { counted: false, .. } => ("deferred", p.attempts),
        };
        let line = p.line;
        let committed = batches
            .with(move |db, _| store::commit(db, &id, line, attempts, &outcome).map_err(db_error))
            .await;
        match committed {
            Ok(()) => serve.counted(&p.model, &client, label),
            Err(e) => tracing::warn!(error = %e, line, "batch line's result not committed"),
        }
    }
}

/// A new batch's input read and checked: its lines stored and the batch in progress, or the
/// batch failed with the errors found.
async fn validate(
    batches: &Arc<Batches>,
    serve: &Arc<dyn Serve>,
    b: &BatchRow,
    limits: &config::Batches,
) -> Result<(), ProxyError> {
    let (b, serve, max_lines) = (b.clone(), Arc::clone(serve), limits.max_lines);
    batches
        .with(move |db, dir| {
            let now = now_s();
            let text = match std::fs::read(dir.join(&b.input_file_id)) {
                Ok(t) => t,
                Err(_) => {
                    let e = super::input::LineError {
                        code: "invalid_request",
                        message: format!("the input file {} is gone", b.input_file_id),
                        param: Some("input_file_id"),
                        line: None,
                    };
                    let errors = serde_json::json!([e.to_json()]).to_string();
                    return store::finish(
                        db,
                        &b.id,
                        store::FAILED,
                        (None, None),
                        Some(&errors),
                        now,
                    )
                    .map_err(db_error);
                }
            };
            let usable = |model: &str| serve.usable(&b.client, model);
            match super::input::read(&text, &b.endpoint, max_lines, &usable) {
                Ok(lines) => store::start(db, &b.id, &lines, now).map_err(db_error),
                Err(errors) => {
                    let errors: Vec<_> = errors.iter().map(|e| e.to_json()).collect();
                    let errors = serde_json::Value::from(errors).to_string();
                    store::finish(db, &b.id, store::FAILED, (None, None), Some(&errors), now)
                        .map_err(db_error)
                }
            }
        })
        .await
}

/// Batch `b` ends as `status`: its lines not run go to its error file as such, its output and
/// error files are written, and its status, files and time are committed together.
async fn end(batches: &Arc<Batches>, b: &BatchRow, status: &'static str) -> Result<(), ProxyError> {
    let b = b.clone();
    batches
        .with(move |db, dir| {
            let now = now_s();
            let from = [store::IN_PROGRESS, store::CANCELLING];
            store::advance(db, &b.id, &from, store::FINALIZING, now).map_err(db_error)?;
            let (code, message) = match status {
                store::EXPIRED => (
                    "batch_expired",
                    "the batch's window ended before this request ran",
                ),
                store::CANCELLED => (
                    "batch_cancelled",
                    "the batch was cancelled before this request ran",
                ),
                _ => ("batch_failed", "the request was not run"),
            };
            store::fail_pending(db, &b.id, &|custom_id| unanswered(custom_id, code, message))
                .map_err(db_error)?;
            let results = store::results(db, &b.id).map_err(db_error)?;
            let file = |done: bool, what: &str| -> Result<Option<FileRow>, ProxyError> {
                let mut text = String::new();
                for (_, r) in results.iter().filter(|(d, _)| *d == done) {
                    text.push_str(r);
                    text.push('\n');
                }
                if text.is_empty() {
                    return Ok(None);
                }
                let f = FileRow {
                    id: format!("file-{}", hex_id()),
                    client: b.client.clone(),
                    filename: format!("{}_{what}.jsonl", b.id),
                    purpose: "batch_output".into(),
                    bytes: text.len() as i64,
                    created_at: now,
                };
                write_file(dir, &f.id, text.as_bytes()).map_err(db_error)?;
                Ok(Some(f))
            };
            let (output, errors) = (file(true, "output")?, file(false, "error")?);
            let tx = db.transaction().map_err(db_error)?;
            for f in output.iter().chain(errors.iter()) {
                store::insert_file(&tx, f).map_err(db_error)?;
            }
            let ids = (
                output.as_ref().map(|f| f.id.as_str()),
                errors.as_ref().map(|f| f.id.as_str()),
            );
            store::finish(&tx, &b.id, status, ids, None, now).map_err(db_error)?;
            tx.commit().map_err(db_error)
        })
        .await
}
