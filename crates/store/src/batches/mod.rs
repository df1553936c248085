//! The Batch API's state machine: files uploaded for batches, batches validated and run line
//! by line as the `idle` class (a slot only when nobody else waits for it, given back the
//! moment someone does), each line's result committed with its state, output and error files
//! written when a batch ends. Its state is kept in the ledger's database; its files' contents
//! in a `files` folder beside a SQLite ledger (or under `server.data_dir`), in a PostgreSQL
//! one itself, which several processes share: each line is claimed by one at a time.
//!
//! This module owns the state and its rules (who sees what, the bounds of `[batches]`); the
//! HTTP endpoints (the proxy's `http::batches`) parse and render, and [`runner`] runs the lines
//! through the request pipeline it is handed ([`runner::Serve`]). The endpoints, the runner
//! and the lines' results each have a connection of their own ([`lane`]): a line's result is
//! committed as its answer comes, whatever the endpoints and the runner are doing.

mod bounds;
mod error;
pub(crate) mod input;
mod lane;
mod link;
pub mod result;
pub mod runner;
pub(crate) mod state;
pub mod store;
pub mod upload;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

use crate::db::{Conn, Db, LedgerUrl};
pub use bounds::Bounds;
pub(crate) use error::BatchError;
use lane::Lane;
pub use state::BatchState;
use store::{BatchRow, FileRow};
use switchboard_sync::Locked;
use switchboard_wire::error::{Echo, ProxyError};
use upload::{Received, Upload};

/// The endpoints a batch may run lines of.
pub(crate) const ENDPOINTS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/completions",
];

/// How long a batch may take, the only window OpenAI offers.
pub(crate) const WINDOW: &str = "24h";
const WINDOW_S: i64 = 24 * 3600;

/// The Batch API's state: its ways to the database and where files are kept.
#[derive(Debug)]
pub struct Batches {
    /// The endpoints' way to the database (uploads, downloads, lists, creating, cancelling).
    api: Lane,
    /// The runner's: its looks at the batches, its claims, validations and ends.
    runner: Lane,
    /// The lines' results' alone: no upload, download or validation holds one back.
    results: Lane,
    /// This process's name on the lines it claims.
    owner: String,
    /// Where files' contents are kept (an upload's `.part` file is written there as it comes).
    files: Files,
    /// Wakes the runner: a batch was created or cancelled.
    pub(crate) wake: Notify,
    /// The batches not yet ended as the runner last read them (the status page's list).
    active: Mutex<Arc<Vec<BatchRow>>>,
}

/// Who asks: a client (its name, `-` when no key is configured) or an admin key, which sees
/// every client's files and batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub client: String,
    pub admin: bool,
}

impl Owner {
    fn sees(&self, client: &str) -> bool {
        self.admin || self.client == client
    }

    /// The client whose objects it lists: `None` for an admin key (all).
    fn only(&self) -> Option<&str> {
        (!self.admin).then_some(self.client.as_str())
    }
}

/// A new id's own part: 24 hex digits, in the order ids are made (the milliseconds since
/// the epoch, a count of this process's, then random digits), so lists sort by it.
pub(crate) fn hex_id() -> String {
    static MADE: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ms = crate::ledger::now_ms().max(0) as u64 & 0xffff_ffff_ffff;
    format!("{ms:012x}{n:04x}{:08x}", rand::random::<u32>())
}

/// Now, in Unix seconds.
pub(crate) fn now_s() -> i64 {
    crate::ledger::now_ms() / 1000
}

fn db_error(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::database(e)
}

impl Batches {
    /// Opens the Batch API's state in the ledger at `url` (migrated to this build's schema),
    /// its files' contents under `data_dir` or beside a SQLite ledger, or in a PostgreSQL one:
    /// a connection for the endpoints, one for the runner and one for the lines' results, each
    /// on a thread of its own ([`connect`], [`Lane`]) and made anew after a call fails; `up`
    /// is 1 while none fails.
    pub fn open(
        url: &LedgerUrl,
        data_dir: Option<&Path>,
        up: Gauge,
    ) -> Result<Batches, BatchError> {
        let health = Arc::new(link::Health::new(up));
        let lane = |name: &str, first: bool| {
            let (at, data_dir) = (url.clone(), data_dir.map(Path::to_path_buf));
            Lane::open(name, url, &health, move || {
                connect(&at, data_dir.as_deref(), first)
            })
        };
        Ok(Batches {
            runner: lane("batches-runner", true)?,
            api: lane("batches-api", false)?,
            results: lane("batches-results", false)?,
            owner: format!("{}-{}", std::process::id(), hex_id()),
            files: place(url, data_dir),
            wake: Notify::new(),
            active: Mutex::default(),
        })
    }

    /// `f` with the database and the files' place, on the endpoints' way to it.
    async fn with<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Conn, &Files) -> Result<T, ProxyError> + Send + 'static,
    ) -> Result<T, ProxyError> {
        self.api.run(f).await
    }

    /// A new file's content, received as its upload brings it.
    pub async fn receive(&self) -> Result<Upload, ProxyError> {
        let dir = match &self.files {
            Files::Dir(dir) => Some(dir.as_path()),
            Files::Database => None,
        };
        Upload::start(dir, format!("file-{}", hex_id()))
            .await
            .map_err(db_error)
    }

    /// A file of `purpose` named `filename` with the `content` received, kept for `owner`
    /// within `limits`; nothing is kept when it is refused.
    pub async fn upload(
        self: &Arc<Self>,
        owner: &Owner,
        filename: String,
        purpose: String,
        content: Upload,
        limits: &Bounds,
    ) -> Result<FileRow, ProxyError> {
        check_purpose(&purpose)?;
        let limits = *limits;
        let row = FileRow {
            id: content.id.clone(),
            client: owner.client.clone(),
            filename,
            purpose,
            bytes: content.bytes() as i64,
            created_at: now_s(),
        };
        let content = content.finish().await.map_err(db_error)?;
        self.with(move |db, kept| {
            let (files, bytes) = store::kept(db, &row.client).map_err(db_error)?;
            if files as u64 >= limits.files_per_client {
                return Err(ProxyError::BatchLimit(format!(
                    "client {} keeps {files} files, the most it may (batches.files_per_client); \
                     delete some first",
                    row.client
                )));
            }
            if (bytes + row.bytes) as u64 > limits.bytes_per_client {
                return Err(ProxyError::BatchLimit(format!(
                    "client {} keeps {bytes} bytes of files; {} more would pass \
                     batches.bytes_per_client ({})",
                    row.client, row.bytes, limits.bytes_per_client
                )));
            }
            kept.keep(db, &row, content).map_err(db_error)?;
            Ok(row)
        })
        .await
    }

    /// The file `id`, when `owner` sees it (else a 404, as for one that does not exist).
    pub async fn file(self: &Arc<Self>, owner: &Owner, id: &str) -> Result<FileRow, ProxyError> {
        let (owner, id) = (owner.clone(), id.to_string());
        self.with(move |db, _| file_of(db, &owner, &id)).await
    }

    /// The file's content.
    pub async fn content(self: &Arc<Self>, owner: &Owner, id: &str) -> Result<Bytes, ProxyError> {
        let (owner, id) = (owner.clone(), id.to_string());
        self.with(move |db, kept| {
            let f = file_of(db, &owner, &id)?;
            kept.get(db, &f.id).map(Bytes::from).map_err(db_error)
        })
        .await
    }

    /// The files `owner` sees, of `purpose` when one is given, a page after `after`.
    pub async fn files(
        self: &Arc<Self>,
        owner: &Owner,
        purpose: Option<String>,
        after: Option<String>,
        asc: bool,
        limit: i64,
    ) -> Result<(Vec<FileRow>, bool), ProxyError> {
        let owner = owner.clone();
        self.with(move |db, _| {
            if let Some(id) = &after {
                file_of(db, &owner, id)?;
            }
            let mut rows = store::files(
                db,
                owner.only(),
                purpose.as_deref(),
                after.as_deref(),
                asc,
                limit + 1,
            )
            .map_err(db_error)?;
            let more = rows.len() as i64 > limit;
            rows.truncate(limit as usize);
            Ok((rows, more))
        })
        .await
    }

    /// The file is deleted, its content too.
    pub async fn delete(self: &Arc<Self>, owner: &Owner, id: &str) -> Result<FileRow, ProxyError> {
        let (owner, id) = (owner.clone(), id.to_string());
        self.with(move |db, kept| {
            let f = file_of(db, &owner, &id)?;
            store::delete_file(db, &f.id).map_err(db_error)?;
            kept.delete(&f.id);
            Ok(f)
        })
        .await
    }

    /// A batch of `owner`'s over its file `input_file_id`: validated by the runner next.
    pub async fn create(
        self: &Arc<Self>,
        owner: &Owner,
        input_file_id: String,
        endpoint: String,
        window: String,
        metadata: Option<String>,
        limits: &Bounds,
    ) -> Result<BatchRow, ProxyError> {
        if !ENDPOINTS.contains(&endpoint.as_str()) {
            return Err(ProxyError::InvalidParam {
                param: "endpoint",
                message: format!(
                    "endpoint {:?} is not one of {}",
                    Echo::new(&endpoint),
                    ENDPOINTS.join(", ")
                ),
            });
        }
        if window != WINDOW {
            return Err(ProxyError::InvalidParam {
                param: "completion_window",
                message: format!("completion_window must be \"{WINDOW}\""),
            });
        }
        let (owner, limit) = (owner.clone(), limits.batches_in_progress_per_client);
        let row = self
            .with(move |db, _| {
                let f = file_of(db, &owner, &input_file_id)?;
                if f.purpose != "batch" {
                    return Err(ProxyError::InvalidParam {
                        param: "input_file_id",
                        message: format!("file {} is not a batch input file", f.id),
                    });
                }
                let running = store::active_of(db, &owner.client).map_err(db_error)?;
                if running as u64 >= limit {
                    return Err(ProxyError::BatchLimit(format!(
                        "client {} has {running} batches in progress, the most it may \
                         (batches.batches_in_progress_per_client)",
                        owner.client
                    )));
                }
                let now = now_s();
                let row = BatchRow {
                    id: format!("batch_{}", hex_id()),
                    client: owner.client.clone(),
                    endpoint,
                    input_file_id: f.id,
                    completion_window: window,
                    status: BatchState::Validating,
                    metadata,
                    created_at: now,
                    expires_at: now + WINDOW_S,
                    ..BatchRow::default()
                };
                store::insert_batch(db, &row).map_err(db_error)?;
                Ok(row)
            })
            .await?;
        self.wake.notify_one();
        Ok(row)
    }

    /// The batch `id`, when `owner` sees it.
    pub async fn batch(self: &Arc<Self>, owner: &Owner, id: &str) -> Result<BatchRow, ProxyError> {
        let (owner, id) = (owner.clone(), id.to_string());
        self.with(move |db, _| batch_of(db, &owner, &id)).await
    }

    /// The batches `owner` sees, newest first, a page after `after`.
    pub async fn batches(
        self: &Arc<Self>,
        owner: &Owner,
        after: Option<String>,
        limit: i64,
    ) -> Result<(Vec<BatchRow>, bool), ProxyError> {
        let owner = owner.clone();
        self.with(move |db, _| {
            if let Some(id) = &after {
                batch_of(db, &owner, id)?;
            }
            let mut rows =
                store::batches(db, owner.only(), after.as_deref(), limit + 1).map_err(db_error)?;
            let more = rows.len() as i64 > limit;
            rows.truncate(limit as usize);
            Ok((rows, more))
        })
        .await
    }

    /// The batch is cancelled: `cancelling` until its running lines have stopped. A batch
    /// that has ended already cannot be.
    pub async fn cancel(self: &Arc<Self>, owner: &Owner, id: &str) -> Result<BatchRow, ProxyError> {
        let (owner, id) = (owner.clone(), id.to_string());
        let row = self
            .with(move |db, _| {
                let b = batch_of(db, &owner, &id)?;
                let to = BatchState::Cancelling;
                if !store::advance(db, &b.id, to, now_s()).map_err(db_error)?
                    && !matches!(b.status, BatchState::Cancelling | BatchState::Cancelled)
                {
                    return Err(ProxyError::InvalidRequest(format!(
                        "batch {} is {}: it cannot be cancelled",
                        b.id, b.status
                    )));
                }
                batch_of(db, &owner, &b.id)
            })
            .await?;
        self.wake.notify_one();
        Ok(row)
    }

    /// The batches not yet ended, oldest first, as the runner read them last (within a
    /// second or a line's end): no database read.
    pub fn active(&self) -> Arc<Vec<BatchRow>> {
        Arc::clone(&self.active.locked())
    }

    fn set_active(&self, rows: Vec<BatchRow>) {
        *self.active.locked() = Arc::new(rows);
    }
}

/// Only `batch` files are kept (an upload's other purposes are refused).
pub fn check_purpose(purpose: &str) -> Result<(), ProxyError> {
    if purpose == "batch" {
        return Ok(());
    }
    Err(ProxyError::InvalidParam {
        param: "purpose",
        message: format!(
            "purpose {:?} is not served here: only \"batch\" files are kept",
            Echo::new(purpose)
        ),
    })
}

fn file_of(db: &mut dyn Db, owner: &Owner, id: &str) -> Result<FileRow, ProxyError> {
    store::file(db, id)
        .map_err(db_error)?
        .filter(|f| owner.sees(&f.client))
        .ok_or_else(|| ProxyError::NoSuchObject {
            kind: "File",
            id: Echo::new(id),
        })
}

fn batch_of(db: &mut dyn Db, owner: &Owner, id: &str) -> Result<BatchRow, ProxyError> {
    store::batch(db, id)
        .map_err(db_error)?
        .filter(|b| owner.sees(&b.client))
        .ok_or_else(|| ProxyError::NoSuchObject {
            kind: "Batch",
            id: Echo::new(id),
        })
}

/// The database at `url`, opened and migrated, and where its files' contents are kept. Lines
/// a SQLite file shows running at the process's `first` connection were this process's before
/// it started again (one process has a SQLite file): they are pending again.
fn connect(
    url: &LedgerUrl,
    data_dir: Option<&Path>,
    first: bool,
) -> Result<(Conn, Files), BatchError> {
    let files = place(url, data_dir);
    let mut db = crate::ledger::Store::open(url)?.into_conn();
    if let Files::Dir(dir) = &files {
        std::fs::create_dir_all(dir).map_err(|source| BatchError::Folder {
            path: dir.display().to_string(),
            source,
        })?;
        if first {
            sweep(dir);
        }
    }
    if first && !db.shared() {
        store::release(&mut db, None, None)?;
    }
    Ok((db, files))
}

/// Where the files' contents of the ledger at `url` are kept: a `files` folder under
/// `data_dir`, else beside a SQLite file; a PostgreSQL database itself.
fn place(url: &LedgerUrl, data_dir: Option<&Path>) -> Files {
    match url {
        LedgerUrl::Sqlite(path) => {
            let base = data_dir
                .map(Path::to_path_buf)
                .or_else(|| path.parent().map(Path::to_path_buf))
                .unwrap_or_default();
            Files::Dir(base.join("files"))
        }
        LedgerUrl::Postgres(_) => Files::Database,
    }
}

/// Removes the `.part` files uploads left in `dir` when their process ended mid-way (a kill,
/// a crash): one process has a SQLite ledger, so none is being written at its start.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(".part") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Where files' contents are kept: a folder beside a SQLite ledger, or the database itself
/// (PostgreSQL, which processes on several hosts share).
#[derive(Debug, Clone)]
enum Files {
    Dir(PathBuf),
    Database,
}

impl Files {
    /// Keeps `content` as file `id`'s (a file is written whole or not at all: a `.part` file,
    /// removed on any failure, then renamed), in the transaction `db` is.
    fn put(&self, db: &mut dyn Db, id: &str, content: &[u8]) -> Result<(), BatchError> {
        match self {
            Files::Dir(dir) => {
                let part = tempfile::TempPath::try_from_path(dir.join(format!("{id}.part")))?;
                std::fs::write(&part, content)?;
                Ok(part.persist(dir.join(id)).map_err(|e| e.error)?)
            }
            Files::Database => Ok(store::put_content(db, id, content)?),
        }
    }

    /// File `row` with its uploaded `content`, committed together: a `.part` file renamed to
    /// its id, or the content in the database. Nothing is left of it when this fails.
    fn keep(&self, db: &mut Conn, row: &FileRow, content: Received) -> Result<(), BatchError> {
        let kept = db.tx(|tx| {
            store::insert_file(tx, row)?;
            match content {
                Received::Part(part) => {
                    let to = part.with_file_name(&row.id);
                    Ok(part.persist(to).map_err(|e| e.error)?)
                }
                Received::Memory(bytes) => Ok(store::put_content(tx, &row.id, &bytes)?),
            }
        });
        if kept.is_err() {
            // Renamed, and then its commit failed.
            self.delete(&row.id);
        }
        kept
    }

    fn get(&self, db: &mut dyn Db, id: &str) -> Result<Vec<u8>, BatchError> {
        match self {
            Files::Dir(dir) => Ok(std::fs::read(dir.join(id))?),
            Files::Database => {
                store::content(db, id)?.ok_or_else(|| BatchError::NoContent(id.to_string()))
            }
        }
    }

    /// Its content where it is a file (the database's goes with its row).
    fn delete(&self, id: &str) {
        if let Files::Dir(dir) = self {
            let _ = std::fs::remove_file(dir.join(id));
        }
    }
}
