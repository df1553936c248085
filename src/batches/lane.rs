//! One way to the Batch API's database: a connection on a thread of its own (a PostgreSQL
//! client may neither be used nor dropped on the runtime's threads) and the jobs sent to it,
//! run in their order. The state has one per path — the endpoints, the runner, the lines'
//! results — so no job waits behind another path's (an upload written, a file read whole, a
//! batch validated).

use std::sync::mpsc::Sender;
use std::sync::{Mutex, PoisonError};

use super::db::Conn;
use super::{db_error, Files};
use crate::error::ProxyError;

/// A job for a lane's thread.
type Job = Box<dyn FnOnce(&mut Conn, &Files) + Send>;

#[derive(Debug)]
pub(super) struct Lane {
    jobs: Mutex<Sender<Job>>,
}

impl Lane {
    /// A lane on a new thread named `name`, with the connection and files' place `connect`
    /// opens there (kept until the lane is dropped; then the connection is closed there).
    pub(super) fn open(
        name: &str,
        connect: impl FnOnce() -> Result<(Conn, Files), String> + Send + 'static,
    ) -> Result<Lane, String> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (opened, open) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let (mut db, files) = match connect() {
                    Ok(c) => c,
                    Err(e) => return drop(opened.send(Err(e))),
                };
                let _ = opened.send(Ok(()));
                while let Ok(job) = queue.recv() {
                    job(&mut db, &files);
                }
            })
            .map_err(|e| format!("cannot start the Batch API's database thread {name}: {e}"))?;
        open.recv()
            .map_err(|_| format!("the Batch API's database thread {name} ended"))??;
        Ok(Lane {
            jobs: Mutex::new(jobs),
        })
    }

    /// `f` with the database and the files' place, on the lane's thread, after the jobs sent
    /// to it before.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Conn, &Files) -> Result<T, ProxyError> + Send + 'static,
    ) -> Result<T, ProxyError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |db, files| drop(tx.send(f(db, files))));
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job);
        sent.map_err(|_| db_error("the Batch API's database thread ended"))?;
        rx.await.map_err(db_error)?
    }
}
