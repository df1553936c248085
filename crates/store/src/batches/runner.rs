//! The batch runner: one task for the process that validates new batches, runs their lines
//! through the pipeline it is handed ([`Serve`]) — at most `max_concurrent` of a batch and
//! `max_concurrent_per_client` of a client's at once, each as a request of the `idle` class —
//! commits each line's result with its state, and ends batches: completed when every line
//! has its result, expired at the end of their window, cancelled when asked, with their
//! output and error files written. After a restart it goes on from what was committed.
//!
//! Several processes may run one PostgreSQL database's batches: a process claims the lines
//! it runs, under a lease (`batches.lease_ms`) it renews each second while they run; a line whose
//! lease ran out (its process is gone) is claimed again by another. A batch is validated
//! and ended by whichever process gets there first, in one transaction.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::task::{AbortHandle, Id, JoinSet};

use super::result::{decide, unanswered, Answer};
use super::store::{self, BatchRow, FileRow, Outcome};
use super::{db_error, hex_id, now_s, BatchError, BatchState, Batches, Bounds};
use crate::db::{Db, DbError};
use switchboard_wire::error::ProxyError;

/// What the runner needs of the proxy: a line served, what a client may use, the bounds of
/// `[batches]` now, and where its figures go.
pub trait Serve: Send + Sync + 'static {
    /// One line of `client`'s batch to `endpoint`, answered whole.
    fn line(&self, client: &str, endpoint: &str, body: Bytes) -> BoxFuture<'static, Answer>;
    /// Whether `model` names an alias `client` may use.
    fn usable(&self, client: &str, model: &str) -> bool;
    /// The most bytes a line's body may have (`server.body_limit_bytes`).
    fn body_limit(&self) -> usize;
    fn limits(&self) -> Bounds;
    /// A line's run ended: `outcome` is `completed`, `failed`, `retried` or `deferred`.
    fn counted(&self, alias: &str, client: &str, outcome: &'static str);
    /// Batches by status, every status.
    fn statuses(&self, by: &[(String, i64)]);
}

/// A line running here: its batch, its client, and how to stop it.
struct Running {
    batch: String,
    client: String,
    abort: AbortHandle,
}

/// The lines this process runs.
#[derive(Default)]
struct Lines {
    tasks: JoinSet<()>,
    running: HashMap<Id, Running>,
}

impl Lines {
    fn of_batch(&self, id: &str) -> u64 {
        self.running.values().filter(|r| r.batch == id).count() as u64
    }

    fn of_client(&self, client: &str) -> u64 {
        self.running.values().filter(|r| r.client == client).count() as u64
    }

    /// Its lines of batch `id` are stopped (their requests cut); whether any ran.
    fn stop(&mut self, id: &str) -> bool {
        let mut stopped = false;
        for r in self.running.values().filter(|r| r.batch == id) {
            r.abort.abort();
            stopped = true;
        }
        stopped
    }

    fn ended(&mut self, done: Result<(Id, ()), tokio::task::JoinError>) {
        let id = match done {
            Ok((id, ())) => id,
            Err(e) => e.id(),
        };
        self.running.remove(&id);
    }
}

/// Runs batches until the process ends.
pub async fn run(batches: Arc<Batches>, serve: Arc<dyn Serve>) {
    let mut lines = Lines::default();
    loop {
        let limits = serve.limits();
        if let Err(e) = step(&batches, &serve, &limits, &mut lines).await {
            tracing::warn!(error = %e, "batch runner: the ledger cannot be used now");
        }
        // A look a second, or as often as a line may run again.
        let every = limits.retry_after.min(Duration::from_secs(1));
        tokio::select! {
            () = batches.wake.notified() => {}
            Some(done) = lines.tasks.join_next_with_id(), if !lines.tasks.is_empty() => {
                lines.ended(done);
            }
            () = tokio::time::sleep(every) => {}
        }
        while let Some(done) = lines.tasks.try_join_next_with_id() {
            lines.ended(done);
        }
    }
}

/// One look at every batch not yet ended.
async fn step(
    batches: &Arc<Batches>,
    serve: &Arc<dyn Serve>,
    limits: &Bounds,
    lines: &mut Lines,
) -> Result<(), ProxyError> {
    let owner = batches.owner.clone();
    let renew = !lines.running.is_empty();
    let lease = limits.lease.as_millis() as i64;
    let (active, by) = batches
        .runner
        .run(move |db, _| {
            if renew {
                let until = crate::ledger::now_ms() + lease;
                store::renew(db, &owner, until).map_err(db_error)?;
            }
            let active = store::active(db).map_err(db_error)?;
            let by = store::by_status(db).map_err(db_error)?;
            Ok((active, by))
        })
        .await?;
    serve.statuses(&by);
    batches.set_active(active.clone());
    let now = now_s();
    for b in active {
        let ending = match b.status {
            BatchState::Validating => {
                validate(batches, serve, &b, limits).await?;
                continue;
            }
            BatchState::Cancelling => Some(BatchState::Cancelled),
            BatchState::InProgress if now >= b.expires_at => Some(BatchState::Expired),
            BatchState::Finalizing => Some(BatchState::Completed),
            BatchState::InProgress
            | BatchState::Completed
            | BatchState::Failed
            | BatchState::Expired
            | BatchState::Cancelled => None,
        };
        if let Some(status) = ending {
            // Its lines here stop (their upstream requests are cut) and are given up; it ends
            // once no process runs one.
            if lines.stop(&b.id) {
                let (owner, id) = (batches.owner.clone(), b.id.clone());
                batches
                    .runner
                    .run(move |db, _| store::release(db, Some(&owner), Some(&id)).map_err(db_error))
                    .await?;
                continue;
            }
            let id = b.id.clone();
            let (_, elsewhere) = batches
                .runner
                .run(move |db, _| store::left(db, &id, crate::ledger::now_ms()).map_err(db_error))
                .await?;
            if elsewhere == 0 {
                end(batches, &b, status).await?;
            }
            continue;
        }
        let free = limits
            .max_concurrent
            .saturating_sub(lines.of_batch(&b.id))
            .min(
                limits
                    .max_concurrent_per_client
                    .saturating_sub(lines.of_client(&b.client)),
            );
        let (id, owner) = (b.id.clone(), batches.owner.clone());
        let (claimed, left) = batches
            .runner
            .run(move |db, _| {
                let now_ms = crate::ledger::now_ms();
                let until = now_ms + lease;
                let shared = db.shared();
                let claimed = match free {
                    0 => Vec::new(),
                    n => store::claim(db, &id, now_ms, &owner, until, n as usize, shared)
                        .map_err(db_error)?,
                };
                Ok((claimed, store::left(db, &id, now_ms).map_err(db_error)?.0))
            })
            .await?;
        tracing::debug!(batch = %b.id, free, claimed = claimed.len(), left, "batch lines claimed");
        if left == 0 && lines.of_batch(&b.id) == 0 {
            end(batches, &b, BatchState::Completed).await?;
            continue;
        }
        for p in claimed {
            let job = run_line(Arc::clone(batches), Arc::clone(serve), &b, p, limits);
            let abort = lines.tasks.spawn(job);
            let running = Running {
                batch: b.id.clone(),
                client: b.client.clone(),
                abort,
            };
            lines.running.insert(running.abort.id(), running);
        }
    }
    Ok(())
}

/// One run of line `p` of batch `b`, claimed by this process: served, decided, committed,
/// counted.
fn run_line(
    batches: Arc<Batches>,
    serve: Arc<dyn Serve>,
    b: &BatchRow,
    p: store::Pending,
    limits: &Bounds,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (id, client, endpoint) = (b.id.clone(), b.client.clone(), b.endpoint.clone());
    let (retries, retry_after) = (limits.line_retries, limits.retry_after.as_millis() as i64);
    async move {
        let attempts = p.attempts + 1;
        let answer = serve.line(&client, &endpoint, Bytes::from(p.body)).await;
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
        match commit(&batches, &id, p.line, attempts, outcome).await {
            true => serve.counted(&p.model, &client, label),
            false => {
                tracing::warn!(
                    line = p.line,
                    "batch line's claim was lost; its result is not kept"
                )
            }
        }
    }
}

/// The first wait before a result whose commit failed is committed again, and the longest
/// (the wait doubles from one to the other).
const RECOMMIT: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// The `outcome` of line `line` of batch `id`, its `attempts`-th run, committed on the results'
/// own way to the database the moment it is had — again and again while the database fails
/// (its answer is lost only with the process); `false` when its claim was lost.
async fn commit(
    batches: &Arc<Batches>,
    id: &str,
    line: i64,
    attempts: i64,
    outcome: Outcome,
) -> bool {
    let outcome = Arc::new(outcome);
    let mut wait = RECOMMIT.0;
    loop {
        let (id, owner, outcome) = (id.to_string(), batches.owner.clone(), Arc::clone(&outcome));
        let committed = batches
            .results
            .run(move |db, _| {
                db.tx(|tx| store::commit(tx, &id, line, &owner, attempts, &outcome))
                    .map_err(db_error)
            })
            .await;
        match committed {
            Ok(kept) => return kept,
            Err(e) => {
                tracing::warn!(error = %e, line, retry_in = ?wait, "batch line's result not committed");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RECOMMIT.1);
            }
        }
    }
}

/// A new batch's input read and checked: its lines stored and the batch in progress, or the
/// batch failed with the errors found (by whichever process gets there first).
async fn validate(
    batches: &Arc<Batches>,
    serve: &Arc<dyn Serve>,
    b: &BatchRow,
    limits: &Bounds,
) -> Result<(), ProxyError> {
    let (b, serve, max_lines) = (b.clone(), Arc::clone(serve), limits.max_lines);
    let max_body = serve.body_limit();
    batches
        .runner
        .run(move |db, files| {
            let now = now_s();
            let failed = |db: &mut dyn Db, errors: Vec<serde_json::Value>| {
                let errors = serde_json::Value::from(errors).to_string();
                let ids = (None, None);
                let to = BatchState::Failed;
                store::finish(db, &b.id, to, ids, Some(&errors), now).map(drop)
            };
            let Ok(text) = files.get(db, &b.input_file_id) else {
                let e = super::input::LineError {
                    code: "invalid_request",
                    message: format!("the input file {} is gone", b.input_file_id),
                    param: Some("input_file_id"),
                    line: None,
                };
                return failed(db, vec![e.to_json()]).map_err(db_error);
            };
            let usable = |model: &str| serve.usable(&b.client, model);
            match super::input::read(&text, &b.endpoint, max_lines, max_body, &usable) {
                Ok(lines) => db
                    .tx(|tx| store::start(tx, &b.id, &lines, now).map(drop))
                    .map_err(|e: DbError| db_error(e)),
                Err(errors) => {
                    failed(db, errors.iter().map(|e| e.to_json()).collect()).map_err(db_error)
                }
            }
        })
        .await
}

/// Batch `b` ends as `status`: its lines not run go to its error file as such, its output and
/// error files are written, and its status, files and time are committed together — unless
/// another process ended it first.
async fn end(batches: &Arc<Batches>, b: &BatchRow, status: BatchState) -> Result<(), ProxyError> {
    let b = b.clone();
    batches
        .runner
        .run(move |db, files| {
            let now = now_s();
            let (code, message) = unrun(status);
            let ended = db.tx(|tx| {
                store::advance(tx, &b.id, BatchState::Finalizing, now)?;
                store::fail_left(tx, &b.id, &|custom_id| unanswered(custom_id, code, message))?;
                let results = store::results(tx, &b.id)?;
                let mut file = |done: bool, what: &str| -> Result<Option<String>, BatchError> {
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
                    files.put(tx, &f.id, text.as_bytes())?;
                    store::insert_file(tx, &f)?;
                    Ok(Some(f.id))
                };
                let (output, errors) = (file(true, "output")?, file(false, "error")?);
                let ids = (output.as_deref(), errors.as_deref());
                match store::finish(tx, &b.id, status, ids, None, now)? {
                    true => Ok(()),
                    false => Err(BatchError::EndedElsewhere),
                }
            });
            match ended {
                Err(BatchError::EndedElsewhere) => Ok(()),
                other => other.map_err(db_error),
            }
        })
        .await
}

/// The error a line not run gets when its batch ends as `status`: its code and message.
fn unrun(status: BatchState) -> (&'static str, &'static str) {
    match status {
        BatchState::Expired => (
            "batch_expired",
            "the batch's window ended before this request ran",
        ),
        BatchState::Cancelled => (
            "batch_cancelled",
            "the batch was cancelled before this request ran",
        ),
        BatchState::Validating
        | BatchState::InProgress
        | BatchState::Finalizing
        | BatchState::Completed
        | BatchState::Failed
        | BatchState::Cancelling => ("batch_failed", "the request was not run"),
    }
}
