//! The Batch API's rows in the ledger's database (SQLite or PostgreSQL, [`crate::db`]): files
//! and their contents, batches, and each batch's lines — claimed by one process at a time
//! under a lease, and their result written in the same transaction as their state and their
//! batch's counts (so a line committed is never run again, and a restart finds every other).

use serde_json::{json, Value};

use super::input::Line;
use super::state::BatchState;
use crate::db::{Db, DbError, Row, Val};

/// A file as `/v1/files` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRow {
    pub id: String,
    pub(crate) client: String,
    pub(crate) filename: String,
    pub(crate) purpose: String,
    pub(crate) bytes: i64,
    pub(crate) created_at: i64,
}

impl FileRow {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": null,
            "status_details": null,
        })
    }

    fn of(r: &Row) -> Result<FileRow, DbError> {
        Ok(FileRow {
            id: r.text(0)?,
            client: r.text(1)?,
            filename: r.text(2)?,
            purpose: r.text(3)?,
            bytes: r.int(4)?,
            created_at: r.int(5)?,
        })
    }
}

const FILE_COLUMNS: &str = "id, client, filename, purpose, bytes, created_at";

/// Every status's name, in the order of a batch's life (for the gauge of batches by status).
pub const STATUSES: [&str; 8] = {
    let mut names = [""; 8];
    let mut i = 0;
    while i < names.len() {
        names[i] = BatchState::ALL[i].as_str();
        i += 1;
    }
    names
};

/// A batch as `/v1/batches` shows it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchRow {
    pub id: String,
    pub client: String,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: BatchState,
    /// JSON, as the client sent it.
    pub metadata: Option<String>,
    /// JSON: the validation errors' list.
    pub errors: Option<String>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: i64,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
}

const BATCH_COLUMNS: &str = "id, client, endpoint, input_file_id, completion_window, status, \
     metadata, errors, output_file_id, error_file_id, created_at, in_progress_at, expires_at, \
     finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at, total, \
     completed, failed";

impl BatchRow {
    pub fn to_json(&self) -> Value {
        let parsed = |s: &Option<String>| {
            s.as_deref()
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
                .unwrap_or(Value::Null)
        };
        let errors = match parsed(&self.errors) {
            Value::Null => Value::Null,
            data => json!({"object": "list", "data": data}),
        };
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.as_str(),
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "metadata": parsed(&self.metadata),
        })
    }

    fn of(r: &Row) -> Result<BatchRow, DbError> {
        Ok(BatchRow {
            id: r.text(0)?,
            client: r.text(1)?,
            endpoint: r.text(2)?,
            input_file_id: r.text(3)?,
            completion_window: r.text(4)?,
            status: r.text(5)?.parse().map_err(|e| DbError::Column {
                col: 5,
                found: format!("{e}"),
            })?,
            metadata: r.opt_text(6)?,
            errors: r.opt_text(7)?,
            output_file_id: r.opt_text(8)?,
            error_file_id: r.opt_text(9)?,
            created_at: r.int(10)?,
            in_progress_at: r.opt_int(11)?,
            expires_at: r.int(12)?,
            finalizing_at: r.opt_int(13)?,
            completed_at: r.opt_int(14)?,
            failed_at: r.opt_int(15)?,
            expired_at: r.opt_int(16)?,
            cancelling_at: r.opt_int(17)?,
            cancelled_at: r.opt_int(18)?,
            total: r.int(19)?,
            completed: r.int(20)?,
            failed: r.int(21)?,
        })
    }
}

/// A line to run, as the runner takes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pending {
    pub(crate) line: i64,
    pub(crate) custom_id: String,
    pub(crate) model: String,
    pub(crate) body: String,
    pub(crate) attempts: i64,
}

/// How a line's run ended, as it is committed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// Answered 2xx: its output line.
    Done(String),
    /// Answered otherwise, or given up: its error line.
    Failed(String),
    /// To run again, not before `not_before` ms (`counted`: the run counts against its retries).
    Again { not_before: i64, counted: bool },
}

type Done = Result<(), DbError>;

fn all<T>(rows: Vec<Row>, of: fn(&Row) -> Result<T, DbError>) -> Result<Vec<T>, DbError> {
    rows.iter().map(of).collect()
}

pub(crate) fn insert_file(db: &mut dyn Db, f: &FileRow) -> Done {
    let sql = format!("INSERT INTO batch_files ({FILE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)");
    let p = [
        (&f.id).into(),
        (&f.client).into(),
        (&f.filename).into(),
        (&f.purpose).into(),
        f.bytes.into(),
        f.created_at.into(),
    ];
    db.exec(&sql, &p).map(drop)
}

/// A file's content, where the database keeps it (PostgreSQL).
pub(crate) fn put_content(db: &mut dyn Db, id: &str, content: &[u8]) -> Done {
    let sql = "INSERT INTO batch_file_contents (id, content) VALUES ($1, $2)";
    db.exec(sql, &[id.into(), Val::Bytes(content.to_vec())])
        .map(drop)
}

pub(crate) fn content(db: &mut dyn Db, id: &str) -> Result<Option<Vec<u8>>, DbError> {
    let rows = db.rows(
        "SELECT content FROM batch_file_contents WHERE id = $1",
        &[id.into()],
    )?;
    rows.first().map(|r| r.bytes(0)).transpose()
}

pub(crate) fn file(db: &mut dyn Db, id: &str) -> Result<Option<FileRow>, DbError> {
    let sql = format!("SELECT {FILE_COLUMNS} FROM batch_files WHERE id = $1");
    let rows = db.rows(&sql, &[id.into()])?;
    rows.first().map(FileRow::of).transpose()
}

/// Files of `client` (all: `None`), of `purpose` when one is given, newest first (`asc`:
/// oldest), after the one `after` names, at most `limit`.
pub(crate) fn files(
    db: &mut dyn Db,
    client: Option<&str>,
    purpose: Option<&str>,
    after: Option<&str>,
    asc: bool,
    limit: i64,
) -> Result<Vec<FileRow>, DbError> {
    let (cmp, dir) = if asc { (">", "ASC") } else { ("<", "DESC") };
    // Ids are made in order: their order is the files' (newest last).
    let sql = format!(
        "SELECT {FILE_COLUMNS} FROM batch_files WHERE (CAST($1 AS TEXT) IS NULL OR client = $1) \
         AND (CAST($2 AS TEXT) IS NULL OR purpose = $2) AND (CAST($3 AS TEXT) IS NULL OR id {cmp} $3) \
         ORDER BY id {dir} LIMIT $4"
    );
    let p = [client.into(), purpose.into(), after.into(), limit.into()];
    all(db.rows(&sql, &p)?, FileRow::of)
}

/// The file's row and its content (where the database keeps it) are deleted.
pub(crate) fn delete_file(db: &mut dyn Db, id: &str) -> Done {
    db.exec("DELETE FROM batch_files WHERE id = $1", &[id.into()])?;
    db.exec(
        "DELETE FROM batch_file_contents WHERE id = $1",
        &[id.into()],
    )
    .map(drop)
}

/// How many files `client` keeps, and their bytes.
pub(crate) fn kept(db: &mut dyn Db, client: &str) -> Result<(i64, i64), DbError> {
    let sql = "SELECT count(*), CAST(coalesce(sum(bytes), 0) AS BIGINT) FROM batch_files \
               WHERE client = $1";
    let r = db.one(sql, &[client.into()])?;
    Ok((r.int(0)?, r.int(1)?))
}

pub(crate) fn insert_batch(db: &mut dyn Db, b: &BatchRow) -> Done {
    let sql = "INSERT INTO batches (id, client, endpoint, input_file_id, completion_window, \
               status, metadata, created_at, expires_at, total, completed, failed) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, 0, 0)";
    let p = [
        (&b.id).into(),
        (&b.client).into(),
        (&b.endpoint).into(),
        (&b.input_file_id).into(),
        (&b.completion_window).into(),
        b.status.as_str().into(),
        b.metadata.as_deref().into(),
        b.created_at.into(),
        b.expires_at.into(),
    ];
    db.exec(sql, &p).map(drop)
}

pub(crate) fn batch(db: &mut dyn Db, id: &str) -> Result<Option<BatchRow>, DbError> {
    let sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = $1");
    let rows = db.rows(&sql, &[id.into()])?;
    rows.first().map(BatchRow::of).transpose()
}

/// Batches of `client` (all: `None`), newest first, after the one `after` names, at most
/// `limit`.
pub(crate) fn batches(
    db: &mut dyn Db,
    client: Option<&str>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<BatchRow>, DbError> {
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM batches WHERE (CAST($1 AS TEXT) IS NULL OR client = $1) \
         AND (CAST($2 AS TEXT) IS NULL OR id < $2) ORDER BY id DESC LIMIT $3"
    );
    all(
        db.rows(&sql, &[client.into(), after.into(), limit.into()])?,
        BatchRow::of,
    )
}

/// Batches not yet in a final status, oldest first.
pub(crate) fn active(db: &mut dyn Db) -> Result<Vec<BatchRow>, DbError> {
    let active = active_states();
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM batches WHERE status IN ({}) ORDER BY id",
        listed(&active, 1)
    );
    let p: Vec<Val> = active.iter().map(|s| s.as_str().into()).collect();
    all(db.rows(&sql, &p)?, BatchRow::of)
}

/// The statuses of a batch not yet ended.
fn active_states() -> Vec<BatchState> {
    BatchState::ALL.into_iter().filter(|s| s.active()).collect()
}

/// Batches of `client` not yet in a final status.
pub(crate) fn active_of(db: &mut dyn Db, client: &str) -> Result<i64, DbError> {
    let active = active_states();
    let sql = format!(
        "SELECT count(*) FROM batches WHERE client = $1 AND status IN ({})",
        listed(&active, 2)
    );
    let mut p = vec![client.into()];
    p.extend(active.iter().map(|s| Val::from(s.as_str())));
    db.one(&sql, &p)?.int(0)
}

/// Batches by status.
pub(crate) fn by_status(db: &mut dyn Db) -> Result<Vec<(String, i64)>, DbError> {
    let rows = db.rows("SELECT status, count(*) FROM batches GROUP BY status", &[])?;
    rows.iter().map(|r| Ok((r.text(0)?, r.int(1)?))).collect()
}

/// The batch's lines are stored and it is in progress (in the transaction `db` is): `false`
/// when it was no longer validating (another process took it first).
pub(crate) fn start(db: &mut dyn Db, id: &str, lines: &[Line], now: i64) -> Result<bool, DbError> {
    let total = lines.len() as i64;
    if !moved(
        db,
        id,
        BatchState::InProgress,
        Some(("total", total.into())),
        now,
    )? {
        return Ok(false);
    }
    let insert = "INSERT INTO batch_lines (batch_id, line, custom_id, model, body, state, \
                  attempts, not_before) VALUES ($1, $2, $3, $4, $5, 'pending', 0, 0)";
    for l in lines {
        let p = [
            id.into(),
            (l.line as i64).into(),
            (&l.custom_id).into(),
            (&l.model).into(),
            (&l.body).into(),
        ];
        db.exec(insert, &p)?;
    }
    Ok(true)
}

/// The batch ends as `to` (at `now`, in that status's time column), with its files and its
/// validation errors (JSON) when it has them, if it may move there from its status now:
/// whether it did.
pub(crate) fn finish(
    db: &mut dyn Db,
    id: &str,
    to: BatchState,
    files: (Option<&str>, Option<&str>),
    errors: Option<&str>,
    now: i64,
) -> Result<bool, DbError> {
    let sql = format!(
        "UPDATE batches SET status = $1, {} = $2, output_file_id = $3, error_file_id = $4, \
         errors = coalesce($5, errors) WHERE id = $6 AND status IN ({})",
        to.time_column(),
        listed(&to.sources(), 7)
    );
    let mut p = vec![
        to.as_str().into(),
        now.into(),
        files.0.into(),
        files.1.into(),
        errors.into(),
        id.into(),
    ];
    p.extend(to.sources().iter().map(|s| Val::from(s.as_str())));
    Ok(db.exec(&sql, &p)? == 1)
}

/// `$n, $n+1, …` for each of `items`.
fn listed<T>(items: &[T], n: usize) -> String {
    (0..items.len())
        .map(|i| format!("${}", n + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The batch moves to `to` if it may from its status now (its time column set to `now`);
/// whether it did.
pub(crate) fn advance(
    db: &mut dyn Db,
    id: &str,
    to: BatchState,
    now: i64,
) -> Result<bool, DbError> {
    moved(db, id, to, None, now)
}

/// [`advance`], with one more column set where `also` names one.
fn moved(
    db: &mut dyn Db,
    id: &str,
    to: BatchState,
    also: Option<(&str, Val)>,
    now: i64,
) -> Result<bool, DbError> {
    let from = to.sources();
    let mut p = vec![to.as_str().into(), now.into()];
    let also = match also {
        Some((column, v)) => {
            p.push(v);
            format!(", {column} = $3")
        }
        None => String::new(),
    };
    let n = p.len();
    let sql = format!(
        "UPDATE batches SET status = $1, {} = $2{also} WHERE id = ${} AND status IN ({})",
        to.time_column(),
        n + 1,
        listed(&from, n + 2)
    );
    p.push(id.into());
    p.extend(from.iter().map(|s| Val::from(s.as_str())));
    Ok(db.exec(&sql, &p)? == 1)
}

/// Up to `limit` lines of the batch to run at `now_ms`, in their order, claimed for `owner`
/// until `lease_until` ms: pending ones due, and running ones whose lease ran out (their
/// process is gone). `shared`: other processes may claim at once (PostgreSQL: rows another
/// claims are skipped, not waited for).
#[allow(clippy::too_many_arguments)]
pub(crate) fn claim(
    db: &mut dyn Db,
    id: &str,
    now_ms: i64,
    owner: &str,
    lease_until: i64,
    limit: usize,
    shared: bool,
) -> Result<Vec<Pending>, DbError> {
    let lock = if shared {
        " FOR UPDATE SKIP LOCKED"
    } else {
        ""
    };
    // The lines picked once, in a CTE (PostgreSQL evaluates a locking one once; a subquery in
    // the WHERE clause may be run again per row and pick more).
    let sql = format!(
        "WITH picked AS (SELECT line FROM batch_lines WHERE batch_id = $1 \
         AND ((state = 'pending' AND not_before <= $2) OR (state = 'running' AND lease_until < $2)) \
         ORDER BY line LIMIT $3{lock}) \
         UPDATE batch_lines SET state = 'running', owner = $4, lease_until = $5 \
         WHERE batch_id = $1 AND line IN (SELECT line FROM picked) \
         RETURNING line, custom_id, model, body, attempts"
    );
    let p = [
        id.into(),
        now_ms.into(),
        (limit as i64).into(),
        owner.into(),
        lease_until.into(),
    ];
    let mut got = all(db.rows(&sql, &p)?, |r| {
        Ok(Pending {
            line: r.int(0)?,
            custom_id: r.text(1)?,
            model: r.text(2)?,
            body: r.text(3)?,
            attempts: r.int(4)?,
        })
    })?;
    got.sort_by_key(|p| p.line);
    Ok(got)
}

/// The lines `owner` runs hold their claims until `lease_until` ms.
pub(crate) fn renew(db: &mut dyn Db, owner: &str, lease_until: i64) -> Done {
    let sql = "UPDATE batch_lines SET lease_until = $1 WHERE owner = $2 AND state = 'running'";
    db.exec(sql, &[lease_until.into(), owner.into()]).map(drop)
}

/// Lines `owner` claimed and stopped running (cancelled, or the process starting again on a
/// file no other shares) are pending again.
pub(crate) fn release(db: &mut dyn Db, owner: Option<&str>, id: Option<&str>) -> Done {
    let sql = "UPDATE batch_lines SET state = 'pending', owner = NULL, lease_until = NULL \
               WHERE state = 'running' AND (CAST($1 AS TEXT) IS NULL OR owner = $1) \
               AND (CAST($2 AS TEXT) IS NULL OR batch_id = $2)";
    db.exec(sql, &[owner.into(), id.into()]).map(drop)
}

/// Lines of the batch still to run (now or later), and of those, running under a lease
/// current at `now_ms`.
pub(crate) fn left(db: &mut dyn Db, id: &str, now_ms: i64) -> Result<(i64, i64), DbError> {
    let sql = "SELECT count(*), CAST(coalesce(sum(CASE WHEN state = 'running' AND \
               lease_until >= $1 THEN 1 ELSE 0 END), 0) AS BIGINT) FROM batch_lines \
               WHERE batch_id = $2 AND state IN ('pending', 'running')";
    let r = db.one(sql, &[now_ms.into(), id.into()])?;
    Ok((r.int(0)?, r.int(1)?))
}

/// A line's run, claimed by `owner`, is committed: its state and result, with its batch's
/// counts, in the transaction `db` is. `false` when its claim was lost (another process took
/// it after its lease ran out): nothing is written.
pub(crate) fn commit(
    db: &mut dyn Db,
    id: &str,
    line: i64,
    owner: &str,
    attempts: i64,
    outcome: &Outcome,
) -> Result<bool, DbError> {
    let (state, result, not_before, count) = match outcome {
        Outcome::Done(r) => ("done", Some(r.as_str()), 0, Some("completed")),
        Outcome::Failed(r) => ("failed", Some(r.as_str()), 0, Some("failed")),
        Outcome::Again { not_before, .. } => ("pending", None, *not_before, None),
    };
    let sql = "UPDATE batch_lines SET state = $1, result = $2, attempts = $3, not_before = $4, \
               owner = NULL, lease_until = NULL \
               WHERE batch_id = $5 AND line = $6 AND state = 'running' AND owner = $7";
    let p = [
        state.into(),
        result.into(),
        attempts.into(),
        not_before.into(),
        id.into(),
        line.into(),
        owner.into(),
    ];
    if db.exec(sql, &p)? != 1 {
        return Ok(false);
    }
    if let Some(count) = count {
        let sql = format!("UPDATE batches SET {count} = {count} + 1 WHERE id = $1");
        db.exec(&sql, &[id.into()])?;
    }
    Ok(true)
}

/// Every line left to run fails with `result` made of its custom_id (a batch that expired or
/// was cancelled: its lines not run go to its error file as such).
pub(crate) fn fail_left(db: &mut dyn Db, id: &str, result: &dyn Fn(&str) -> String) -> Done {
    let sql = "SELECT line, custom_id FROM batch_lines \
               WHERE batch_id = $1 AND state IN ('pending', 'running')";
    let left = db.rows(sql, &[id.into()])?;
    for r in &left {
        let (line, custom_id) = (r.int(0)?, r.text(1)?);
        let sql = "UPDATE batch_lines SET state = 'failed', result = $1, owner = NULL, \
                   lease_until = NULL WHERE batch_id = $2 AND line = $3";
        db.exec(
            sql,
            &[Val::Text(result(&custom_id)), id.into(), line.into()],
        )?;
    }
    let sql = "UPDATE batches SET failed = failed + $1 WHERE id = $2";
    db.exec(sql, &[Val::Int(left.len() as i64), id.into()])
        .map(drop)
}

/// The results of the batch's lines in their order: `(done, result)`.
pub(crate) fn results(db: &mut dyn Db, id: &str) -> Result<Vec<(bool, String)>, DbError> {
    let sql = "SELECT state, result FROM batch_lines WHERE batch_id = $1 \
               AND state IN ('done', 'failed') ORDER BY line";
    let rows = db.rows(sql, &[id.into()])?;
    rows.iter()
        .map(|r| Ok((r.text(0)? == "done", r.opt_text(1)?.unwrap_or_default())))
        .collect()
}

#[cfg(test)]
mod tests;
