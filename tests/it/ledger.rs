//! The usage ledger from outside: the proxy in front of a simulator records a row per request
//! that reached a model endpoint in a real SQLite file, `switchboard usage` reads it back;
//! two ledgers (as two processes) share a real PostgreSQL server, started here on loopback
//! (Debian package `postgresql`; skipped without it, unless `SWITCHBOARD_TEST_NEED_POSTGRES`
//! is set, as CI does), and one survives that server's restart.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::postgres::Postgres;
use common::served::{metrics_at, Served};
use common::*;
use serde_json::json;
use switchboard_proxy::config::{Ledger as Settings, LedgerUrl};
use switchboard_proxy::ledger::{self, Counters, Dim, Ledger, Row};
use switchboard_sim::SimConfig;

fn config(gpu: &str, dead: &str, db: &Path) -> String {
    format!(
        r#"
[backends.gpu]
url = "{gpu}"
flavor = "llamacpp"
slots = 4
[backends.dead]
url = "{dead}"
flavor = "llamacpp"
[aliases.frank]
backend = "gpu"
[aliases.gone]
backend = "dead"
fallbacks = ["frank"]
[clients.ann]
key_env = "SB_T_LEDGER_ANN"
[clients.bob]
key_env = "SB_T_LEDGER_BOB"
[ledger]
url = "sqlite://{}"
batch_interval_ms = 10
"#,
        db.display()
    )
}

fn raw<T: rusqlite::types::FromSql>(db: &Path, sql: &str) -> T {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test]
async fn every_api_answered_or_refused_is_a_row_and_usage_reads_them_back() {
    std::env::set_var("SB_T_LEDGER_ANN", "ann-key");
    std::env::set_var("SB_T_LEDGER_BOB", "bob-key");
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let toml = config(&gpu.url(), &dead_url().await, &db);
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, &toml).unwrap();
    let p = proxy(&toml, &[]).await;
    let c = client();
    let post = |key: &'static str, path: &'static str, body: serde_json::Value| {
        let req = c.post(p.url(path)).bearer_auth(key).json(&body);
        async move { within("an answer", req.send()).await.unwrap() }
    };
    let chat = |model: &str, stream: bool| {
        json!({"model": model, "stream": stream, "max_tokens": 5,
               "messages": [{"role": "user", "content": "hi"}]})
    };
    let r = post("ann-key", "/v1/chat/completions", chat("frank", false)).await;
    assert_eq!(r.status(), 200);
    let r = post("ann-key", "/v1/chat/completions", chat("frank", true)).await;
    assert_eq!(r.status(), 200);
    sse_payloads(r).await;
    let r = post(
        "bob-key",
        "/v1/responses",
        json!({"model": "frank", "input": "hi", "max_output_tokens": 5}),
    )
    .await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let r = post(
        "bob-key",
        "/v1/messages",
        json!({"model": "frank", "max_tokens": 5,
               "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let r = post("ann-key", "/v1/chat/completions", chat("nope", false)).await;
    assert_eq!(r.status(), 404);
    let r = post("ann-key", "/v1/chat/completions", chat("gone", false)).await;
    assert_eq!(r.status(), 200);
    // Without a key: nobody's usage, no row.
    let r = post("wrong-key", "/v1/chat/completions", chat("frank", false)).await;
    assert_eq!(r.status(), 401);

    let written = p.state.metrics.ledger.written.clone();
    until("six rows written", || written.get() >= 6).await;
    assert_eq!(raw::<i64>(&db, "SELECT count(*) FROM requests"), 6);
    let apis: String = raw(
        &db,
        "SELECT group_concat(api, ',') FROM (SELECT api FROM requests ORDER BY api)",
    );
    assert_eq!(
        apis,
        "chat_completions,chat_completions,chat_completions,chat_completions,messages,responses"
    );
    let fell: (String, i64) = {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.query_row(
            "SELECT alias, status FROM requests WHERE fell_back = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    assert_eq!(fell, ("frank".to_string(), 200));
    assert_eq!(
        raw::<i64>(
            &db,
            "SELECT count(*) FROM requests WHERE status = 404 AND client = 'ann'"
        ),
        1
    );
    assert_eq!(
        raw::<i64>(
            &db,
            "SELECT count(*) FROM requests WHERE status = 200 AND \
             (prompt_tokens = 0 OR output_tokens = 0 OR duration_ms < 0)"
        ),
        0,
        "every answered request has its tokens"
    );
    let hourly: i64 = raw(&db, "SELECT sum(output_tokens) FROM usage_hourly");
    let rows: i64 = raw(&db, "SELECT sum(output_tokens) FROM requests");
    assert_eq!(hourly, rows);

    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["usage", "--config"])
        .arg(&path)
        .args(["--by", "client", "--format", "csv", "--since", "1d"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("client,requests,errors,"), "{csv}");
    assert!(lines[1].starts_with("ann,4,1,"), "{csv}");
    assert!(lines[2].starts_with("bob,2,0,"), "{csv}");
}

#[test]
fn usage_without_a_ledger_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    std::fs::write(
        &path,
        "[backends.b]\nurl = \"http://127.0.0.1:9\"\nflavor = \"llamacpp\"\n[aliases.a]\nbackend = \"b\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["usage", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no [ledger]"), "{err}");
}

#[test]
fn usage_reads_the_ledger_with_client_key_variables_unset() {
    let dir = tempfile::tempdir().unwrap();
    let (db, path) = (dir.path().join("usage.db"), dir.path().join("routes.toml"));
    let url = LedgerUrl::Sqlite(db.clone());
    ledger::with_store(&url, |s| s.write("earlier", &[row("ann", 0)])).unwrap();
    // The serving process has these variables; the operator's shell reading usage has none.
    std::fs::write(
        &path,
        format!(
            "[server]\nadmin_keys_env = \"SB_T_USAGE_NEVER_SET_ADMIN\"\n\
             [backends.b]\nurl = \"http://127.0.0.1:9\"\nflavor = \"llamacpp\"\n\
             [aliases.a]\nbackend = \"b\"\n\
             [clients.ann]\nkey_env = \"SB_T_USAGE_NEVER_SET_ANN\"\n\
             [ledger]\nurl = \"sqlite://{}\"\n",
            db.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["usage", "--format", "csv", "--by", "client", "--config"])
        .arg(&path)
        .env_remove("SB_T_USAGE_NEVER_SET_ADMIN")
        .env_remove("SB_T_USAGE_NEVER_SET_ANN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let csv = String::from_utf8(out.stdout).unwrap();
    assert!(
        csv.lines().nth(1).unwrap().starts_with("ann,1,0,10,"),
        "{csv}"
    );
}

fn pg_settings(url: &str) -> Settings {
    Settings {
        url: LedgerUrl::Postgres(url.to_string()),
        batch_rows: 50,
        batch_interval: Duration::from_millis(10),
        buffer_rows: 10_000,
        retention_days: 0,
        budget_refresh: Duration::from_secs(5),
        check_interval: Duration::from_secs(3600),
        required: false,
    }
}

fn row(client: &str, i: i64) -> Row {
    Row {
        at_ms: ledger::now_ms() - i,
        request_id: format!("{client}-{i}"),
        client: client.into(),
        alias: "frank".into(),
        backend: "gpu".into(),
        api: "chat_completions",
        status: 200,
        prompt_tokens: 10,
        output_tokens: 2,
        duration_ms: 5,
        ..Row::default()
    }
}

fn pg_count(url: &str, sql: &'static str) -> i64 {
    let url = LedgerUrl::Postgres(url.to_string());
    ledger::with_store(&url, move |s| Ok(s.db().one(sql, &[])?.int(0)?)).unwrap()
}

#[test]
fn two_processes_share_one_postgres_without_a_row_lost_or_written_twice() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url();
    // Both start at once: the schema is made once.
    let (a, b) = std::thread::scope(|s| {
        let a =
            s.spawn(|| Ledger::start(&pg_settings(&url), Counters::default(), Default::default()));
        let b =
            s.spawn(|| Ledger::start(&pg_settings(&url), Counters::default(), Default::default()));
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    std::thread::scope(|s| {
        s.spawn(|| (0..600).for_each(|i| a.record(row("ann", i))));
        s.spawn(|| (0..400).for_each(|i| b.record(row("bob", i))));
    });
    a.close();
    b.close();
    assert_eq!(pg_count(&url, "SELECT count(*) FROM requests"), 1000);
    assert_eq!(
        pg_count(
            &url,
            "SELECT count(*) FROM (SELECT DISTINCT process, seq FROM requests) d"
        ),
        1000
    );
    assert_eq!(
        pg_count(&url, "SELECT count(*) FROM ledger_schema"),
        ledger::SCHEMA_VERSION
    );
    let by_client = ledger::with_store(&LedgerUrl::Postgres(url.clone()), |s| {
        s.totals(0, &[Dim::Client])
    })
    .unwrap();
    let counts: Vec<(String, i64, i64)> = by_client
        .iter()
        .map(|t| (t.keys[0].clone(), t.requests, t.prompt_tokens))
        .collect();
    assert_eq!(
        counts,
        [
            ("ann".to_string(), 600, 6000),
            ("bob".to_string(), 400, 4000)
        ]
    );
    // What the budgets read of each client, in PostgreSQL's types: its requests, the tokens
    // charged (prompt and output, none being recorded) and its output alone.
    let spent = ledger::with_store(&LedgerUrl::Postgres(url.clone()), |s| {
        s.spent(0, i64::MAX, "no such process")
    })
    .unwrap();
    let ann = spent.iter().find(|(c, _)| c == "ann").unwrap().1;
    assert_eq!(
        (ann.requests, ann.tokens, ann.output_tokens, ann.gpu_ms),
        (600.0, 7200.0, 1200.0, 0.0)
    );

    // A database a newer build wrote is refused, and left as it was.
    pg_count(&url, "SELECT count(*) FROM ledger_schema");
    let newer = LedgerUrl::Postgres(url.clone());
    ledger::with_store(&newer, |s| {
        Ok(s.db()
            .batch("INSERT INTO ledger_schema (version) VALUES (99)")?)
    })
    .unwrap();
    let required = Settings {
        required: true,
        ..pg_settings(&url)
    };
    let err = Ledger::start(&required, Counters::default(), Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("schema version 99"), "{err}");
    assert!(!err.contains("password"), "{err}");
    // Not required: out of use, and said so.
    let l = Ledger::start(&pg_settings(&url), Counters::default(), Default::default()).unwrap();
    assert!(l.trouble().0.unwrap().contains("schema version 99"));
}

#[test]
fn a_postgres_ledger_made_before_the_index_by_client_gets_it_and_reads_a_client_through_it() {
    let Some(pg) = Postgres::start() else { return };
    let url = LedgerUrl::Postgres(pg.url());
    // A database as version 3 left it: the index by client (version 4) not made, nor the
    // owners' column, index and roll-ups (version 5).
    ledger::with_store(&url, |s| {
        Ok(s.db().batch(
            "DROP INDEX requests_client; DROP INDEX requests_owner; \
             ALTER TABLE requests DROP COLUMN owner; DROP TABLE owner_hourly; \
             DROP TABLE owner_daily; DELETE FROM ledger_schema WHERE version > 3",
        )?)
    })
    .unwrap();
    let index = "SELECT count(*) FROM pg_indexes WHERE indexname = 'requests_client'";
    let rows: Vec<Row> = (0..30)
        .map(|i| Row {
            seq: i as i64,
            // Every third of ann's is a key's of `server.api_keys_env`, ann's client.
            owner: (i % 6 == 0).then(|| "key-0123456789abcdef".to_string()),
            ..row(["ann", "bob"][i % 2], i as i64)
        })
        .collect();
    let now = ledger::now_ms();
    let (own, key) = ledger::with_store(&url, move |s| {
        s.write("p", &rows)?;
        let (from, to) = (now - 3_600_000, now + 60_000);
        let own = s.buckets(60_000, from, to, Some("bob"))?;
        let hour = (now / 3_600_000) * 3_600_000;
        let hours = (hour - 3_600_000, hour + 3_600_000);
        let key = s.buckets(3_600_000, hours.0, hours.1, Some("key-0123456789abcdef"))?;
        Ok((own, key))
    })
    .unwrap();
    assert_eq!(key.iter().map(|b| b.requests).sum::<i64>(), 5, "{key:?}");
    assert_eq!(pg_count(&pg.url(), index), 1);
    assert_eq!(
        pg_count(&pg.url(), "SELECT max(version) FROM ledger_schema"),
        ledger::SCHEMA_VERSION
    );
    assert!(own.iter().all(|b| b.client == "bob"), "{own:?}");
    assert_eq!(own.iter().map(|b| b.requests).sum::<i64>(), 15);
}

#[test]
fn a_postgres_restart_mid_run_loses_no_row() {
    let Some(pg) = Postgres::start() else { return };
    let url = pg.url();
    let counters = Counters::default();
    let l = Ledger::start(&pg_settings(&url), counters.clone(), Default::default()).unwrap();
    (0..100).for_each(|i| l.record(row("ann", i)));
    pg.stop();
    (100..200).for_each(|i| l.record(row("ann", i)));
    // Its writes fail now: said (the status page's line, `switchboard_ledger_up` 0), rows wait.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while l.trouble().0.is_none() {
        assert!(std::time::Instant::now() < deadline, "no write failed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(counters.up.get(), 0);
    assert!(l.trouble().1 > 0, "rows wait");
    pg.ctl_start();
    (200..300).for_each(|i| l.record(row("ann", i)));
    l.close();
    assert_eq!(counters.dropped.get(), 0);
    assert_eq!(pg_count(&url, "SELECT count(*) FROM requests"), 300);
    assert_eq!(
        pg_count(
            &url,
            "SELECT CAST(sum(requests) AS BIGINT) FROM usage_daily"
        ),
        300
    );
}

#[tokio::test]
async fn the_usage_api_answers_admins_everyone_and_a_client_itself() {
    std::env::set_var("SB_T_USAGE_ANN", "ann-usage");
    std::env::set_var("SB_T_USAGE_BOB", "bob-usage");
    std::env::set_var("SB_T_USAGE_ADMIN", "admin-usage");
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let toml = format!(
        "[server]\nadmin_keys_env = \"SB_T_USAGE_ADMIN\"\n\
         [backends.gpu]\nurl = \"{}\"\nflavor = \"llamacpp\"\n[aliases.frank]\nbackend = \"gpu\"\n\
         [clients.ann]\nkey_env = \"SB_T_USAGE_ANN\"\n[clients.bob]\nkey_env = \"SB_T_USAGE_BOB\"\n\
         [ledger]\nurl = \"sqlite://{}\"\nbatch_interval_ms = 10\n",
        gpu.url(),
        db.display()
    );
    let p = proxy(&toml, &[]).await;
    let c = client();
    for key in ["ann-usage", "ann-usage", "bob-usage"] {
        let r = c
            .post(p.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&chat("frank", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let written = p.state.metrics.ledger.written.clone();
    until("three rows written", || written.get() >= 3).await;
    let start = ledger::now_ms() / 1000 - 3600;
    let get = |path: String, key: &'static str| {
        let req = c.get(p.url(&path)).bearer_auth(key);
        async move {
            let r = within("usage", req.send()).await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let org = format!(
        "/v1/organization/usage/completions?start_time={start}&bucket_width=1h&limit=2\
         &group_by[]=api_key_id&group_by[]=model"
    );
    let (status, page) = get(org.clone(), "admin-usage").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["object"], "page");
    let results: Vec<&serde_json::Value> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["results"].as_array().unwrap())
        .collect();
    let of = |client: &str| -> i64 {
        results
            .iter()
            .filter(|r| r["api_key_id"] == client && r["model"] == "frank")
            .map(|r| r["num_model_requests"].as_i64().unwrap())
            .sum()
    };
    assert_eq!((of("ann"), of("bob")), (2, 1), "{page}");
    assert!(results
        .iter()
        .all(|r| r["object"] == "organization.usage.completions.result"
            && r["input_tokens"].as_i64().unwrap() > 0));

    // A client's key is no admin key; at /v1/usage it sees its own usage alone.
    let (status, e) = get(org, "ann-usage").await;
    assert_eq!(status, 403);
    assert_eq!(e["error"]["code"], "admin_key_required");
    let own = format!("/v1/usage?start_time={start}&bucket_width=1d&group_by=api_key_id");
    let (status, page) = get(own.clone(), "bob-usage").await;
    assert_eq!(status, 200);
    let clients: Vec<&serde_json::Value> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["results"].as_array().unwrap())
        .map(|r| &r["api_key_id"])
        .collect();
    assert_eq!(clients, [&json!("bob")], "{page}");
    let (status, e) = get(own, "nobody").await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (status, e) = get("/v1/usage?bucket_width=1h".into(), "bob-usage").await;
    assert_eq!(
        (status, e["error"]["param"].as_str()),
        (400, Some("start_time"))
    );

    // The status page charts each client's days: an admin sees both, a client itself.
    let page = |key: &'static str| {
        let req = c.get(p.url("/")).bearer_auth(key);
        async move { req.send().await.unwrap().text().await.unwrap() }
    };
    within("the page's usage", async {
        while !page("admin-usage").await.contains("<td>bob</td>") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let admin = page("admin-usage").await;
    // Escaped as the page escapes every value: `/` as `&#x2f;`.
    assert!(
        admin.contains("usage ledger sqlite:&#x2f;&#x2f;"),
        "{admin}"
    );
    assert!(
        admin.contains("<span class=\"ok\">writing</span>"),
        "{admin}"
    );
    assert!(admin.contains("<td>ann</td>") && admin.contains("<svg class=\"days\""));
    let bob = page("bob-usage").await;
    assert!(
        bob.contains("<td>bob</td>") && !bob.contains("<td>ann</td>"),
        "{bob}"
    );
}

#[tokio::test]
async fn usage_without_a_ledger_is_a_clear_404() {
    let gpu = sim(SimConfig::default()).await;
    let toml = format!(
        "[backends.gpu]\nurl = \"{}\"\nflavor = \"llamacpp\"\n[aliases.frank]\nbackend = \"gpu\"\n",
        gpu.url()
    );
    let p = proxy(&toml, &[]).await;
    let r = client()
        .get(p.url("/v1/usage?start_time=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let e: serde_json::Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "usage_not_recorded");
}

/// `switchboard_ledger_rows_written_total` of the proxy at `base`.
async fn rows_written(base: &str) -> f64 {
    let text = metrics_at(base).await;
    sample(&text, "switchboard_ledger_rows_written_total")
}

#[tokio::test]
async fn rows_the_ledger_reported_written_survive_a_kill_9() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let mut proxy = Served::start(
        &frank_config(&gpu.url(), &format!("sqlite://{}", db.display()), 10),
        &[],
    )
    .await;
    let c = client();
    let send = |n: usize| {
        let (c, url) = (c.clone(), format!("{}/v1/chat/completions", proxy.base));
        async move {
            for _ in 0..n {
                let r = c
                    .post(&url)
                    .json(&chat("frank", false))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        }
    };
    send(40).await;
    within("40 rows written", async {
        while rows_written(&proxy.base).await < 40.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    send(10).await;
    proxy.child.kill().unwrap();
    proxy.child.wait().unwrap();
    let rows: i64 = raw(&db, "SELECT count(*) FROM requests");
    assert!((40..=50).contains(&rows), "{rows} rows after 50 answers");
    let hourly: i64 = raw(
        &db,
        "SELECT CAST(sum(requests) AS BIGINT) FROM usage_hourly",
    );
    assert_eq!(hourly, rows, "the roll-ups hold what the rows hold");
}

#[tokio::test]
async fn a_stream_its_client_left_is_a_cancelled_row() {
    use futures_util::StreamExt;
    let gpu = sim(SimConfig {
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let toml = format!(
        "[backends.gpu]\nurl = \"{}\"\nflavor = \"llamacpp\"\n[aliases.frank]\nbackend = \"gpu\"\n\
         [ledger]\nurl = \"sqlite://{}\"\nbatch_interval_ms = 10\n",
        gpu.url(),
        db.display()
    );
    let p = proxy(&toml, &[]).await;
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .json(&chat("frank", true))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    within("first event", body.next()).await.unwrap().unwrap();
    drop(body);
    within("cancel", gpu.recorder().wait_cancelled(1)).await;
    let written = p.state.metrics.ledger.written.clone();
    until("the row written", || written.get() >= 1).await;
    let c = rusqlite::Connection::open(&db).unwrap();
    let (cancelled, api, status): (i64, String, i64) = c
        .query_row("SELECT cancelled, api, status FROM requests", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(
        (cancelled, api.as_str(), status),
        (1, "chat_completions", 200)
    );
}

/// The config of a proxy answering alias `frank` from `backend`, writing its rows to
/// `ledger_url` every `interval_ms`.
fn frank_config(backend: &str, ledger_url: &str, interval_ms: u64) -> String {
    format!(
        "[backends.gpu]\nurl = \"{backend}\"\nflavor = \"llamacpp\"\n[aliases.frank]\n\
         backend = \"gpu\"\n[ledger]\nurl = \"{ledger_url}\"\nbatch_interval_ms = {interval_ms}\n"
    )
}

#[tokio::test]
async fn two_binaries_on_one_postgres_record_every_request_once() {
    let Some(pg) = Postgres::start() else { return };
    let gpu = sim(SimConfig::default()).await;
    let (url, backend) = (pg.url(), gpu.url());
    // Started together: they migrate the new database at once.
    let config = frank_config(&backend, &url, 10);
    let (a, b) = tokio::join!(Served::start(&config, &[]), Served::start(&config, &[]));
    let c = client();
    let send = |base: String, n: usize| {
        let c = c.clone();
        async move {
            for _ in 0..n {
                let r = c
                    .post(format!("{base}/v1/chat/completions"))
                    .json(&chat("frank", false))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        }
    };
    tokio::join!(send(a.base.clone(), 30), send(b.base.clone(), 20));
    for (p, n) in [(&a, 30.0), (&b, 20.0)] {
        within("every row written", async {
            while rows_written(&p.base).await < n {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
    drop((a, b));
    let rows = tokio::task::spawn_blocking(move || {
        (
            pg_count(&url, "SELECT count(*) FROM requests"),
            pg_count(&url, "SELECT count(DISTINCT process) FROM requests"),
            pg_count(
                &url,
                "SELECT CAST(sum(requests) AS BIGINT) FROM usage_hourly",
            ),
            pg_count(&url, "SELECT count(*) FROM ledger_schema"),
        )
    })
    .await
    .unwrap();
    assert_eq!(rows, (50, 2, 50, ledger::SCHEMA_VERSION));
}

#[tokio::test]
async fn a_graceful_shutdown_writes_the_rows_that_wait() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    // Rows wait ten minutes, or for 500 of them: none is written while it serves.
    let proxy = Served::start(
        &frank_config(&gpu.url(), &format!("sqlite://{}", db.display()), 600_000),
        &[],
    )
    .await;
    let c = client();
    for _ in 0..5 {
        let r = c
            .post(format!("{}/v1/chat/completions", proxy.base))
            .json(&chat("frank", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(rows_written(&proxy.base).await, 0.0);
    let exit = proxy.stop().await;
    assert!(exit.success(), "{exit:?}");
    assert_eq!(raw::<i64>(&db, "SELECT count(*) FROM requests"), 5);
}

/// The SQLite ledger at `db` with `n` rows of today, as an earlier process left it: a few
/// hundred pages.
fn filled(db: &Path, n: usize) {
    let url = LedgerUrl::Sqlite(db.to_path_buf());
    let rows: Vec<Row> = (0..n)
        .map(|i| Row {
            seq: i as i64,
            ..row(["ann", "bob", "cy"][i % 3], i as i64)
        })
        .collect();
    ledger::with_store(&url, move |s| {
        rows.chunks(1000).try_for_each(|c| s.write("earlier", c))
    })
    .unwrap();
}

/// The middle third of the SQLite file `db` overwritten with bytes no page holds, as a disk
/// or a stray writer might.
fn corrupt(db: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
    let third = f.metadata().unwrap().len() / 4096 / 3 * 4096;
    assert!(third >= 50 * 4096, "a file of {third} bytes a third");
    f.seek(SeekFrom::Start(third)).unwrap();
    f.write_all(&vec![0xa5; third as usize]).unwrap();
    f.sync_all().unwrap();
}

/// `switchboard_ledger_up` of the proxy at `base`.
async fn ledger_up(base: &str) -> f64 {
    sample(&metrics_at(base).await, "switchboard_ledger_up")
}

/// The status page of the proxy at `base`, as the client of `key` sees it (none: an open
/// proxy's).
async fn status_page(base: &str, key: Option<&str>) -> String {
    let mut req = client().get(format!("{base}/"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// A non-streamed chat with alias `frank` at `base` as the client of `key` (none: no client);
/// its status and body.
async fn chat_at(base: &str, key: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat("frank", false));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = within("an answer", req.send()).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn a_sqlite_ledger_corrupted_under_a_running_proxy_is_said_and_the_proxy_keeps_serving() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    filled(&db, 20_000);
    let config = frank_config(&gpu.url(), &format!("sqlite://{}", db.display()), 10)
        + "check_interval_ms = 50\n";
    let proxy = Served::start(&config, &[]).await;
    for _ in 0..20 {
        assert_eq!(chat_at(&proxy.base, None).await.0, 200);
    }
    within("20 rows written", async {
        while rows_written(&proxy.base).await < 20.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(ledger_up(&proxy.base).await, 1.0);
    corrupt(&db);
    // The next check reads the file through: the metric, the page and the log say so.
    within("switchboard_ledger_up 0", async {
        while ledger_up(&proxy.base).await != 0.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let page = status_page(&proxy.base, None).await;
    assert!(page.contains("usage.db is corrupt"), "{page}");
    let log = proxy.log();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("usage ledger") && l.contains("corrupt")),
        "{log}"
    );
    // Served all the while; the rows are no longer written into the damaged file.
    let written = rows_written(&proxy.base).await;
    for _ in 0..20 {
        assert_eq!(chat_at(&proxy.base, None).await.0, 200);
    }
    let text = metrics_at(&proxy.base).await;
    assert_eq!(
        sample(&text, "switchboard_ledger_rows_written_total"),
        written
    );
    assert_eq!(sample(&text, "switchboard_ledger_rows_waiting"), 20.0);
}

/// A proxy answering alias `frank` from `backend` with its ledger at the SQLite file `db`, and
/// clients `capped` (a budget of a day) and `free` (none) of keys `capped-key`, `free-key`.
fn budgeted_config(backend: &str, db: &Path) -> String {
    frank_config(backend, &format!("sqlite://{}", db.display()), 10)
        + "[clients.capped]\nkey_env = \"SB_T_LEDGER_CAPPED\"\ntokens_per_day = 100000\n\
           [clients.free]\nkey_env = \"SB_T_LEDGER_FREE\"\n"
}

const BUDGET_KEYS: [(&str, &str); 2] = [
    ("SB_T_LEDGER_CAPPED", "capped-key"),
    ("SB_T_LEDGER_FREE", "free-key"),
];

#[tokio::test]
async fn a_sqlite_ledger_corrupt_at_start_is_said_and_the_proxy_serves_without_it() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    filled(&db, 20_000);
    corrupt(&db);
    let proxy = Served::start(&budgeted_config(&gpu.url(), &db), &BUDGET_KEYS).await;
    assert_eq!(ledger_up(&proxy.base).await, 0.0);
    let page = status_page(&proxy.base, Some("free-key")).await;
    assert!(page.contains("usage.db is corrupt"), "{page}");
    let log = proxy.log();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("usage ledger") && l.contains("corrupt")),
        "{log}"
    );
    assert_eq!(chat_at(&proxy.base, Some("free-key")).await.0, 200);
    // What the client with a budget of a day spent today is not known: refused, not guessed.
    let (status, body) = chat_at(&proxy.base, Some("capped-key")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "ledger_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("capped") && !message.contains("usage.db"),
        "{message}"
    );
    // Its own usage cannot be read either; the answer names no file of the server's.
    let r = client()
        .get(format!("{}/v1/usage?start_time=0", proxy.base))
        .bearer_auth("free-key")
        .send()
        .await
        .unwrap();
    let (status, text) = (r.status(), r.text().await.unwrap());
    assert!(status == 503 || status == 200, "{status} {text}");
    assert!(!text.contains("usage.db"), "{text}");
}

#[tokio::test]
async fn a_required_ledger_corrupt_at_start_stops_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    filled(&db, 20_000);
    corrupt(&db);
    let path = dir.path().join("routes.toml");
    let config = frank_config(
        "http://127.0.0.1:9",
        &format!("sqlite://{}", db.display()),
        10,
    ) + "required = true\n";
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["serve", "--config"])
        .arg(&path)
        .env(
            "SWITCHBOARD_SERVER__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let end = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > end {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the proxy serves on a corrupt ledger that is required");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains("ledger.url") && err.contains("usage.db is corrupt"),
        "{err}"
    );
}

#[tokio::test]
async fn a_reload_to_a_ledger_that_cannot_be_used_fails_and_keeps_the_one_in_force() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (db, damaged) = (dir.path().join("usage.db"), dir.path().join("damaged.db"));
    filled(&damaged, 20_000);
    corrupt(&damaged);
    let path = dir.path().join("routes.toml");
    let config = |db: &Path| frank_config(&gpu.url(), &format!("sqlite://{}", db.display()), 10);
    std::fs::write(&path, config(&db)).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(switchboard_proxy::live::AppState::new(cfg, Some(path.clone())).unwrap()).await;
    std::fs::write(&path, config(&damaged)).unwrap();
    let err = switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("damaged.db is corrupt"), "{err}");
    let ledger = p.state.live.load_full().ledger.clone().unwrap();
    assert_eq!(ledger.settings().url, LedgerUrl::Sqlite(db.clone()));
    assert_eq!(p.state.metrics.ledger.up.get(), 1);
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .json(&chat("frank", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let written = p.state.metrics.ledger.written.clone();
    until("the row written to the ledger in force", || {
        written.get() >= 1
    })
    .await;
    assert_eq!(raw::<i64>(&db, "SELECT count(*) FROM requests"), 1);
}
