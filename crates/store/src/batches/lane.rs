//! One way to the Batch API's database: a connection on a thread of its own (a PostgreSQL
//! client may neither be used nor dropped on the runtime's threads) and the jobs sent to it,
//! run in their order. The state has one per path — the endpoints, the runner, the lines'
//! results — so no job waits behind another path's (an upload written, a file read whole, a
//! batch validated). A lane whose call fails makes its next on a new connection ([`Link`]).

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use super::link::{Health, Link};
use super::{db_error, BatchError, Files};
use crate::db::Conn;
use crate::db::LedgerUrl;
use switchboard_sync::Locked;
use switchboard_wire::error::ProxyError;

/// A job for a lane's thread, given its connection (or why there is none now); why the
/// database failed it, when it did.
type Job = Box<dyn FnOnce(Result<&mut Conn, BatchError>, &Files) -> Option<String> + Send>;

#[derive(Debug)]
pub(super) struct Lane {
    jobs: Mutex<Sender<Job>>,
}

impl Lane {
    /// A lane on a new thread named `name`, with the connection to the ledger at `url` and
    /// files' place `connect` opens there (made anew after a call fails; kept until the lane
    /// is dropped, then closed there); `health` says whether the state's lanes work.
    pub(super) fn open(
        name: &str,
        url: &LedgerUrl,
        health: &Arc<Health>,
        connect: impl FnOnce() -> Result<(Conn, Files), BatchError> + Send + 'static,
    ) -> Result<Lane, BatchError> {
        let (lane, url, health) = (name.to_string(), url.clone(), Arc::clone(health));
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (opened, open) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let (db, files) = match connect() {
                    Ok(c) => c,
                    Err(e) => return drop(opened.send(Err(e))),
                };
                let _ = opened.send(Ok(()));
                let mut link = Link::new(lane, url, db, health);
                while let Ok(job) = queue.recv() {
                    match job(link.conn(), &files) {
                        Some(why) => link.failed(why),
                        None => link.worked(),
                    }
                }
            })
            .map_err(|e| {
                BatchError::Thread(format!(
                    "cannot start the Batch API's database thread {name}: {e}"
                ))
            })?;
        open.recv().map_err(|_| {
            BatchError::Thread(format!("the Batch API's database thread {name} ended"))
        })??;
        Ok(Lane {
            jobs: Mutex::new(jobs),
        })
    }

    /// `f` with the database and the files' place, on the lane's thread, after the jobs sent
    /// to it before (a 503 while there is no connection to the database).
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Conn, &Files) -> Result<T, ProxyError> + Send + 'static,
    ) -> Result<T, ProxyError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |db, files| {
            let out = db.map_err(db_error).and_then(|db| f(db, files));
            let failed = match &out {
                Err(ProxyError::LedgerUnavailable { detail }) => Some(detail.clone()),
                _ => None,
            };
            drop(tx.send(out));
            failed
        });
        let sent = self.jobs.locked().send(job);
        sent.map_err(|_| db_error("the Batch API's database thread ended"))?;
        rx.await.map_err(db_error)?
    }
}
