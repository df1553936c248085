//! Budgets of a day and a month from outside: kept in the usage ledger, so a restart of the
//! binary gives no client a fresh day, and two processes on one PostgreSQL count one budget
//! (started here on loopback, see `common::postgres`); a budget of output tokens told by its
//! kind in each API's 429, its headers and the status page.

use crate::common;

use std::time::Duration;

use common::postgres::Postgres;
use common::served::{metrics_at, Served};
use common::*;
use serde_json::Value;
use switchboard_sim::SimConfig;

const ANN: (&str, &str) = ("SB_T_BUDGET_ANN", "budget-ann-key");
const BOB: (&str, &str) = ("SB_T_BUDGET_BOB", "budget-bob-key");
const CAL: (&str, &str) = ("SB_T_BUDGET_CAL", "budget-cal-key");

/// One llama.cpp backend behind alias `frank`, days of Berlin, `clients` (TOML), and the
/// ledger at `ledger`, what other processes spent read every `refresh_ms`.
fn fleet(backend: &str, ledger: &str, refresh_ms: u64, clients: &str) -> String {
    format!(
        r#"
[server]
budget_timezone = "Europe/Berlin"
[backends.gpu]
url = "{backend}"
flavor = "llamacpp"
slots = 4
[aliases.frank]
backend = "gpu"
{clients}
[ledger]
url = "{ledger}"
batch_interval_ms = 10
budget_refresh_ms = {refresh_ms}
"#
    )
}

/// Ann and Bob with a budget of 400 tokens a day, Ann with one of a month too.
fn config(backend: &str, ledger: &str, refresh_ms: u64) -> String {
    let clients = format!(
        r#"[clients.ann]
key_env = "{}"
tokens_per_day = 400
tokens_per_month = 100000
[clients.bob]
key_env = "{}"
tokens_per_day = 400"#,
        ANN.0, BOB.0
    );
    fleet(backend, ledger, refresh_ms, &clients)
}

/// A chat of Ann's or Bob's: its status and error code.
async fn ask(base: &str, key: &str) -> (u16, Option<String>) {
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat("frank", false))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    (status, v["error"]["code"].as_str().map(String::from))
}

/// Ann's chats until her day's budget refuses one; returns once each is settled (counted in
/// the client's requests, which a request's end does after its charge).
async fn spend_the_day(base: &str) {
    for n in 0..400 {
        match ask(base, ANN.1).await {
            (200, _) => {}
            (429, Some(code)) => {
                assert_eq!(code, "insufficient_quota");
                assert!(n > 0);
                return until_counted(base, "ann", n as f64, 1.0).await;
            }
            other => panic!("{other:?}"),
        }
    }
    panic!("400 chats and the budget of 400 tokens a day never refused one");
}

/// Polls until `ok` answers to `who` and `refused` refusals are counted.
async fn until_counted(base: &str, who: &str, ok: f64, refused: f64) {
    let series = |status: &str| {
        format!("switchboard_client_requests_total{{client=\"{who}\",status=\"{status}\"}}")
    };
    within("every request counted", async {
        loop {
            let m = metrics_at(base).await;
            if sample(&m, &series("200")) == ok && sample(&m, &series("429")) == refused {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The status page as the client of `key` sees it.
async fn page(base: &str, key: &str) -> String {
    client()
        .get(format!("{base}/"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// What `page` says is left of the budget it labels `label` (`tokens / day`), its `/`
/// escaped as the page escapes every value.
fn left_on(page: &str, label: &str) -> u64 {
    let label = format!("{}: ", label.replace('/', "&#x2f;"));
    let at = page
        .find(&label)
        .unwrap_or_else(|| panic!("{label} on the page"))
        + label.len();
    page[at..].split(' ').next().unwrap().parse().unwrap()
}

/// What the status page says is left of the day of the client of `key`: `left / 400`.
async fn left_of_the_day(base: &str, key: &str) -> u64 {
    left_on(&page(base, key).await, "tokens / day")
}

/// Polls until the page of `base` says `left` is left of the day of the client of `key`.
async fn until_left(what: &str, base: &str, key: &str, left: u64) {
    within(what, async {
        while left_of_the_day(base, key).await != left {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_day_budget_survives_a_restart_of_the_binary() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("usage.db").display());
    // Read at start only: the next read is an hour away.
    let toml = config(&gpu.url(), &db, 3_600_000);
    let env = [ANN, BOB];
    let first = Served::start(&toml, &env).await;
    spend_the_day(&first.base).await;
    let left = left_of_the_day(&first.base, ANN.1).await;
    assert!(left < 400);
    assert!(first.stop().await.success());

    let again = Served::start(&toml, &env).await;
    // Read from the ledger at start: the day is as spent as it was.
    assert_eq!(left_of_the_day(&again.base, ANN.1).await, left);
    let (status, code) = ask(&again.base, ANN.1).await;
    assert_eq!((status, code.as_deref()), (429, Some("insufficient_quota")));
    // Bob's day is his own.
    assert_eq!(ask(&again.base, BOB.1).await.0, 200);
    let spent = 400 - left;
    let share = spent as f64 * 100.0 / 100_000.0;
    let used = format!("month's budget used: tokens {share:.1} % ({spent} of 100000)");
    let page = page(&again.base, ANN.1).await;
    assert!(page.contains(&used), "{page}");
}

#[tokio::test]
async fn two_processes_on_one_postgres_count_one_budget() {
    let Some(pg) = Postgres::start() else { return };
    let gpu = sim(SimConfig::default()).await;
    let toml = config(&gpu.url(), &pg.url(), 20);
    let env = [ANN, BOB];
    let (a, b) = tokio::join!(Served::start(&toml, &env), Served::start(&toml, &env));
    spend_the_day(&a.base).await;
    let left = left_of_the_day(&a.base, ANN.1).await;
    // B learns what A spent from the ledger (A writes every 10 ms, B reads every 20 ms).
    until_left("B to see what A spent", &b.base, ANN.1, left).await;
    let (status, code) = ask(&b.base, ANN.1).await;
    assert_eq!((status, code.as_deref()), (429, Some("insufficient_quota")));
    // What B spends, A learns in turn.
    assert_eq!(ask(&b.base, BOB.1).await.0, 200);
    until_counted(&b.base, "bob", 1.0, 0.0).await;
    let bob = left_of_the_day(&b.base, BOB.1).await;
    assert!(bob < 400);
    until_left("A to see what B spent", &a.base, BOB.1, bob).await;
}

/// Cal with a budget of 100 output tokens a day and none of tokens; the ledger read at start
/// only.
fn output_config(backend: &str, ledger: &str) -> String {
    let clients = format!(
        r#"[clients.cal]
key_env = "{}"
output_tokens_per_day = 100"#,
        CAL.0
    );
    fleet(backend, ledger, 3_600_000, &clients)
}

/// Cal's request of `max_tokens` output (the simulator makes all of them) to `path`, a chat
/// or Anthropic's messages: its status, headers and body.
async fn ask_for(
    base: &str,
    path: &str,
    max_tokens: u32,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut body = chat("frank", false);
    body["max_tokens"] = max_tokens.into();
    let r = client()
        .post(format!("{base}{path}"))
        .bearer_auth(CAL.1)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.json().await.unwrap())
}

/// What the status page says is left of Cal's day of output tokens.
async fn output_left(base: &str) -> u64 {
    left_on(&page(base, CAL.1).await, "output tokens / day")
}

#[tokio::test]
async fn an_output_token_budget_is_told_by_its_kind_and_survives_a_restart() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("usage.db").display());
    let toml = output_config(&gpu.url(), &db);
    let first = Served::start(&toml, &[CAL]).await;
    let chat = "/v1/chat/completions";
    // 60 output tokens of 100: the prompt is not counted.
    let (status, h, _) = ask_for(&first.base, chat, 60).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-ratelimit-limit-output-tokens"], "100");
    until_counted(&first.base, "cal", 1.0, 0.0).await;
    assert_eq!(output_left(&first.base).await, 40);
    // 50 more do not fit: OpenAI's envelope, the budget named by its kind, its headers.
    let (status, h, v) = ask_for(&first.base, chat, 50).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (429, Some("insufficient_quota"))
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "budget of 100 output tokens per day spent; it resets at the start of the next day"
        ),
        "{message}"
    );
    assert!(h.contains_key("retry-after"));
    assert_eq!(h["x-ratelimit-remaining-output-tokens"], "40");
    assert!(h.contains_key("x-ratelimit-reset-output-tokens"));
    assert!(
        !h.contains_key("x-ratelimit-limit-tokens"),
        "no budget of tokens: {h:?}"
    );
    // Anthropic's envelope and header names on /v1/messages.
    let (status, h, v) = ask_for(&first.base, "/v1/messages", 50).await;
    assert_eq!(
        (status, v["type"].as_str(), v["error"]["type"].as_str()),
        (429, Some("error"), Some("rate_limit_error"))
    );
    assert_eq!(h["anthropic-ratelimit-output-tokens-limit"], "100");
    assert_eq!(h["anthropic-ratelimit-output-tokens-remaining"], "40");
    // More than the whole budget can never fit, and gets no Retry-After.
    let (status, h, v) = ask_for(&first.base, chat, 101).await;
    assert_eq!(status, 429);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("needs 101 output tokens, more than the budget of 100 output tokens per day: it can never fit"),
        "{message}"
    );
    assert!(!h.contains_key("retry-after"));
    assert!(first.stop().await.success());

    // Read from the ledger at start: the day's output is as spent as it was.
    let again = Served::start(&toml, &[CAL]).await;
    assert_eq!(output_left(&again.base).await, 40);
    let (status, h, _) = ask_for(&again.base, chat, 50).await;
    assert_eq!(
        (status, &h["x-ratelimit-remaining-output-tokens"]),
        (429, &"40".parse().unwrap())
    );
    assert_eq!(ask_for(&again.base, chat, 40).await.0, 200);
}
