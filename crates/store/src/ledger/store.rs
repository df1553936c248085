//! The ledger's database: a SQLite file or a PostgreSQL server, opened and migrated at start,
//! written a batch per transaction (the rows and their roll-ups together), read for reports.

use std::collections::BTreeMap;

use super::schema::{self, LATEST, MIGRATIONS, ROLLUPS, VERSIONS};
use super::{LedgerError, Row};
use crate::db::LedgerUrl;
use crate::db::{Conn, Db, DbError, Val};

/// The PostgreSQL advisory lock migrations are made under.
const MIGRATION_LOCK: i64 = 0x5357_4c45_4447;

/// An open ledger database, and where it is as it may be shown.
pub struct Store {
    conn: Conn,
    at: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.at)
    }
}

/// What a report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    Client,
    Alias,
    /// The UTC day.
    Day,
    /// The UTC hour.
    Hour,
}

impl Dim {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dim::Client => "client",
            Dim::Alias => "alias",
            Dim::Day => "day",
            Dim::Hour => "hour",
        }
    }

    fn column(self) -> &'static str {
        match self {
            Dim::Client => "client",
            Dim::Alias => "alias",
            Dim::Day => "(bucket_ms / 86400000) * 86400000",
            Dim::Hour => "bucket_ms",
        }
    }
}

/// One group of a report: its keys (in the order asked, a day or hour as its start in
/// milliseconds since the epoch) and its sums.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Total {
    pub keys: Vec<String>,
    pub requests: i64,
    pub(crate) errors: i64,
    pub prompt_tokens: i64,
    pub(crate) cached_tokens: i64,
    pub(crate) output_tokens: i64,
    pub(crate) gpu_prefill_s: f64,
    pub(crate) gpu_decode_s: f64,
}

/// One bucket of one alias, client and owner, as the usage API reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bucketed {
    /// Its start, in milliseconds since the epoch.
    pub start_ms: i64,
    pub alias: String,
    pub client: String,
    /// Who owns its usage: its client, or a key of `server.api_keys_env`.
    pub owner: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
}

impl Bucketed {
    /// From a result row's columns: bucket, alias, client, owner, requests, then the tokens.
    fn read(r: &crate::db::Row) -> Result<Bucketed, DbError> {
        Ok(Bucketed {
            start_ms: r.int(0)?,
            alias: r.text(1)?,
            client: r.text(2)?,
            owner: r.text(3)?,
            requests: r.int(4)?,
            prompt_tokens: r.int(5)?,
            cached_tokens: r.int(6)?,
            output_tokens: r.int(7)?,
        })
    }
}

/// A roll-up bucket's sums.
#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    requests: i64,
    errors: i64,
    prompt: i64,
    cached: i64,
    output: i64,
    prefill: f64,
    decode: f64,
}

/// Rows inserted by one statement (each takes 23 parameters).
const CHUNK: usize = 50;

/// The statement inserting `n` rows.
fn insert_rows(n: usize) -> String {
    let values: Vec<String> = (0..n)
        .map(|r| {
            let params: Vec<String> = (1..=23).map(|c| format!("${}", r * 23 + c)).collect();
            format!("({})", params.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO requests (process, seq, at_ms, request_id, client, alias, backend, api, \
         status, prompt_tokens, cached_tokens, output_tokens, gpu_prefill_s, gpu_decode_s, \
         ttft_ms, duration_ms, queue_ms, cancelled, preempted, fell_back, charged_tokens, \
         charged_gpu_s, owner) VALUES {}",
        values.join(", ")
    )
}

/// A row's 23 parameters, in [`insert_rows`]' order.
fn row_params(process: &str, r: &Row) -> [Val; 23] {
    [
        process.into(),
        r.seq.into(),
        r.at_ms.into(),
        (&r.request_id).into(),
        (&r.client).into(),
        (&r.alias).into(),
        (&r.backend).into(),
        r.api.into(),
        r.status.into(),
        r.prompt_tokens.into(),
        r.cached_tokens.into(),
        r.output_tokens.into(),
        r.gpu_prefill_s.into(),
        r.gpu_decode_s.into(),
        r.ttft_ms.into(),
        r.duration_ms.into(),
        r.queue_ms.into(),
        i64::from(r.cancelled).into(),
        r.preempted.into(),
        i64::from(r.fell_back).into(),
        r.charged_tokens.into(),
        r.charged_gpu_s.into(),
        r.owner.as_deref().into(),
    ]
}

/// The statement adding a group's sums to roll-up `table`, per owner (`owned`) or client.
fn upsert(table: &str, owned: bool) -> String {
    let add = |c: &str| format!("{c} = {table}.{c} + excluded.{c}");
    let key = if owned {
        "bucket_ms, client, owner, alias"
    } else {
        "bucket_ms, client, alias"
    };
    let n = key.split(',').count() + schema::SUMS.len();
    let params: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
    format!(
        "INSERT INTO {table} ({key}, {}) VALUES ({}) ON CONFLICT ({key}) DO UPDATE SET {}",
        schema::SUMS.join(", "),
        params.join(", "),
        schema::SUMS.map(add).join(", ")
    )
}

/// A roll-up group's parameters in [`upsert`]'s order: its key (its owner only where `owned`),
/// then its sums.
fn rollup_params(owned: bool, key: &(i64, &str, &str, &str), s: &Sums) -> Vec<Val> {
    let (bucket, client, owner, alias) = *key;
    let mut p: Vec<Val> = vec![bucket.into(), client.into()];
    if owned {
        p.push(owner.into());
    }
    p.extend([
        alias.into(),
        s.requests.into(),
        s.errors.into(),
        s.prompt.into(),
        s.cached.into(),
        s.output.into(),
        s.prefill.into(),
        s.decode.into(),
    ]);
    p
}

impl Store {
    /// Opens the database at `url` and brings its schema to this build's version; an error
    /// names the database and says why (a file that is no SQLite database, a newer schema).
    pub(crate) fn open(url: &LedgerUrl) -> Result<Store, LedgerError> {
        let mut store = Store {
            conn: Conn::open(url)?,
            at: url.shown(),
        };
        store.migrate()?;
        Ok(store)
    }

    /// The database as it may be shown.
    pub(crate) fn at(&self) -> &str {
        &self.at
    }

    /// Its connection, to run statements of its own on.
    pub fn db(&mut self) -> &mut dyn Db {
        &mut self.conn
    }

    /// Its connection, for the Batch API (whose tables the same migrations make).
    pub(crate) fn into_conn(self) -> Conn {
        self.conn
    }

    /// Whether it is a PostgreSQL database (several processes may share it).
    pub(crate) fn shared(&self) -> bool {
        self.conn.shared()
    }

    /// Applies the migrations the database lacks, in one transaction (PostgreSQL: under a lock,
    /// so two processes starting at once apply each once); refuses a newer database.
    fn migrate(&mut self) -> Result<i64, LedgerError> {
        let max = "SELECT max(version) FROM ledger_schema";
        let insert = "INSERT INTO ledger_schema (version) VALUES ($1)";
        // One process at a time makes and migrates the schema (two starting at once would
        // both make `ledger_schema`); the lock ends with the session at worst.
        let locked = self.conn.shared();
        let at = |source| LedgerError::At {
            at: self.at.clone(),
            source,
        };
        if locked {
            let lock = format!("SELECT pg_advisory_lock({MIGRATION_LOCK})");
            self.conn.batch(&lock).map_err(at)?;
        }
        let conn = &mut self.conn;
        let migrated = conn.batch(VERSIONS).and_then(|()| {
            conn.tx_writing(|tx| {
                let version = tx.one(max, &[])?.opt_int(0)?.unwrap_or(0);
                if version > LATEST {
                    return Ok(Err(version));
                }
                for (n, steps) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                    for step in *steps {
                        tx.batch(step)?;
                    }
                    tx.exec(insert, &[(n as i64 + 1).into()])?;
                }
                Ok(Ok(version))
            })
        });
        if locked {
            let unlock = format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})");
            let _ = self.conn.batch(&unlock);
        }
        match migrated {
            Ok(Ok(version)) => Ok(version),
            Ok(Err(version)) => Err(LedgerError::TooNew {
                at: self.at.clone(),
                version,
            }),
            Err(e) => Err(at(e)),
        }
    }

    /// Writes `rows` (made by `process`) and adds them to the roll-ups, in one transaction.
    pub fn write(&mut self, process: &str, rows: &[Row]) -> Result<(), LedgerError> {
        let rollups = ROLLUPS.map(|(table, width, owned)| (table, owned, rollup(rows, width)));
        self.conn.tx(|tx| {
            for chunk in rows.chunks(CHUNK) {
                let params: Vec<Val> = chunk.iter().flat_map(|r| row_params(process, r)).collect();
                tx.exec(&insert_rows(chunk.len()), &params)?;
            }
            // A clients' table is given each owner's sums in turn: they add up.
            for (table, owned, groups) in &rollups {
                let up = upsert(table, *owned);
                for (key, s) in groups {
                    tx.exec(&up, &rollup_params(*owned, key, s))?;
                }
            }
            Ok(())
        })
    }

    /// Whether the row `seq` of `process` is written (a batch whose commit's outcome is
    /// unknown is looked for by its first row).
    pub(crate) fn holds(&mut self, process: &str, seq: i64) -> Result<bool, LedgerError> {
        let q = "SELECT count(*) FROM requests WHERE process = $1 AND seq = $2";
        Ok(self.db().one(q, &[process.into(), seq.into()])?.int(0)? > 0)
    }

    /// Deletes the raw rows older than `before_ms` (the roll-ups stay); how many.
    pub(crate) fn prune(&mut self, before_ms: i64) -> Result<u64, LedgerError> {
        let q = "DELETE FROM requests WHERE at_ms < $1";
        Ok(self.conn.exec(q, &[before_ms.into()])?)
    }

    /// Whether the connection is lost for good (PostgreSQL), so the next write reconnects.
    pub(crate) fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }

    /// Sums of the hourly roll-ups from `since_ms` on (by hour: a bucket that began before it
    /// is not counted), grouped by `by` and ordered by the groups' keys.
    pub fn totals(&mut self, since_ms: i64, by: &[Dim]) -> Result<Vec<Total>, LedgerError> {
        let keys: Vec<String> = by
            .iter()
            .enumerate()
            .map(|(i, d)| format!("CAST({} AS TEXT) AS k{i}", d.column()))
            .collect();
        let group: Vec<String> = (0..by.len()).map(|i| format!("k{i}")).collect();
        let select = keys
            .iter()
            .cloned()
            .chain([
                "CAST(sum(requests) AS BIGINT)".into(),
                "CAST(sum(errors) AS BIGINT)".into(),
                "CAST(sum(prompt_tokens) AS BIGINT)".into(),
                "CAST(sum(cached_tokens) AS BIGINT)".into(),
                "CAST(sum(output_tokens) AS BIGINT)".into(),
                "CAST(sum(gpu_prefill_s) AS DOUBLE PRECISION)".into(),
                "CAST(sum(gpu_decode_s) AS DOUBLE PRECISION)".into(),
            ])
            .collect::<Vec<_>>()
            .join(", ");
        let mut q = format!("SELECT {select} FROM usage_hourly WHERE bucket_ms >= $1");
        if !group.is_empty() {
            q += &format!(" GROUP BY {0} ORDER BY {0}", group.join(", "));
        }
        let n = by.len();
        let total = |r: &crate::db::Row| -> Result<Total, DbError> {
            Ok(Total {
                keys: (0..n)
                    .map(|i| r.opt_text(i).map(Option::unwrap_or_default))
                    .collect::<Result<_, _>>()?,
                requests: r.opt_int(n)?.unwrap_or(0),
                errors: r.opt_int(n + 1)?.unwrap_or(0),
                prompt_tokens: r.opt_int(n + 2)?.unwrap_or(0),
                cached_tokens: r.opt_int(n + 3)?.unwrap_or(0),
                output_tokens: r.opt_int(n + 4)?.unwrap_or(0),
                gpu_prefill_s: r.opt_float(n + 5)?.unwrap_or(0.0),
                gpu_decode_s: r.opt_float(n + 6)?.unwrap_or(0.0),
            })
        };
        let rows = self.conn.rows(&q, &[since_ms.into()])?;
        let mut out = rows.iter().map(total).collect::<Result<Vec<_>, _>>()?;
        // A report with no rows at all still has its one total when nothing is grouped.
        out.retain(|t| !by.is_empty() || t.requests > 0);
        Ok(out)
    }

    /// Requests and tokens per bucket of `width_ms` (a minute, from the raw rows; an hour or
    /// a day, from their roll-ups: the owners' for one owner, else the clients', whose owner
    /// reads as the client), alias, client and owner, for the buckets starting in
    /// `[from_ms, to_ms)`, of `owner` alone where given, ordered by bucket, alias, client and
    /// owner.
    pub fn buckets(
        &mut self,
        width_ms: i64,
        from_ms: i64,
        to_ms: i64,
        owner: Option<&str>,
    ) -> Result<Vec<Bucketed>, LedgerError> {
        let q = buckets_query(width_ms, owner.is_some())?;
        let mut params: Vec<Val> = vec![from_ms.into(), to_ms.into()];
        params.extend(owner.map(Val::from));
        let rows = self.conn.rows(&q, &params)?;
        Ok(rows.iter().map(Bucketed::read).collect::<Result<_, _>>()?)
    }
}

/// The query of [`Store::buckets`]: buckets of `width_ms` starting in `[$1, $2)`, of the owner
/// `$3` alone where `one_owner`.
pub(super) fn buckets_query(width_ms: i64, one_owner: bool) -> Result<String, LedgerError> {
    let (bucket, table, requests, owner) = match width_ms {
        // A raw row's owner is its client's where it has none.
        60_000 => (
            "(at_ms / 60000) * 60000",
            "requests",
            "count(*)",
            "COALESCE(owner, client)",
        ),
        w => {
            let table = ROLLUPS
                .iter()
                .find(|(_, width, owned)| *width == w && *owned == one_owner)
                .map(|(t, ..)| *t)
                .ok_or(LedgerError::NoRollup(w))?;
            let owner = if one_owner { "owner" } else { "client" };
            ("bucket_ms", table, "CAST(sum(requests) AS BIGINT)", owner)
        }
    };
    let at = if table == "requests" {
        "at_ms"
    } else {
        "bucket_ms"
    };
    // An owner's own rows are found through `requests_owner`, or as a client owning its usage
    // through `requests_client` (a roll-up's hold few rows).
    let one = match (one_owner, table) {
        (false, _) => "",
        (true, "requests") => " AND (owner = $3 OR (owner IS NULL AND client = $3))",
        (true, _) => " AND owner = $3",
    };
    Ok(format!(
        "SELECT {bucket} AS b, alias, client, {owner} AS o, {requests}, \
         CAST(sum(prompt_tokens) AS BIGINT), CAST(sum(cached_tokens) AS BIGINT), \
         CAST(sum(output_tokens) AS BIGINT) FROM {table} WHERE {at} >= $1 AND {at} < $2{one} \
         GROUP BY b, alias, client, o ORDER BY b, alias, client, o"
    ))
}

/// `rows` summed per bucket of `width` milliseconds, client, owner and alias.
fn rollup(rows: &[Row], width: i64) -> BTreeMap<(i64, &str, &str, &str), Sums> {
    let mut groups: BTreeMap<(i64, &str, &str, &str), Sums> = BTreeMap::new();
    for r in rows {
        let bucket = r.at_ms.div_euclid(width) * width;
        let owner = r.owner.as_deref().unwrap_or(&r.client);
        let key = (bucket, r.client.as_str(), owner, r.alias.as_str());
        let s = groups.entry(key).or_default();
        s.requests += 1;
        s.errors += i64::from(r.status >= 400);
        s.prompt += r.prompt_tokens;
        s.cached += r.cached_tokens;
        s.output += r.output_tokens;
        s.prefill += r.gpu_prefill_s;
        s.decode += r.gpu_decode_s;
    }
    groups
}
