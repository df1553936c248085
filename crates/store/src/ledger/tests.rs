//! The ledger against a real SQLite file: its schema's versions, batches and roll-ups, the
//! writer's bound.

use std::time::Duration;

use super::*;
use crate::db::LedgerUrl;
use crate::ledger::Settings;

fn settings(dir: &tempfile::TempDir) -> Settings {
    Settings {
        url: LedgerUrl::Sqlite(dir.path().join("usage.db")),
        batch_rows: 3,
        batch_interval: Duration::from_millis(10),
        buffer_rows: 1000,
        retention_days: 0,
        budget_refresh: Duration::from_secs(5),
        check_interval: Duration::from_secs(3600),
        required: false,
    }
}

/// Of what [`Store::spent`] read, each client's tokens and GPU-seconds.
fn tokens_and_gpu(spent: Vec<(String, crate::budget::Amounts)>) -> Vec<(String, i64, f64)> {
    let each = |(c, a): (String, crate::budget::Amounts)| (c, a.tokens as i64, a.gpu_ms / 1000.0);
    spent.into_iter().map(each).collect()
}

fn row(i: i64, client: &str, alias: &str, at_ms: i64) -> Row {
    Row {
        seq: i,
        at_ms,
        request_id: format!("req-{i}"),
        client: client.into(),
        owner: None,
        alias: alias.into(),
        backend: "gpu".into(),
        api: "chat_completions",
        status: if i % 4 == 3 { 400 } else { 200 },
        prompt_tokens: 100 + i,
        cached_tokens: i,
        output_tokens: 10 + i,
        gpu_prefill_s: 0.25 * i as f64,
        gpu_decode_s: 0.5,
        ttft_ms: Some(20),
        duration_ms: 200,
        queue_ms: 0,
        cancelled: false,
        preempted: 0,
        fell_back: false,
        charged_tokens: None,
        charged_gpu_s: None,
    }
}

fn raw(path: &std::path::Path, sql: &str) -> i64 {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn a_new_database_gets_every_version_and_an_old_one_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(&dir);
    drop(Store::open(&s.url).unwrap());
    drop(Store::open(&s.url).unwrap());
    let path = dir.path().join("usage.db");
    assert_eq!(
        raw(&path, "SELECT max(version) FROM ledger_schema"),
        SCHEMA_VERSION
    );
    assert_eq!(
        raw(&path, "SELECT count(*) FROM ledger_schema"),
        SCHEMA_VERSION
    );
}

#[test]
fn a_database_of_version_1_is_migrated_and_its_rows_count_their_usage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage.db");
    // As version 1 left it: its tables and one row.
    let c = at_version(&path, 1);
    c.execute_batch(
        "INSERT INTO requests VALUES ('old', 0, 5, 'r', 'ann', 'a', 'gpu', 'chat_completions',
           200, 100, 0, 20, 1.5, 0.5, NULL, 10, 0, 0, 0, 0);",
    )
    .unwrap();
    drop(c);
    let mut store = Store::open(&settings(&dir).url).unwrap();
    assert_eq!(
        raw(&path, "SELECT max(version) FROM ledger_schema"),
        SCHEMA_VERSION
    );
    let index = "SELECT count(*) FROM sqlite_master WHERE name = 'requests_client'";
    assert_eq!(raw(&path, index), 1, "the index by client is made");
    let mut charged = row(1, "ann", "a", 6);
    (charged.charged_tokens, charged.charged_gpu_s) = (Some(50), Some(0.25));
    store.write("new", &[charged]).unwrap();
    // The old row counts its usage; the new one what it was charged.
    let spent = store.spent(0, 100, "me").unwrap();
    let (requests, output) = (spent[0].1.requests, spent[0].1.output_tokens);
    assert_eq!((requests, output), (2.0, 20.0 + 11.0));
    assert_eq!(
        tokens_and_gpu(spent),
        vec![("ann".to_string(), 120 + 50, 2.0 + 0.25)]
    );
    assert_eq!(store.spent(0, 100, "new").unwrap()[0].1.tokens, 120.0);
}

#[test]
fn a_database_of_version_4_is_migrated_with_its_usage_owned_by_its_clients() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage.db");
    // As version 4 left it: one row of ann's and its roll-ups.
    let c = at_version(&path, 4);
    c.execute_batch(
        "INSERT INTO requests VALUES ('old', 0, 5, 'r', 'ann', 'a', 'gpu', 'chat_completions',
           200, 100, 0, 20, 1.5, 0.5, NULL, 10, 0, 0, 0, 0, 50, 0.25);
         INSERT INTO usage_hourly VALUES (0, 'ann', 'a', 1, 0, 100, 0, 20, 1.5, 0.5);
         INSERT INTO usage_daily VALUES (0, 'ann', 'a', 1, 0, 100, 0, 20, 1.5, 0.5);",
    )
    .unwrap();
    drop(c);
    let mut store = Store::open(&settings(&dir).url).unwrap();
    assert_eq!(
        raw(&path, "SELECT max(version) FROM ledger_schema"),
        SCHEMA_VERSION
    );
    // The old usage is its client's; its budget still reads it.
    for table in ["owner_hourly", "owner_daily"] {
        let owned = format!("SELECT count(*) FROM {table} WHERE owner = 'ann' AND requests = 1");
        assert_eq!(raw(&path, &owned), 1, "{table}");
    }
    assert_eq!(
        raw(&path, "SELECT count(*) FROM requests WHERE owner IS NULL"),
        1
    );
    assert_eq!(
        tokens_and_gpu(store.spent(0, 100, "me").unwrap()),
        vec![("ann".to_string(), 50, 0.25)]
    );
    // Two keys' rows of the one client: the budgets read the client, the usage each owner.
    let (mut one, mut two) = (row(1, "anonymous", "a", 7), row(2, "anonymous", "a", 8));
    (one.owner, two.owner) = (Some("key-1".into()), Some("key-2".into()));
    store.write("new", &[one, two]).unwrap();
    let spent = tokens_and_gpu(store.spent(0, 100, "me").unwrap());
    let anonymous = spent.iter().find(|s| s.0 == "anonymous");
    assert_eq!(
        anonymous,
        Some(&("anonymous".to_string(), 112 + 114, 0.75 + 1.0))
    );
    let mut groups = |width, owner| -> Vec<(String, String, i64)> {
        let rows = store.buckets(width, 0, width, owner).unwrap();
        rows.into_iter()
            .map(|b| (b.client, b.owner, b.requests))
            .collect()
    };
    let of = |g: &[(&str, &str, i64)]| -> Vec<(String, String, i64)> {
        g.iter()
            .map(|(c, o, n)| (c.to_string(), o.to_string(), *n))
            .collect()
    };
    // Each owner reads its own, the client of a key's none of the key's.
    for width in [60_000, 3_600_000, 86_400_000] {
        let one = of(&[("anonymous", "key-1", 1)]);
        assert_eq!(groups(width, Some("key-1")), one, "{width}");
        assert_eq!(
            groups(width, Some("ann")),
            of(&[("ann", "ann", 1)]),
            "{width}"
        );
        assert_eq!(groups(width, Some("anonymous")), of(&[]), "{width}");
    }
    // The clients' roll-ups, as every version writes them, sum the owners of a client.
    let clients = of(&[("ann", "ann", 1), ("anonymous", "anonymous", 2)]);
    for width in [3_600_000, 86_400_000] {
        assert_eq!(groups(width, None), clients, "{width}");
    }
    let days = store.daily(0).unwrap();
    let owners: Vec<&str> = days.iter().map(|d| d.1.as_str()).collect();
    assert_eq!(owners, ["ann", "key-1", "key-2"]);
    drop(store);
    an_owners_rows_are_read_through_the_index_of_owners(&path);
    a_process_of_version_4_writes_on(&path);
}

/// A SQLite database at `path` as version `version` of the schema left it, without rows.
fn at_version(path: &std::path::Path, version: usize) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(schema::VERSIONS).unwrap();
    for (n, steps) in schema::MIGRATIONS[..version].iter().enumerate() {
        for step in *steps {
            c.execute_batch(step).unwrap();
        }
        c.execute(
            "INSERT INTO ledger_schema (version) VALUES (?1)",
            [n as i64 + 1],
        )
        .unwrap();
    }
    c
}

/// An owner's raw rows in the database at `path` are found through the index of owners, a
/// client's own through the index of clients.
fn an_owners_rows_are_read_through_the_index_of_owners(path: &std::path::Path) {
    let q = store::buckets_query(60_000, true).unwrap();
    let c = rusqlite::Connection::open(path).unwrap();
    let mut plan = c.prepare(&format!("EXPLAIN QUERY PLAN {q}")).unwrap();
    let params: [&dyn rusqlite::ToSql; 3] = [&0, &60_000, &"key-1"];
    let details: Vec<String> = plan
        .query_map(&params[..], |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for index in ["requests_owner (owner=?", "requests_client (client=?"] {
        assert!(details.iter().any(|d| d.contains(index)), "{details:?}");
    }
}

/// A process of version 4 sharing the database at `path` writes on as it did (a rolling
/// upgrade).
fn a_process_of_version_4_writes_on(path: &std::path::Path) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(
        "INSERT INTO requests (process, seq, at_ms, request_id, client, alias, backend, api,
           status, prompt_tokens, cached_tokens, output_tokens, gpu_prefill_s, gpu_decode_s,
           ttft_ms, duration_ms, queue_ms, cancelled, preempted, fell_back, charged_tokens,
           charged_gpu_s) VALUES ('v4', 1, 9, 'r', 'ann', 'a', 'gpu', 'chat_completions', 200,
           1, 0, 1, 0.0, 0.0, NULL, 1, 0, 0, 0, 0, NULL, NULL);
         INSERT INTO usage_hourly (bucket_ms, client, alias, requests, errors, prompt_tokens,
           cached_tokens, output_tokens, gpu_prefill_s, gpu_decode_s)
           VALUES (0, 'ann', 'a', 1, 0, 1, 0, 1, 0.0, 0.0)
           ON CONFLICT (bucket_ms, client, alias) DO UPDATE SET
           requests = usage_hourly.requests + excluded.requests;",
    )
    .unwrap();
    let ann = "SELECT requests FROM usage_hourly WHERE client = 'ann'";
    assert_eq!(raw(path, ann), 2);
}

#[test]
fn a_database_of_a_newer_version_is_refused_and_not_altered() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(&dir);
    drop(Store::open(&s.url).unwrap());
    let path = dir.path().join("usage.db");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute("INSERT INTO ledger_schema (version) VALUES (99)", [])
        .unwrap();
    drop(c);
    let before = std::fs::read(&path).unwrap();
    let err = Store::open(&s.url).unwrap_err().to_string();
    assert!(err.contains("schema version 99"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn a_file_that_is_no_database_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(&dir);
    let path = dir.path().join("usage.db");
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    let err = Store::open(&s.url).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("not a database"), "{err}");
}

#[test]
fn roll_ups_equal_the_raw_rows_and_a_batch_is_found_by_its_first_row() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(&dir);
    let mut store = Store::open(&s.url).unwrap();
    let day = 1_796_515_200_000;
    // Written in two batches, the second more than one statement's rows.
    let rows: Vec<Row> = (0..130)
        .map(|i| {
            let (client, alias) = (
                ["ann", "bob"][i as usize % 2],
                ["a", "b", "c"][i as usize % 3],
            );
            row(i, client, alias, day + i * 1_000_000)
        })
        .collect();
    assert!(!store.holds("p", 0).unwrap());
    store.write("p", &rows[..25]).unwrap();
    store.write("p", &rows[25..]).unwrap();
    assert!(store.holds("p", 0).unwrap() && store.holds("p", 129).unwrap());
    for by in [
        vec![Dim::Client, Dim::Alias],
        vec![Dim::Day],
        vec![Dim::Hour, Dim::Client],
        vec![],
    ] {
        let totals = store.totals(0, &by).unwrap();
        let sum = |f: fn(&Total) -> i64| totals.iter().map(f).sum::<i64>();
        assert_eq!(sum(|t| t.requests), 130, "{by:?}");
        assert_eq!(sum(|t| t.errors), 32, "{by:?}");
        assert_eq!(
            sum(|t| t.prompt_tokens),
            rows.iter().map(|r| r.prompt_tokens).sum::<i64>()
        );
        assert_eq!(
            sum(|t| t.output_tokens),
            rows.iter().map(|r| r.output_tokens).sum::<i64>()
        );
        let prefill: f64 = totals.iter().map(|t| t.gpu_prefill_s).sum();
        assert!((prefill - 0.25 * 8385.0).abs() < 1e-9, "{prefill}");
    }
    // Per client and alias, each group's sums equal its raw rows'.
    let path = dir.path().join("usage.db");
    for t in store.totals(0, &[Dim::Client, Dim::Alias]).unwrap() {
        let q = format!(
            "SELECT sum(prompt_tokens) FROM requests WHERE client = '{}' AND alias = '{}'",
            t.keys[0], t.keys[1]
        );
        assert_eq!(raw(&path, &q), t.prompt_tokens, "{t:?}");
    }
    // Retention deletes raw rows only.
    assert_eq!(store.prune(day + 20 * 1_000_000).unwrap(), 20);
    assert_eq!(raw(&path, "SELECT count(*) FROM requests"), 110);
    let all = store.totals(0, &[]).unwrap();
    assert_eq!(all[0].requests, 130);
}

#[test]
fn the_writer_writes_every_row_and_closing_writes_what_waits() {
    let dir = tempfile::tempdir().unwrap();
    let counters = Counters::default();
    let ledger = Ledger::start(&settings(&dir), counters.clone(), Default::default()).unwrap();
    for i in 0..10 {
        ledger.record(row(0, "ann", "a", 1_796_515_200_000 + i));
    }
    ledger.close();
    let path = dir.path().join("usage.db");
    assert_eq!(raw(&path, "SELECT count(*) FROM requests"), 10);
    assert_eq!(
        raw(&path, "SELECT count(DISTINCT seq) FROM requests"),
        10,
        "each row numbered once"
    );
    assert_eq!((counters.written.get(), counters.dropped.get()), (10, 0));
    assert_eq!(counters.waiting.get(), 0);
}

#[test]
fn rows_over_the_buffer_are_dropped_and_counted_never_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(&dir);
    (s.batch_rows, s.buffer_rows) = (5, 5);
    s.batch_interval = Duration::from_secs(600);
    let counters = Counters::default();
    let ledger = Ledger::start(&s, counters.clone(), Default::default()).unwrap();
    // The database is held by another writer: the writer's batch cannot commit.
    let path = dir.path().join("usage.db");
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    for i in 0..12 {
        ledger.record(row(0, "ann", "a", 1_796_515_200_000 + i));
    }
    assert_eq!(counters.dropped.get(), 7);
    blocker.execute_batch("COMMIT").unwrap();
    ledger.close();
    assert_eq!(raw(&path, "SELECT count(*) FROM requests"), 5);
    assert_eq!(counters.written.get() + counters.dropped.get(), 12);
}

/// Polls `f` until it holds, for at most ten seconds.
fn until(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn what_other_processes_spent_is_read_at_start_and_again_in_a_new_zone() {
    use crate::calendar::Calendar;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(&dir);
    let now = now_ms();
    let p = Calendar::default().periods(now);
    // An earlier process's rows: today, earlier this month (when the month began before
    // today), and last month.
    let mut rows = vec![
        row(0, "ann", "a", now),
        row(1, "ann", "a", p.month.0 - 3_600_000),
    ];
    if p.month.0 < p.day.0 {
        rows.push(row(2, "ann", "a", p.month.0));
    }
    Store::open(&s.url)
        .unwrap()
        .write("earlier", &rows)
        .unwrap();
    let counters = Counters::default();
    let ledger = Ledger::start(&s, counters.clone(), Some(Calendar::default())).unwrap();
    let spent = ledger.board().spent();
    assert_eq!(spent.periods, p);
    let month = if p.month.0 < p.day.0 {
        110.0 + 114.0
    } else {
        110.0
    };
    // Tokens today, this month; GPU-milliseconds today, this month.
    let gpu_month = 500.0 + (month - 110.0) / 114.0 * 1000.0;
    use crate::limits::Window;
    let ann = &spent.by_client["ann"];
    let (day, this_month) = (&ann[Window::Day], &ann[Window::Month]);
    assert_eq!(
        [day.tokens, this_month.tokens, day.gpu_ms, this_month.gpu_ms],
        [110.0, month, 500.0, gpu_month]
    );
    // This process's own rows are its own count's, never the ledger's.
    ledger.record(row(0, "bob", "a", now));
    until("bob's row written", || counters.written.get() == 1);
    let tokyo = Calendar::named("Asia/Tokyo").unwrap();
    ledger.set_calendar(Some(tokyo.clone()));
    let want = tokyo.periods(now_ms());
    until("the spending of Tokyo's day", || {
        ledger.board().spent().periods == want
    });
    assert!(!ledger.board().spent().by_client.contains_key("bob"));
    ledger.close();
}

#[test]
fn without_a_budget_of_a_day_or_month_nothing_spent_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(&dir);
    let rows = [row(0, "ann", "a", now_ms())];
    Store::open(&s.url)
        .unwrap()
        .write("earlier", &rows)
        .unwrap();
    let ledger = Ledger::start(&s, Counters::default(), None).unwrap();
    assert!(ledger.board().spent().by_client.is_empty());
    ledger.close();
}

#[test]
fn a_clients_minute_buckets_are_read_through_the_index_by_client() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&settings(&dir).url).unwrap();
    let day = 1_796_515_200_000;
    let rows: Vec<Row> = (0..90)
        .map(|i| {
            row(
                i,
                ["ann", "bob", "cy"][i as usize % 3],
                "a",
                day + i * 30_000,
            )
        })
        .collect();
    store.write("p", &rows).unwrap();
    // Its rows are found by the client, not by scanning every client's of the range.
    let q = store::buckets_query(60_000, true).unwrap();
    let c = rusqlite::Connection::open(dir.path().join("usage.db")).unwrap();
    let mut plan = c.prepare(&format!("EXPLAIN QUERY PLAN {q}")).unwrap();
    let params: [&dyn rusqlite::ToSql; 3] = [&day, &(day + 3_600_000), &"bob"];
    let n = plan.parameter_count();
    let details: Vec<String> = plan
        .query_map(&params[..n], |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        details
            .iter()
            .any(|d| d.contains("SEARCH requests USING INDEX requests_client (client=?")),
        "{details:?}"
    );
    let own = store
        .buckets(60_000, day, day + 3_600_000, Some("bob"))
        .unwrap();
    assert_eq!(own.iter().map(|b| b.requests).sum::<i64>(), 30, "{own:?}");
    assert!(own.iter().all(|b| b.client == "bob"), "{own:?}");
}

#[test]
fn a_ledger_that_cannot_be_used_starts_out_of_use_unless_required_and_opens_again_when_sound() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(&dir);
    let path = dir.path().join("usage.db");
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    s.required = true;
    let err = Ledger::start(&s, Counters::default(), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is corrupt") && err.contains("not a database"),
        "{err}"
    );
    s.required = false;
    let counters = Counters::default();
    let ledger = Ledger::start(&s, counters.clone(), None).unwrap();
    assert_eq!(counters.up.get(), 0);
    let (why, ..) = ledger.trouble();
    assert!(why.unwrap().contains("is corrupt"));
    for i in 0..5 {
        ledger.record(row(0, "ann", "a", 1_796_515_200_000 + i));
    }
    assert_eq!(raw_of(&path), None, "nothing is written to a damaged file");
    // The operator moves the damaged file aside: a new one is made at the next try.
    std::fs::rename(&path, dir.path().join("usage.db.damaged")).unwrap();
    until("the rows written to a new file", || {
        counters.written.get() == 5
    });
    assert_eq!(counters.up.get(), 1);
    assert_eq!(ledger.trouble().0, None);
    ledger.close();
    assert_eq!(raw(&path, "SELECT count(*) FROM requests"), 5);
}

/// The rows of the SQLite file at `path`, where it is a ledger.
fn raw_of(path: &std::path::Path) -> Option<i64> {
    let c = rusqlite::Connection::open(path).ok()?;
    c.query_row("SELECT count(*) FROM requests", [], |r| r.get(0))
        .ok()
}
