//! The ledger's database: a SQLite file or a PostgreSQL server, opened and migrated at start,
//! written a batch per transaction (the rows and their roll-ups together), read for reports.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use rusqlite::TransactionBehavior;

use super::schema::{self, LATEST, MIGRATIONS, ROLLUPS, VERSIONS};
use super::Row;
use crate::config::LedgerUrl;

/// The PostgreSQL advisory lock migrations are made under.
const MIGRATION_LOCK: i64 = 0x5357_4c45_4447;

/// A PostgreSQL error with the server's own message where it sent one.
pub(crate) fn pg(e: postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => e.to_string(),
    }
}

/// An open ledger database.
pub enum Store {
    Sqlite(rusqlite::Connection, String),
    Postgres(Box<postgres::Client>, String),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.at())
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
    pub fn name(self) -> &'static str {
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
    pub errors: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub gpu_prefill_s: f64,
    pub gpu_decode_s: f64,
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
    fn read(
        int: impl Fn(usize) -> Result<i64, String>,
        text: impl Fn(usize) -> Result<String, String>,
    ) -> Result<Bucketed, String> {
        Ok(Bucketed {
            start_ms: int(0)?,
            alias: text(1)?,
            client: text(2)?,
            owner: text(3)?,
            requests: int(4)?,
            prompt_tokens: int(5)?,
            cached_tokens: int(6)?,
            output_tokens: int(7)?,
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

/// A row's 23 parameters, in [`insert_rows`]' order, as `$t` trait objects; `$flags` holds
/// its `cancelled` and `fell_back` as numbers.
macro_rules! row_params {
    ($t:ty, $process:expr, $r:expr, $flags:expr) => {
        [
            &$process as &$t,
            &$r.seq,
            &$r.at_ms,
            &$r.request_id,
            &$r.client,
            &$r.alias,
            &$r.backend,
            &$r.api,
            &$r.status,
            &$r.prompt_tokens,
            &$r.cached_tokens,
            &$r.output_tokens,
            &$r.gpu_prefill_s,
            &$r.gpu_decode_s,
            &$r.ttft_ms,
            &$r.duration_ms,
            &$r.queue_ms,
            &$flags.0,
            &$r.preempted,
            &$flags.1,
            &$r.charged_tokens,
            &$r.charged_gpu_s,
            &$r.owner,
        ]
    };
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

/// A roll-up group's parameters in [`upsert`]'s order, as `$t` trait objects: its key (its
/// owner only where `$owned`), then its sums.
macro_rules! rollup_params {
    ($t:ty, $owned:expr, $key:expr, $s:expr) => {{
        let (bucket, client, owner, alias) = $key;
        let mut p: Vec<&$t> = vec![bucket, client];
        if $owned {
            p.push(owner);
        }
        let sums: [&$t; 8] = [
            alias,
            &$s.requests,
            &$s.errors,
            &$s.prompt,
            &$s.cached,
            &$s.output,
            &$s.prefill,
            &$s.decode,
        ];
        p.extend(sums);
        p
    }};
}

impl Store {
    /// Opens the database at `url` and brings its schema to this build's version; an error
    /// names the database and says why (a file that is no SQLite database, a newer schema).
    pub fn open(url: &LedgerUrl) -> Result<Store, String> {
        let at = url.shown();
        let mut store = match url {
            LedgerUrl::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).map_err(|e| format!("{at}: {e}"))?;
                conn.busy_timeout(Duration::from_secs(10))
                    .map_err(|e| format!("{at}: {e}"))?;
                // The first read tells a file that is no database. In WAL mode a commit
                // survives the process (kill -9) without an fsync of its own; the log is synced
                // at checkpoints (a power cut may take the last commits).
                conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
                    .map_err(|e| format!("{at}: {e}"))?;
                conn.execute_batch("PRAGMA synchronous=NORMAL")
                    .map_err(|e| format!("{at}: {e}"))?;
                Store::Sqlite(conn, at)
            }
            LedgerUrl::Postgres(text) => {
                let mut cfg = postgres::Config::from_str(text).map_err(|e| format!("{at}: {e}"))?;
                if cfg.get_connect_timeout().is_none() {
                    cfg.connect_timeout(Duration::from_secs(5));
                }
                let client = cfg
                    .connect(postgres::NoTls)
                    .map_err(|e| format!("{at}: {e}"))?;
                Store::Postgres(Box::new(client), at)
            }
        };
        store.migrate()?;
        Ok(store)
    }

    /// The database as it may be shown.
    pub fn at(&self) -> &str {
        match self {
            Store::Sqlite(_, at) | Store::Postgres(_, at) => at,
        }
    }

    /// Applies the migrations the database lacks, in one transaction (PostgreSQL: under a lock,
    /// so two processes starting at once apply each once); refuses a newer database.
    fn migrate(&mut self) -> Result<i64, String> {
        let at = self.at().to_string();
        let err = |e: &dyn std::fmt::Display| format!("{at}: {e}");
        let version_of = |v: Option<i64>| v.unwrap_or(0);
        let max = "SELECT max(version) FROM ledger_schema";
        let insert = "INSERT INTO ledger_schema (version) VALUES ($1)";
        match self {
            Store::Sqlite(conn, _) => {
                conn.execute_batch(VERSIONS).map_err(|e| err(&e))?;
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(|e| err(&e))?;
                let version = version_of(tx.query_row(max, [], |r| r.get(0)).map_err(|e| err(&e))?);
                if version > LATEST {
                    return Err(schema::too_new(&at, version));
                }
                for (n, steps) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                    for step in *steps {
                        tx.execute_batch(step).map_err(|e| err(&e))?;
                    }
                    tx.execute(insert, [n as i64 + 1]).map_err(|e| err(&e))?;
                }
                tx.commit().map_err(|e| err(&e))?;
                Ok(version)
            }
            Store::Postgres(client, _) => {
                // One process at a time makes and migrates the schema (two starting at once
                // would both make `ledger_schema`); the lock ends with the session at worst.
                client
                    .batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))
                    .map_err(|e| err(&pg(e)))?;
                let migrated = (|| -> Result<Result<i64, i64>, String> {
                    client.batch_execute(VERSIONS).map_err(pg)?;
                    let mut tx = client.transaction().map_err(pg)?;
                    let version = version_of(tx.query_one(max, &[]).map_err(pg)?.get(0));
                    if version > LATEST {
                        return Ok(Err(version));
                    }
                    for (n, steps) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                        for step in *steps {
                            tx.batch_execute(step).map_err(pg)?;
                        }
                        tx.execute(insert, &[&(n as i64 + 1)]).map_err(pg)?;
                    }
                    tx.commit().map_err(pg)?;
                    Ok(Ok(version))
                })();
                let _ =
                    client.batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"));
                match migrated {
                    Ok(Ok(version)) => Ok(version),
                    Ok(Err(newer)) => Err(schema::too_new(&at, newer)),
                    Err(e) => Err(err(&e)),
                }
            }
        }
    }

    /// Writes `rows` (made by `process`) and adds them to the roll-ups, in one transaction.
    pub fn write(&mut self, process: &str, rows: &[Row]) -> Result<(), String> {
        let rollups = ROLLUPS.map(|(table, width, owned)| (table, owned, rollup(rows, width)));
        match self {
            Store::Sqlite(conn, _) => {
                let tx = conn.transaction().map_err(|e| e.to_string())?;
                {
                    for chunk in rows.chunks(CHUNK) {
                        let mut insert = tx
                            .prepare_cached(&insert_rows(chunk.len()))
                            .map_err(|e| e.to_string())?;
                        let flags: Vec<(i64, i64)> = chunk
                            .iter()
                            .map(|r| (i64::from(r.cancelled), i64::from(r.fell_back)))
                            .collect();
                        let params: Vec<&dyn rusqlite::ToSql> = chunk
                            .iter()
                            .zip(&flags)
                            .flat_map(|(r, f)| row_params!(dyn rusqlite::ToSql, process, r, f))
                            .collect();
                        insert
                            .execute(params.as_slice())
                            .map_err(|e| e.to_string())?;
                    }
                    // A clients' table is given each owner's sums in turn: they add up.
                    for (table, owned, groups) in &rollups {
                        let mut up = tx
                            .prepare(&upsert(table, *owned))
                            .map_err(|e| e.to_string())?;
                        for (key, s) in groups {
                            let p = rollup_params!(dyn rusqlite::ToSql, *owned, key, s);
                            up.execute(p.as_slice()).map_err(|e| e.to_string())?;
                        }
                    }
                }
                tx.commit().map_err(|e| e.to_string())
            }
            Store::Postgres(client, _) => {
                let mut tx = client.transaction().map_err(pg)?;
                for chunk in rows.chunks(CHUNK) {
                    let flags: Vec<(i64, i64)> = chunk
                        .iter()
                        .map(|r| (i64::from(r.cancelled), i64::from(r.fell_back)))
                        .collect();
                    let params: Vec<&(dyn postgres::types::ToSql + Sync)> = chunk
                        .iter()
                        .zip(&flags)
                        .flat_map(|(r, f)| {
                            row_params!(dyn postgres::types::ToSql + Sync, process, r, f)
                        })
                        .collect();
                    tx.execute(&insert_rows(chunk.len()), &params).map_err(pg)?;
                }
                for (table, owned, groups) in &rollups {
                    let up = tx.prepare(&upsert(table, *owned)).map_err(pg)?;
                    for (key, s) in groups {
                        let p = rollup_params!(dyn postgres::types::ToSql + Sync, *owned, key, s);
                        tx.execute(&up, &p).map_err(pg)?;
                    }
                }
                tx.commit().map_err(pg)
            }
        }
    }

    /// Whether the row `seq` of `process` is written (a batch whose commit's outcome is
    /// unknown is looked for by its first row).
    pub fn holds(&mut self, process: &str, seq: i64) -> Result<bool, String> {
        let q = "SELECT count(*) FROM requests WHERE process = $1 AND seq = $2";
        let n: i64 = match self {
            Store::Sqlite(conn, _) => conn
                .query_row(q, rusqlite::params![process, seq], |r| r.get(0))
                .map_err(|e| e.to_string())?,
            Store::Postgres(client, _) => {
                client.query_one(q, &[&process, &seq]).map_err(pg)?.get(0)
            }
        };
        Ok(n > 0)
    }

    /// Deletes the raw rows older than `before_ms` (the roll-ups stay); how many.
    pub fn prune(&mut self, before_ms: i64) -> Result<u64, String> {
        let q = "DELETE FROM requests WHERE at_ms < $1";
        match self {
            Store::Sqlite(conn, _) => conn
                .execute(q, [before_ms])
                .map(|n| n as u64)
                .map_err(|e| e.to_string()),
            Store::Postgres(client, _) => client.execute(q, &[&before_ms]).map_err(pg),
        }
    }

    /// Whether the connection is lost for good (PostgreSQL), so the next write reconnects.
    pub fn is_closed(&self) -> bool {
        matches!(self, Store::Postgres(c, _) if c.is_closed())
    }

    /// Sums of the hourly roll-ups from `since_ms` on (by hour: a bucket that began before it
    /// is not counted), grouped by `by` and ordered by the groups' keys.
    pub fn totals(&mut self, since_ms: i64, by: &[Dim]) -> Result<Vec<Total>, String> {
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
        let total = |get: &dyn Fn(usize) -> Result<Option<String>, String>,
                     int: &dyn Fn(usize) -> Result<Option<i64>, String>,
                     float: &dyn Fn(usize) -> Result<Option<f64>, String>|
         -> Result<Total, String> {
            Ok(Total {
                keys: (0..n)
                    .map(|i| get(i).map(Option::unwrap_or_default))
                    .collect::<Result<_, _>>()?,
                requests: int(n)?.unwrap_or(0),
                errors: int(n + 1)?.unwrap_or(0),
                prompt_tokens: int(n + 2)?.unwrap_or(0),
                cached_tokens: int(n + 3)?.unwrap_or(0),
                output_tokens: int(n + 4)?.unwrap_or(0),
                gpu_prefill_s: float(n + 5)?.unwrap_or(0.0),
                gpu_decode_s: float(n + 6)?.unwrap_or(0.0),
            })
        };
        let mut out = Vec::new();
        match self {
            Store::Sqlite(conn, _) => {
                let mut st = conn.prepare(&q).map_err(|e| e.to_string())?;
                let mut rows = st.query([since_ms]).map_err(|e| e.to_string())?;
                while let Some(r) = rows.next().map_err(|e| e.to_string())? {
                    out.push(total(
                        &|i| r.get(i).map_err(|e| e.to_string()),
                        &|i| r.get(i).map_err(|e| e.to_string()),
                        &|i| r.get(i).map_err(|e| e.to_string()),
                    )?);
                }
            }
            Store::Postgres(client, _) => {
                for r in client.query(&q, &[&since_ms]).map_err(pg)? {
                    out.push(total(
                        &|i| r.try_get(i).map_err(pg),
                        &|i| r.try_get(i).map_err(pg),
                        &|i| r.try_get(i).map_err(pg),
                    )?);
                }
            }
        }
        // A report with no rows at all still has its one total when nothing is grouped.
        out.retain(|t| !by.is_empty() || t.requests > 0);
        Ok(out)
    }
}

impl Store {
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
    ) -> Result<Vec<Bucketed>, String> {
        let q = buckets_query(width_ms, owner.is_some())?;
        let mut out = Vec::new();
        match self {
            Store::Sqlite(conn, _) => {
                let mut st = conn.prepare(&q).map_err(|e| e.to_string())?;
                let mut params: Vec<&dyn rusqlite::ToSql> = vec![&from_ms, &to_ms];
                params.extend(owner.as_ref().map(|c| c as &dyn rusqlite::ToSql));
                let mut rows = st.query(params.as_slice()).map_err(|e| e.to_string())?;
                while let Some(r) = rows.next().map_err(|e| e.to_string())? {
                    out.push(Bucketed::read(
                        |i| r.get(i).map_err(|e| e.to_string()),
                        |i| r.get(i).map_err(|e| e.to_string()),
                    )?);
                }
            }
            Store::Postgres(pg_client, _) => {
                let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![&from_ms, &to_ms];
                params.extend(
                    owner
                        .as_ref()
                        .map(|c| c as &(dyn postgres::types::ToSql + Sync)),
                );
                for r in pg_client.query(&q, &params).map_err(pg)? {
                    out.push(Bucketed::read(
                        |i| r.try_get(i).map_err(pg),
                        |i| r.try_get(i).map_err(pg),
                    )?);
                }
            }
        }
        Ok(out)
    }
}

/// The query of [`Store::buckets`]: buckets of `width_ms` starting in `[$1, $2)`, of the owner
/// `$3` alone where `one_owner`.
pub(super) fn buckets_query(width_ms: i64, one_owner: bool) -> Result<String, String> {
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
                .ok_or_else(|| format!("no roll-up of {w} ms"))?;
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
