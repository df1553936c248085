//! A lane's connection to the Batch API's database, kept as the usage ledger keeps its own:
//! after a call fails (a PostgreSQL that restarted leaves the old connection dead, not always
//! closed), the next is made on a new one, tried again after a backoff while it cannot be made.
//! Whether the lanes' calls work is `switchboard_batch_db_up`, and a log line when the first
//! starts failing and when the last works again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

use super::BatchError;
use crate::db::Conn;
use crate::db::LedgerUrl;
use switchboard_sync::Locked;

/// The first wait before a connection is tried again, doubled up to [`BACKOFF_MAX`].
const BACKOFF: Duration = Duration::from_millis(250);
/// The longest: a client's call waiting on a database that is down is answered at once
/// between tries, so a short one costs little and finds the database soon once it is back.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Whether a state's lanes work: how many are failing, and the gauge that is 1 while none is.
#[derive(Debug)]
pub(super) struct Health {
    failing: Mutex<usize>,
    up: Gauge,
}

impl Health {
    /// Every lane working, as `up` says.
    pub(super) fn new(up: Gauge) -> Health {
        up.set(1);
        Health {
            failing: Mutex::new(0),
            up,
        }
    }

    /// A lane's calls start failing (`true`) or work again; logged as the first fails and
    /// as the last works again.
    fn lane(&self, failing: bool, lane: &str, url: &LedgerUrl, why: &str) {
        let mut n = self.failing.locked();
        match failing {
            true => {
                if *n == 0 {
                    tracing::warn!(
                        ledger = %url.shown(),
                        lane,
                        error = %why,
                        "Batch API: the ledger's database failed; calls get 503 until it answers again"
                    );
                }
                *n += 1;
            }
            false => {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    tracing::info!(ledger = %url.shown(), "Batch API: the ledger's database answers again");
                }
            }
        }
        self.up.set(i64::from(*n == 0));
    }
}

/// A lane's connection, and what is known of it.
pub(super) struct Link {
    lane: String,
    url: LedgerUrl,
    conn: Conn,
    /// Why the connection is to be made anew before the next call (its last call failed).
    broken: Option<String>,
    /// Calls have failed since the last that worked.
    failing: bool,
    /// No new connection is tried before then.
    retry_at: Option<Instant>,
    backoff: Duration,
    health: Arc<Health>,
}

impl Link {
    /// Lane `lane`'s connection `conn` to the database at `url`, open and working.
    pub(super) fn new(lane: String, url: LedgerUrl, conn: Conn, health: Arc<Health>) -> Link {
        Link {
            lane,
            url,
            conn,
            broken: None,
            failing: false,
            retry_at: None,
            backoff: BACKOFF,
            health,
        }
    }

    /// The connection for the next call: this one, or a new one after a failure (a
    /// PostgreSQL database's; a SQLite file's is kept, its failures are its calls'); why
    /// there is none now.
    pub(super) fn conn(&mut self) -> Result<&mut Conn, BatchError> {
        if self.broken.is_none() && self.conn.is_closed() {
            self.failed("the connection is closed".into());
        }
        let Some(why) = &self.broken else {
            return Ok(&mut self.conn);
        };
        if !self.conn.shared() {
            self.broken = None;
            return Ok(&mut self.conn);
        }
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return Err(BatchError::Down(why.clone()));
        }
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        match crate::ledger::Store::open(&self.url) {
            Ok(store) => self.conn = store.into_conn(),
            Err(e) => {
                self.broken = Some(e.to_string());
                return Err(e.into());
            }
        }
        self.broken = None;
        Ok(&mut self.conn)
    }

    /// The last call failed with `why`: the next is made on a new connection.
    pub(super) fn failed(&mut self, why: String) {
        if !self.failing {
            self.health.lane(true, &self.lane, &self.url, &why);
            self.failing = true;
        }
        self.broken = Some(why);
    }

    /// The last call worked.
    pub(super) fn worked(&mut self) {
        if self.failing {
            self.health.lane(false, &self.lane, &self.url, "");
            self.failing = false;
        }
        (self.retry_at, self.backoff) = (None, BACKOFF);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn link(dir: &tempfile::TempDir, lane: &str, health: &Arc<Health>) -> Link {
        let path = dir.path().join("usage.db");
        let conn = Conn::Sqlite(rusqlite::Connection::open(&path).unwrap());
        Link::new(
            lane.into(),
            LedgerUrl::Sqlite(path),
            conn,
            Arc::clone(health),
        )
    }

    #[test]
    fn the_gauge_is_up_while_no_lane_fails_and_a_sqlite_link_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let up = Gauge::default();
        let health = Arc::new(Health::new(up.clone()));
        let (mut api, mut runner) = (link(&dir, "api", &health), link(&dir, "runner", &health));
        assert_eq!(up.get(), 1);
        api.failed("disk I/O error".into());
        runner.failed("disk I/O error".into());
        api.failed("disk I/O error".into());
        assert_eq!(up.get(), 0);
        assert!(api.conn().is_ok(), "a SQLite file's connection is kept");
        api.worked();
        assert_eq!(up.get(), 0, "the runner's lane still fails");
        runner.worked();
        runner.worked();
        assert_eq!(up.get(), 1);
    }
}
