//! The Batch API's rows in the ledger's SQLite database: files, batches, and each batch's
//! lines, whose result is written in the same transaction as its state and its batch's
//! counts (so a line committed is never run again, and a restart finds every other one).

use rusqlite::{params, Connection, OptionalExtension, Row, Transaction};
use serde_json::{json, Value};

use super::input::Line;

/// A file as `/v1/files` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRow {
    pub id: String,
    pub client: String,
    pub filename: String,
    pub purpose: String,
    pub bytes: i64,
    pub created_at: i64,
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

    fn of(r: &Row<'_>) -> rusqlite::Result<FileRow> {
        Ok(FileRow {
            id: r.get(0)?,
            client: r.get(1)?,
            filename: r.get(2)?,
            purpose: r.get(3)?,
            bytes: r.get(4)?,
            created_at: r.get(5)?,
        })
    }
}

const FILE_COLUMNS: &str = "id, client, filename, purpose, bytes, created_at";

/// A batch's status.
pub const VALIDATING: &str = "validating";
pub const IN_PROGRESS: &str = "in_progress";
pub const FINALIZING: &str = "finalizing";
pub const COMPLETED: &str = "completed";
pub const FAILED: &str = "failed";
pub const EXPIRED: &str = "expired";
pub const CANCELLING: &str = "cancelling";
pub const CANCELLED: &str = "cancelled";

/// Every status, in the order of a batch's life (for the gauge of batches by status).
pub const STATUSES: [&str; 8] = [
    VALIDATING,
    IN_PROGRESS,
    FINALIZING,
    COMPLETED,
    FAILED,
    EXPIRED,
    CANCELLING,
    CANCELLED,
];

/// A batch as `/v1/batches` shows it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchRow {
    pub id: String,
    pub client: String,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: String,
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
            "status": self.status,
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

    /// Whether it still runs or is to be finished (not in a final status).
    pub fn active(&self) -> bool {
        [VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING].contains(&self.status.as_str())
    }

    fn of(r: &Row<'_>) -> rusqlite::Result<BatchRow> {
        Ok(BatchRow {
            id: r.get(0)?,
            client: r.get(1)?,
            endpoint: r.get(2)?,
            input_file_id: r.get(3)?,
            completion_window: r.get(4)?,
            status: r.get(5)?,
            metadata: r.get(6)?,
            errors: r.get(7)?,
            output_file_id: r.get(8)?,
            error_file_id: r.get(9)?,
            created_at: r.get(10)?,
            in_progress_at: r.get(11)?,
            expires_at: r.get(12)?,
            finalizing_at: r.get(13)?,
            completed_at: r.get(14)?,
            failed_at: r.get(15)?,
            expired_at: r.get(16)?,
            cancelling_at: r.get(17)?,
            cancelled_at: r.get(18)?,
            total: r.get(19)?,
            completed: r.get(20)?,
            failed: r.get(21)?,
        })
    }
}

/// A line to run, as the runner takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub line: i64,
    pub custom_id: String,
    pub model: String,
    pub body: String,
    pub attempts: i64,
}

/// How a line's run ended, as it is committed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Answered 2xx: its output line.
    Done(String),
    /// Answered otherwise, or given up: its error line.
    Failed(String),
    /// To run again, not before `not_before` ms (`counted`: the run counts against its retries).
    Again { not_before: i64, counted: bool },
}

type Db = rusqlite::Result<()>;

pub fn insert_file(c: &Connection, f: &FileRow) -> Db {
    c.execute(
        &format!("INSERT INTO batch_files ({FILE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"),
        params![f.id, f.client, f.filename, f.purpose, f.bytes, f.created_at],
    )
    .map(drop)
}

pub fn file(c: &Connection, id: &str) -> rusqlite::Result<Option<FileRow>> {
    c.query_row(
        &format!("SELECT {FILE_COLUMNS} FROM batch_files WHERE id = $1"),
        [id],
        FileRow::of,
    )
    .optional()
}

/// Files of `client` (all: `None`), of `purpose` when one is given, newest first (`asc`:
/// oldest), after the one `after` names, at most `limit`.
pub fn files(
    c: &Connection,
    client: Option<&str>,
    purpose: Option<&str>,
    after: Option<&FileRow>,
    asc: bool,
    limit: i64,
) -> rusqlite::Result<Vec<FileRow>> {
    let (cmp, dir) = if asc { (">", "ASC") } else { ("<", "DESC") };
    // Ids are made in order: their order is the files' (newest last).
    let sql = format!(
        "SELECT {FILE_COLUMNS} FROM batch_files WHERE ($1 IS NULL OR client = $1) \
         AND ($2 IS NULL OR purpose = $2) AND ($3 IS NULL OR id {cmp} $3) \
         ORDER BY id {dir} LIMIT $4"
    );
    let mut stmt = c.prepare(&sql)?;
    let rows = stmt.query_map(
        params![client, purpose, after.map(|f| f.id.as_str()), limit],
        FileRow::of,
    )?;
    rows.collect()
}

pub fn delete_file(c: &Connection, id: &str) -> Db {
    c.execute("DELETE FROM batch_files WHERE id = $1", [id])
        .map(drop)
}

/// How many files `client` keeps, and their bytes.
pub fn kept(c: &Connection, client: &str) -> rusqlite::Result<(i64, i64)> {
    c.query_row(
        "SELECT count(*), coalesce(sum(bytes), 0) FROM batch_files WHERE client = $1",
        [client],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

pub fn insert_batch(c: &Connection, b: &BatchRow) -> Db {
    c.execute(
        "INSERT INTO batches (id, client, endpoint, input_file_id, completion_window, status, \
         metadata, created_at, expires_at, total, completed, failed) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, 0, 0)",
        params![
            b.id,
            b.client,
            b.endpoint,
            b.input_file_id,
            b.completion_window,
            b.status,
            b.metadata,
            b.created_at,
            b.expires_at
        ],
    )
    .map(drop)
}

pub fn batch(c: &Connection, id: &str) -> rusqlite::Result<Option<BatchRow>> {
    c.query_row(
        &format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = $1"),
        [id],
        BatchRow::of,
    )
    .optional()
}

/// Batches of `client` (all: `None`), newest first, after the one `after` names, at most
/// `limit`.
pub fn batches(
    c: &Connection,
    client: Option<&str>,
    after: Option<&BatchRow>,
    limit: i64,
) -> rusqlite::Result<Vec<BatchRow>> {
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM batches WHERE ($1 IS NULL OR client = $1) \
         AND ($2 IS NULL OR id < $2) ORDER BY id DESC LIMIT $3"
    );
    let mut stmt = c.prepare(&sql)?;
    let rows = stmt.query_map(
        params![client, after.map(|b| b.id.as_str()), limit],
        BatchRow::of,
    )?;
    rows.collect()
}

/// Batches not yet in a final status, oldest first.
pub fn active(c: &Connection) -> rusqlite::Result<Vec<BatchRow>> {
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM batches WHERE status IN ($1, $2, $3, $4) \
         ORDER BY id"
    );
    let mut stmt = c.prepare(&sql)?;
    let rows = stmt.query_map(
        params![VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING],
        BatchRow::of,
    )?;
    rows.collect()
}

/// Batches by status, every status counted (0 for none).
pub fn by_status(c: &Connection) -> rusqlite::Result<Vec<(String, i64)>> {
    let mut stmt = c.prepare("SELECT status, count(*) FROM batches GROUP BY status")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// The batch's lines are stored and it is in progress (one transaction).
pub fn start(c: &mut Connection, id: &str, lines: &[Line], now: i64) -> Db {
    let tx = c.transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO batch_lines (batch_id, line, custom_id, model, body, state, attempts, \
             not_before, result) VALUES ($1, $2, $3, $4, $5, 'pending', 0, 0, NULL)",
        )?;
        for l in lines {
            insert.execute(params![id, l.line as i64, l.custom_id, l.model, l.body])?;
        }
    }
    tx.execute(
        "UPDATE batches SET status = $1, in_progress_at = $2, total = $3 WHERE id = $4",
        params![IN_PROGRESS, now, lines.len() as i64, id],
    )?;
    tx.commit()
}

/// The batch ends as `status` (at `now`, in that status's time column), with its files and
/// its validation errors (JSON) when it has them.
pub fn finish(
    c: &Connection,
    id: &str,
    status: &'static str,
    files: (Option<&str>, Option<&str>),
    errors: Option<&str>,
    now: i64,
) -> Db {
    let at = match status {
        COMPLETED => "completed_at",
        FAILED => "failed_at",
        EXPIRED => "expired_at",
        CANCELLED => "cancelled_at",
        _ => "finalizing_at",
    };
    c.execute(
        &format!(
            "UPDATE batches SET status = $1, {at} = $2, output_file_id = $3, error_file_id = $4, \
             errors = coalesce($5, errors) WHERE id = $6"
        ),
        params![status, now, files.0, files.1, errors, id],
    )
    .map(drop)
}

/// The batch moves to `status` from one of `from` (its time column set to `now`); whether it
/// did.
pub fn advance(
    c: &Connection,
    id: &str,
    from: &[&str],
    status: &str,
    now: i64,
) -> rusqlite::Result<bool> {
    let at = match status {
        CANCELLING => "cancelling_at",
        _ => "finalizing_at",
    };
    let list = from
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let n = c.execute(
        &format!("UPDATE batches SET status = $1, {at} = $2 WHERE id = $3 AND status IN ({list})"),
        params![status, now, id],
    )?;
    Ok(n == 1)
}

/// Up to `limit` lines of the batch to run at `now_ms`, in their order, none of `running`.
pub fn pending(
    c: &Connection,
    id: &str,
    now_ms: i64,
    running: &[i64],
    limit: usize,
) -> rusqlite::Result<Vec<Pending>> {
    let mut stmt = c.prepare_cached(
        "SELECT line, custom_id, model, body, attempts FROM batch_lines \
         WHERE batch_id = $1 AND state = 'pending' AND not_before <= $2 ORDER BY line LIMIT $3",
    )?;
    let want = (limit + running.len()) as i64;
    let rows = stmt.query_map(params![id, now_ms, want], |r| {
        Ok(Pending {
            line: r.get(0)?,
            custom_id: r.get(1)?,
            model: r.get(2)?,
            body: r.get(3)?,
            attempts: r.get(4)?,
        })
    })?;
    let mut out = Vec::new();
    for p in rows {
        let p = p?;
        if !running.contains(&p.line) && out.len() < limit {
            out.push(p);
        }
    }
    Ok(out)
}

/// Lines of the batch still to run (now or later).
pub fn left(c: &Connection, id: &str) -> rusqlite::Result<i64> {
    c.query_row(
        "SELECT count(*) FROM batch_lines WHERE batch_id = $1 AND state = 'pending'",
        [id],
        |r| r.get(0),
    )
}

/// A line's run is committed: its state and result, with its batch's counts, at once.
pub fn commit(c: &mut Connection, id: &str, line: i64, attempts: i64, outcome: &Outcome) -> Db {
    let tx = c.transaction()?;
    commit_in(&tx, id, line, attempts, outcome)?;
    tx.commit()
}

fn commit_in(tx: &Transaction<'_>, id: &str, line: i64, attempts: i64, outcome: &Outcome) -> Db {
    let (state, result, not_before, count) = match outcome {
        Outcome::Done(r) => ("done", Some(r.as_str()), 0, Some("completed")),
        Outcome::Failed(r) => ("failed", Some(r.as_str()), 0, Some("failed")),
        Outcome::Again { not_before, .. } => ("pending", None, *not_before, None),
    };
    tx.execute(
        "UPDATE batch_lines SET state = $1, result = $2, attempts = $3, not_before = $4 \
         WHERE batch_id = $5 AND line = $6",
        params![state, result, attempts, not_before, id, line],
    )?;
    if let Some(count) = count {
        tx.execute(
            &format!("UPDATE batches SET {count} = {count} + 1 WHERE id = $1"),
            [id],
        )?;
    }
    Ok(())
}

/// Every line left pending fails with `result` made of its custom_id (a batch that expired
/// or was cancelled: its lines not run go to its error file as such).
pub fn fail_pending(c: &mut Connection, id: &str, result: &dyn Fn(&str) -> String) -> Db {
    let tx = c.transaction()?;
    let left: Vec<(i64, String, i64)> = {
        let mut stmt = tx.prepare(
            "SELECT line, custom_id, attempts FROM batch_lines \
             WHERE batch_id = $1 AND state = 'pending'",
        )?;
        let rows = stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (line, custom_id, attempts) in left {
        commit_in(
            &tx,
            id,
            line,
            attempts,
            &Outcome::Failed(result(&custom_id)),
        )?;
    }
    tx.commit()
}

/// The results of the batch's lines in their order: `(done, result)`.
pub fn results(c: &Connection, id: &str) -> rusqlite::Result<Vec<(bool, String)>> {
    let mut stmt = c.prepare(
        "SELECT state, result FROM batch_lines WHERE batch_id = $1 AND state <> 'pending' \
         ORDER BY line",
    )?;
    let rows = stmt.query_map([id], |r| {
        let state: String = r.get(0)?;
        Ok((
            state == "done",
            r.get::<_, Option<String>>(1)?.unwrap_or_default(),
        ))
    })?;
    rows.collect()
}
