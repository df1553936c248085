//! The status page at `GET /`: what it lists, its client auth, the five-minute window and the
//! last reload, over HTTP; and in headless Chromium against the demo's fleet and against three
//! clients sharing a two-slot simulated GPU (ignored unless run with `--ignored`: it needs the
//! Debian packages `chromium` and `chromium-driver`).

use crate::common;
use crate::webdriver;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use switchboard_proxy::live::AppState;
use switchboard_sim::SimConfig;
use webdriver::{Browser, Session};

async fn page(p: &Proxy, auth: Option<(&str, &str)>) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = client().get(p.url("/"));
    if let Some((scheme, value)) = auth {
        req = req.header("authorization", format!("{scheme} {value}"));
    }
    let resp = within("the status page", req.send()).await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.text().await.unwrap())
}

/// The `<tr>` of one alias.
fn row<'a>(html: &'a str, alias: &str) -> &'a str {
    let start = html
        .find(&format!("<tr data-alias=\"{alias}\">"))
        .unwrap_or_else(|| panic!("no row for {alias} in {html}"));
    let end = start + html[start..].find("</tr>").unwrap();
    &html[start..end]
}

#[tokio::test]
async fn status_page_lists_every_alias_with_values_escaped() {
    let sim = sim(SimConfig {
        model: "up-model".into(),
        ..SimConfig::default()
    })
    .await;
    let toml = one_alias(
        "llamacpp",
        "",
        "description = \"<script>alert('x')</script> big & slow\"",
    ) + "[aliases.second]\nbackend = \"b\"\n";
    let p = proxy(&toml, &[("b", sim.url())]).await;
    switchboard_proxy::live::probes::probe_all(&p.state).await;
    let (status, headers, html) = page(&p, None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'nonce-"), "{csp}");
    // Escaped as minijinja escapes: `'` as `&#x27;`, `/` as `&#x2f;`.
    assert!(
        html.contains("&lt;script&gt;alert(&#x27;x&#x27;)&lt;&#x2f;script&gt; big &amp; slow"),
        "{html}"
    );
    assert_eq!(
        html.matches("<script").count(),
        1,
        "only the page's own script"
    );
    for alias in ["a", "second"] {
        let r = row(&html, alias);
        assert!(r.contains("<span class=\"state up\">up</span>"), "{r}");
        assert!(
            r.contains(&format!(
                "<div class=\"url\">{}</div>",
                sim.url().replace('/', "&#x2f;")
            )),
            "{r}"
        );
    }
    assert!(row(&html, "a").contains("also answers to old-a"));
}

#[tokio::test]
async fn status_page_takes_the_keys_models_takes_and_basic_auth() {
    std::env::set_var("R21_STATUS_KEYS", "sk-one,sk-two");
    let toml = one_alias("llamacpp", "api_keys_env = \"R21_STATUS_KEYS\"", "");
    let p = proxy(&toml, &[("b", dead_url().await)]).await;
    let (status, headers, body) = page(&p, None).await;
    assert_eq!(status, 401);
    assert!(headers["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Basic realm=\"switchboard\""));
    assert!(body.contains("invalid_api_key"), "{body}");
    // "anyone:sk-two" and "anyone:wrong"
    for (auth, expected) in [
        (("Bearer", "sk-one"), 200),
        (("Basic", "YW55b25lOnNrLXR3bw=="), 200),
        (("Basic", "YW55b25lOndyb25n"), 401),
        (("Bearer", "wrong"), 401),
    ] {
        assert_eq!(page(&p, Some(auth)).await.0, expected, "{auth:?}");
    }
    // /v1/models answers the same way.
    let models = client().get(p.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 401);
}

#[tokio::test]
async fn window_counts_requests_errors_and_context_rejections() {
    let up = sim(SimConfig {
        model: "up-model".into(),
        ..SimConfig::default()
    })
    .await;
    let toml = one_alias("llamacpp", "", "")
        + "[backends.gone]\nurl = \"{gone}\"\n\
        flavor = \"llamacpp\"\n[aliases.lost]\nbackend = \"gone\"\n";
    let p = proxy(&toml, &[("b", up.url()), ("gone", dead_url().await)]).await;
    let c = client();
    let url = p.url("/v1/chat/completions");
    assert_eq!(status(&c, &url, &chat("a", false)).await, 200);
    let texts = sse_payloads(p.post_chat(&c, &chat("a", true)).await).await;
    assert!(texts.last().is_some_and(|t| t == "[DONE]"));
    let mut over = chat("a", false);
    over["max_tokens"] = serde_json::json!(100_000);
    assert_eq!(status(&c, &url, &over).await, 400);
    assert_eq!(status(&c, &url, &chat("lost", false)).await, 502);

    let snap = p.state.live.load_full();
    let a = snap
        .alias("a")
        .unwrap()
        .metrics
        .window
        .summary(Instant::now());
    assert_eq!((a.requests, a.errors, a.rejections), (3, 0, 1), "{a:?}");
    assert!(a.ttft_p50.is_some(), "the stream timed its first token");
    let lost = snap
        .alias("lost")
        .unwrap()
        .metrics
        .window
        .summary(Instant::now());
    assert_eq!((lost.requests, lost.errors), (1, 1), "{lost:?}");

    let (_, _, html) = page(&p, None).await;
    let cells = |r: &str| -> Vec<String> {
        r.split("<td class=\"n")
            .skip(1)
            .map(|c| c[c.find('>').unwrap() + 1..c.find("</td>").unwrap()].to_string())
            .collect()
    };
    // in flight, queued, requests, errors, TTFT, decode, rejections, window
    let a = cells(row(&html, "a"));
    assert_eq!(&a[..4], ["0", "0", "3", "0"], "{a:?}");
    assert_eq!((a[6].as_str(), a[7].as_str()), ("1", "4096"), "{a:?}");
    let lost = cells(row(&html, "lost"));
    assert_eq!(&lost[2..4], ["1", "1"], "{lost:?}");
    assert!(row(&html, "lost").contains("<td class=\"n bad\">1</td>"));
}

#[tokio::test]
async fn status_page_shows_the_last_reload() {
    let sim = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    let good = fill(&one_alias("llamacpp", "", ""), &[("b", sim.url())]);
    std::fs::write(&path, &good).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    assert!(page(&p, None).await.2.contains("config as loaded at start"));

    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap();
    assert!(page(&p, None)
        .await
        .2
        .contains("last reload: <span class=\"ok\">applied</span>"));

    std::fs::write(&path, "[aliases.x]\nbackend = \"nope\"\n").unwrap();
    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap_err();
    let html = page(&p, None).await.2;
    assert!(
        html.contains("<span class=\"bad\">refused</span>"),
        "{html}"
    );
    assert!(html.contains("1 error in the log"), "{html}");
    // The config before it is still the one shown.
    row(&html, "a");
}

/// Where the screenshots go: the target directory (`CARGO_TARGET_DIR` if set).
fn artifact(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&target).unwrap();
    target.join(name)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The demo's fleet (the repository's routes.toml, one simulator per backend) behind the proxy,
/// probed once, with some traffic on every alias so the window has figures.
async fn demo_fleet() -> (Proxy, Vec<(String, switchboard_sim::Sim)>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("routes.toml");
    let (cfg, sims) = switchboard::demo::simulated(&path).await.unwrap();
    let p = start(AppState::new(cfg, None).unwrap()).await;
    switchboard_proxy::live::probes::probe_all(&p.state).await;
    let c = client();
    let aliases: Vec<String> = p.state.live.load().config.aliases.keys().cloned().collect();
    for alias in &aliases {
        for stream in [true, true, false] {
            let resp = p.post_chat(&c, &chat(alias, stream)).await;
            assert_eq!(resp.status(), 200, "{alias}");
            within("the answer", resp.bytes()).await.unwrap();
        }
    }
    (p, sims)
}

/// Every alias has its row, and each backend of the fleet the state `expected` gives it.
async fn assert_rows(s: &Session, p: &Proxy, expected: impl Fn(&str) -> &'static str) {
    let snap = p.state.live.load_full();
    for a in snap.routes.aliases().iter().map(|a| &a.spec) {
        let cell = format!(
            "tr[data-alias=\"{}\"] [data-backend=\"{}\"] .state",
            a.name, a.backend.name
        );
        let text = s.text(&cell).await;
        assert_eq!(text, expected(&a.backend.name), "{cell}");
        assert!(s
            .text(&format!("tr[data-alias=\"{}\"] .alias", a.name))
            .await
            .contains(&a.name));
        // Its window's four charts, each on a labelled scale with its latest value beside.
        let charts = s.text(&format!("tr[data-charts=\"{}\"]", a.name)).await;
        for label in ["-5 min", "now", " req", "p50 ", "p95 ", " tok/s", " errors"] {
            assert!(
                charts.contains(label),
                "{}: {label:?} in {charts:?}",
                a.name
            );
        }
    }
}

#[tokio::test]
#[ignore = "needs chromium and chromedriver (Debian packages chromium, chromium-driver); .ci/run installs them and runs it with --ignored"]
async fn browser_status_page_shows_a_killed_backend_down_within_one_refresh() {
    let (p, mut sims) = demo_fleet().await;
    // Each backend's timeline: a row per slot, a bar for each request it answered.
    let (_, _, html) = page(&p, None).await;
    let snap = p.state.live.load_full();
    for b in snap.config.backends.values() {
        let at = html
            .find(&format!("data-timeline=\"{}\"", b.name))
            .unwrap_or_else(|| panic!("no timeline of {}", b.name));
        let timeline = &html[at..at + html[at..].find("</svg>").unwrap()];
        let rows = b.slots.get().min(16);
        assert_eq!(
            timeline.matches("font-size=\"9\">slot ").count() as u32,
            rows,
            "{timeline}"
        );
        assert!(
            timeline.contains("fill-opacity=\"0.45\""),
            "no bar: {timeline}"
        );
    }
    let browser = Browser::start().await;
    let s = browser.session(true).await;
    s.open(&p.url("/")).await;
    assert_rows(&s, &p, |_| "up").await;
    let first = snap.config.backends.keys().next().unwrap();
    let text = s.text(&format!("[data-timeline=\"{first}\"]")).await;
    for label in ["slot 0", "-10 min", "now", "lighter: prefill"] {
        assert!(text.contains(label), "{label:?} in {text:?}");
    }
    // The page as the demo first shows it, whole (the readme's picture), and one backend's
    // slots.
    s.resize(1400, 1200).await;
    s.screenshot(&artifact("status-page-up.png")).await;
    s.resize(1400, 900).await;
    let timeline = artifact("status-timeline.png");
    s.element_screenshot(&format!("[data-timeline=\"{first}\"]"), &timeline)
        .await;
    eprintln!("screenshot: {}", timeline.display());
    assert_eq!(s.attribute("html", "class").await, "js", "the script runs");
    assert!(s.text("footer").await.contains("Refreshes every"));

    // Kill one backend's simulator and probe now, as the health loop would on its interval.
    let (victim, sim) = sims.pop().unwrap();
    sim.shutdown().await;
    switchboard_proxy::live::probes::probe_all(&p.state).await;
    assert_eq!(
        switchboard_proxy::fleet::health::state_name(p.state.health.get(&victim)),
        "down"
    );
    let probed = unix_ms();
    // One failed request, so the errors column has something to show: on an alias of the
    // killed backend with no fallback to serve it instead (fail fast: 503, or 502).
    let alias = p
        .state
        .live
        .load()
        .config
        .aliases
        .values()
        .find(|a| a.backend.name == victim && a.fallbacks.is_empty())
        .unwrap()
        .name
        .clone();
    let failed = status(
        &client(),
        &p.url("/v1/chat/completions"),
        &chat(&alias, false),
    )
    .await;
    assert!(failed == 502 || failed == 503, "{failed}");

    // The page is not reloaded: its script swaps in a fresh #status. The first one rendered
    // after the probe must show the backend down.
    let before = s.refreshes().await;
    let every = Duration::from_secs(switchboard_proxy::http::status::REFRESH_SECS);
    let bound = 2 * every + WAIT;
    let deadline = Instant::now() + bound;
    loop {
        let generated: u64 = s
            .attribute("#status", "data-generated")
            .await
            .parse()
            .unwrap();
        if generated >= probed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no refresh rendered after the probe within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One refresh, or two when one was already on its way as the probe ended.
    let took = s.refreshes().await - before;
    assert!((1..=2).contains(&took), "{took} refreshes");
    assert_rows(&s, &p, |b| if b == victim { "down" } else { "up" }).await;
    let png = artifact("status-page.png");
    s.screenshot(&png).await;
    eprintln!("screenshot: {}", png.display());
    s.close().await;

    // JavaScript off: the same content, server-rendered, and the page says it reloads itself.
    let s = browser.session(false).await;
    s.open(&p.url("/")).await;
    assert_rows(&s, &p, |b| if b == victim { "down" } else { "up" }).await;
    // The script did not run: it would have marked <html> and shown the refresh note.
    // (WebDriver reads no <noscript> text, which the screenshot shows.)
    let class = s.attribute("html", "class").await;
    assert!(!class.contains("js"), "the script ran: class {class:?}");
    assert!(!s.text("footer").await.contains("Refreshes every"));
    let png = artifact("status-page-nojs.png");
    s.screenshot(&png).await;
    s.close().await;
}

/// `n` words of a text that starts with `topic` (some `n` tokens to the simulator).
fn words(topic: &str, n: usize) -> String {
    (0..n).map(|i| format!("{topic}{i} ")).collect()
}

/// The client a bar's title names (`slot N: NAME · …`).
fn whose(title: &str) -> &str {
    let named = title.split_once(": ").unwrap().1;
    named.split(" · ").next().unwrap()
}

/// The legend's colour of each client in `timeline` (a backend's part of the page).
fn legend(timeline: &str) -> Vec<(String, String)> {
    let at = timeline.find("class=\"legend\"").expect("a legend");
    timeline[at..]
        .split("<span><svg")
        .skip(1)
        .map(|item| {
            let fill = item.split("fill=\"").nth(1).unwrap();
            let name = item.split("</svg> ").nth(1).unwrap();
            (
                name[..name.find("</span>").unwrap()].to_string(),
                fill[..fill.find('"').unwrap()].to_string(),
            )
        })
        .collect()
}

/// The answered bars of `timeline`: their title and their fill.
fn answered_bars(timeline: &str) -> Vec<(String, String)> {
    timeline
        .split("<g><title>")
        .skip(1)
        .map(|g| {
            let title = &g[..g.find("</title>").unwrap()];
            let fill = g.split("fill=\"").nth(1).unwrap();
            (
                title.to_string(),
                fill[..fill.find('"').unwrap()].to_string(),
            )
        })
        .collect()
}

/// Three clients on a two-slot simulated GPU: each asks a short question; then two batch
/// clients' long prompts fill both slots and a third waits, shown with its predicted wait;
/// then a person's interactive request preempts one of them, which is answered after. The
/// page, in Chromium, shows the backend's two slot rows, a bar per answered request in its
/// client's legend colour, the preemption marked, and each alias chart labelled with its value.
#[tokio::test]
#[ignore = "needs chromium and chromedriver (Debian packages chromium, chromium-driver); .ci/run installs them and runs it with --ignored"]
async fn browser_status_page_shows_three_clients_on_two_slots_a_queue_and_a_preemption() {
    for (var, key) in [
        ("SB_T_CONSOLE_ADMIN", "console-admin"),
        ("SB_T_CONSOLE_ANN", "ann-key"),
        ("SB_T_CONSOLE_BOB", "bob-key"),
        ("SB_T_CONSOLE_CAT", "cat-key"),
    ] {
        std::env::set_var(var, key);
    }
    // Prefill 1,000 tokens a second: a long prompt (3,000 words, some 9,000 tokens) holds its
    // slot some 9 s before its first byte, a short one a fraction of a second.
    let gpu = switchboard_sim::GpuSim {
        prefill_tps: 1_000.0,
        decode_tps: 40.0,
        ..switchboard_sim::GpuSim::default()
    };
    let sim = gpu_sim(switchboard_wire::flavor::Flavor::Llamacpp, 2, gpu).await;
    let cfg = common::toml::Fleet::new()
        .server("preempt_after_ms = 50\nadmin_keys_env = \"SB_T_CONSOLE_ADMIN\"")
        .backend("b", "llamacpp")
        .slots(2)
        .alias("a", "b")
        .text(
            "[clients.ann]\nkey_env = \"SB_T_CONSOLE_ANN\"\npriority = \"interactive\"\n\
             [clients.bob]\nkey_env = \"SB_T_CONSOLE_BOB\"\npriority = \"batch\"\n\
             [clients.cat]\nkey_env = \"SB_T_CONSOLE_CAT\"\npriority = \"batch\"",
        )
        .render();
    let p = proxy(&cfg, &[("b", sim.url())]).await;
    switchboard_proxy::live::probes::probe_all(&p.state).await;
    let browser = Browser::start().await;
    let ask = |key: &'static str, text: String| {
        let url = p.url("/v1/chat/completions");
        tokio::spawn(async move {
            let body = serde_json::json!({"model": "a", "max_tokens": 4,
                "messages": [{"role": "user", "content": text}]});
            let r = client().post(url).bearer_auth(key).json(&body).send();
            let r = tokio::time::timeout(Duration::from_secs(120), r).await;
            r.expect("answered in time").unwrap().status().as_u16()
        })
    };
    for (key, who) in [("ann-key", "ann"), ("bob-key", "bob"), ("cat-key", "cat")] {
        assert_eq!(
            ask(key, words(&format!("hello {who}"), 20)).await.unwrap(),
            200
        );
    }
    let slots = || std::sync::Arc::clone(&p.state.live.load().replica("b").unwrap().slots);
    let long = [
        ask("bob-key", words("bob compaction one", 3_000)),
        ask("cat-key", words("cat compaction", 3_000)),
    ];
    until("both slots busy", || slots().busy() == 2).await;
    let third = ask("bob-key", words("bob compaction two", 200));
    until("bob's third request queued", || slots().waiting() == 1).await;

    // The page, as an admin sees it: who holds each slot and who waits, bob.
    let admin = format!("http://admin:console-admin@{}/", p.addr);
    let s = browser.session(true).await;
    s.open(&admin).await;
    let holding = s.text("[data-timeline=\"b\"] .holding").await;
    for who in ["bob · batch · ", "cat · batch · "] {
        assert!(holding.contains(who), "{who:?} in {holding:?}");
    }
    assert!(holding.contains(" s so far · "), "{holding:?}");
    // Each holder a bar open to now in its client's colour, named in its title.
    for slot in 0..2 {
        let bar = format!("[data-timeline=\"b\"] g[data-holding=\"{slot}\"]");
        let title = s.property(&format!("{bar} title"), "textContent").await;
        let who = whose(&title);
        assert!(who == "bob" || who == "cat", "{title:?}");
        assert!(title.contains(" · batch · holding it "), "{title:?}");
        let stroke = s.attribute(&format!("{bar} rect"), "stroke").await;
        let html = s.property("[data-timeline=\"b\"]", "outerHTML").await;
        let colours = legend(&html);
        let named = colours.iter().find(|(n, _)| n == who);
        assert_eq!(named.map(|(_, c)| c), Some(&stroke), "{colours:?}");
    }
    let queue = s.text("[data-timeline=\"b\"] .waiting li").await;
    assert!(
        queue.starts_with("bob · batch · waited ") && queue.contains(" s · predicted "),
        "{queue:?}"
    );
    let predicted: f64 = queue
        .split("predicted ")
        .nth(1)
        .unwrap()
        .trim_end_matches(" s")
        .parse()
        .unwrap();
    assert!(predicted > 0.0, "{queue:?}");
    s.screenshot(&artifact("status-console-queue.png")).await;

    // The person's question preempts one of the long prompts, which is answered after.
    let person = ask("ann-key", words("a short question", 10));
    assert_eq!(person.await.unwrap(), 200);
    for task in long.into_iter().chain([third]) {
        assert_eq!(task.await.unwrap(), 200);
    }
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_preemptions_total{alias=\"a\",class=\"batch\"}"
        ),
        1.0
    );

    // The page's own HTML: a row per slot, every answered request in a bar of its client's
    // legend colour (merged bars count their requests), the preempted attempt dashed.
    let (status, _, html) = page(&p, Some(("Bearer", "console-admin"))).await;
    assert_eq!(status, 200);
    let at = html.find("data-timeline=\"b\"").unwrap();
    let timeline = &html[at..at + html[at..].find("</div></div>\n").unwrap()];
    assert_eq!(
        timeline.matches("font-size=\"9\">slot ").count(),
        2,
        "{timeline}"
    );
    let colours = legend(timeline);
    let names: Vec<&str> = colours.iter().map(|(n, _)| n.as_str()).collect();
    for who in ["ann", "bob", "cat"] {
        assert!(names.contains(&who), "{who} in the legend {colours:?}");
    }
    let mut answered = std::collections::BTreeMap::new();
    for (title, fill) in answered_bars(timeline) {
        let who = whose(&title);
        let (_, colour) = colours.iter().find(|(n, _)| n == who).unwrap();
        assert_eq!(&fill, colour, "{title}");
        assert!(
            title.contains(" · a · ") && title.contains("status 200"),
            "{title}"
        );
        let n = title
            .rsplit_once(" · ")
            .and_then(|(_, r)| r.strip_suffix(" requests"))
            .map_or(1, |n| n.parse().unwrap());
        *answered.entry(who.to_string()).or_insert(0) += n;
    }
    let expected: std::collections::BTreeMap<String, u32> =
        [("ann".into(), 2), ("bob".into(), 3), ("cat".into(), 2)].into();
    assert_eq!(answered, expected);
    assert_eq!(
        timeline.matches("data-lost=\"preempted\"").count(),
        1,
        "{timeline}"
    );
    // Each client's GPU-seconds of the five minutes, charted in its colour, the sum beside.
    for (who, colour) in &colours {
        let at = html.find(&format!("<tr><td>{who}</td>")).unwrap();
        let row = &html[at..at + html[at..].find("</tr>").unwrap()];
        assert!(row.contains("GPU-seconds per 10 s, last 5 min"), "{row}");
        assert!(row.contains(&format!("fill=\"{colour}\"")), "{row}");
        assert!(row.contains(" GPU-s</span>"), "{row}");
    }

    // In Chromium: the same, the preemption's mark in its client's colour and named.
    s.open(&admin).await;
    let lost = "[data-timeline=\"b\"] g[data-lost=\"preempted\"]";
    let title = s.property(&format!("{lost} title"), "textContent").await;
    let who = whose(&title);
    assert!(who == "bob" || who == "cat", "{title:?}");
    assert!(title.contains("preempted after"), "{title:?}");
    let stroke = s.attribute(&format!("{lost} rect"), "stroke").await;
    assert_eq!(colours.iter().find(|(n, _)| n == who).unwrap().1, stroke);
    let legend_text = s.text("[data-timeline=\"b\"] .legend").await;
    for label in ["ann", "bob", "cat", "dashed ▼: preempted"] {
        assert!(legend_text.contains(label), "{label:?} in {legend_text:?}");
    }
    for list in [".holding", ".waiting"] {
        let text = s.text(&format!("[data-timeline=\"b\"] {list}")).await;
        assert!(text.contains("none"), "{list}: {text:?}");
    }
    // Each of the alias's charts: its axis labels and its value beside it.
    let charts = s.text("tr[data-charts=\"a\"]").await;
    for label in [
        "-5 min", "now", " req", "p50 ", "p95 ", " tok/s", "0 errors",
    ] {
        assert!(charts.contains(label), "{label:?} in {charts:?}");
    }
    let png = artifact("status-console.png");
    s.screenshot(&png).await;
    s.element_screenshot(
        "[data-timeline=\"b\"]",
        &artifact("status-console-timeline.png"),
    )
    .await;
    eprintln!("screenshot: {}", png.display());
    s.close().await;
}
