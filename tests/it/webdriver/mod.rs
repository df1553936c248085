//! A small WebDriver client: chromedriver started on a loopback port, headless Chromium
//! sessions with JavaScript on or off, and the few commands the browser tests use.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

/// WebDriver's key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long chromedriver may take to start, and a command to answer.
const WAIT: Duration = Duration::from_secs(30);

/// A running chromedriver; stopped when dropped.
pub struct Browser {
    url: String,
    http: reqwest::Client,
    _driver: Child,
}

/// One browser session (a fresh profile); [`Session::close`] ends it.
pub struct Session {
    base: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// chromedriver from `CHROMEDRIVER` (default: `chromedriver` on the PATH), on a free port.
    pub async fn start() -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let driver = Command::new(&bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(WAIT)
            .build()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = http.get(format!("{url}/status")).send().await;
            if let Ok(r) = ready {
                let v: Value = r.json().await.unwrap_or_default();
                if v["value"]["ready"] == true {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver not ready within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Browser {
            url,
            http,
            _driver: driver,
        }
    }

    /// A headless Chromium session (`CHROME_BIN`, default `/usr/bin/chromium`), with page
    /// scripts allowed or blocked.
    pub async fn session(&self, javascript: bool) -> Session {
        let profile = tempfile::tempdir().unwrap();
        let bin = std::env::var("CHROME_BIN").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-proxy-server",
            "--window-size=1400,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let prefs = json!({
            "profile.default_content_setting_values.javascript": if javascript { 1 } else { 2 }
        });
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": bin, "args": args, "prefs": prefs},
        }}});
        let v = call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}/session", self.url),
            Some(caps),
        )
        .await;
        let id = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"));
        Session {
            base: format!("{}/session/{id}", self.url),
            http: self.http.clone(),
            _profile: profile,
        }
    }
}

/// One WebDriver command: its `value`, or the error WebDriver answered (`{error, message}`).
async fn try_call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, Value> {
    let mut req = http.request(method.clone(), url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let ok = resp.status().is_success();
    let v: Value = resp.json().await.unwrap();
    if ok {
        Ok(v["value"].clone())
    } else {
        Err(v["value"].clone())
    }
}

/// One WebDriver command; its `value`, or a panic naming the error.
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Value {
    match try_call(http, method.clone(), url, body).await {
        Ok(v) => v,
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

impl Session {
    async fn post(&self, path: &str, body: Value) -> Value {
        call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}{path}", self.base),
            Some(body),
        )
        .await
    }

    async fn get(&self, path: &str) -> Value {
        call(
            &self.http,
            reqwest::Method::GET,
            &format!("{}{path}", self.base),
            None,
        )
        .await
    }

    /// Navigate and wait for the document to load.
    pub async fn open(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    /// A property of the element a CSS selector finds first (`/text`, `/attribute/NAME`).
    /// The page's script swaps its `#status` part in on every refresh, so an element found
    /// just before a swap can be stale when it is read: then it is found again (bounded).
    async fn read(&self, css: &str, what: &str) -> Value {
        let find = json!({"using": "css selector", "value": css});
        let mut last = Value::Null;
        for _ in 0..10 {
            let found = try_call(
                &self.http,
                reqwest::Method::POST,
                &format!("{}/element", self.base),
                Some(find.clone()),
            )
            .await;
            let id = match found {
                Ok(v) => v[ELEMENT]
                    .as_str()
                    .unwrap_or_else(|| panic!("{css}: {v}"))
                    .to_string(),
                Err(e) => panic!("{css}: {e}"),
            };
            let url = format!("{}/element/{id}{what}", self.base);
            match try_call(&self.http, reqwest::Method::GET, &url, None).await {
                Ok(v) => return v,
                Err(e) if e["error"] == "stale element reference" => last = e,
                Err(e) => panic!("{css} {what}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{css} {what}: still stale after 10 tries: {last}")
    }

    /// The rendered text of an element.
    pub async fn text(&self, css: &str) -> String {
        self.read(css, "/text")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// An attribute of an element; empty when it has none.
    pub async fn attribute(&self, css: &str, name: &str) -> String {
        let v = self.read(css, &format!("/attribute/{name}")).await;
        v.as_str().unwrap_or_default().to_string()
    }

    /// A DOM property of an element (`textContent` reads an SVG `<title>`, which has no
    /// rendered text); empty when it is not a string.
    pub async fn property(&self, css: &str, name: &str) -> String {
        let v = self.read(css, &format!("/property/{name}")).await;
        v.as_str().unwrap_or_default().to_string()
    }

    /// How often the page's script swapped in a fresh status (`data-refreshes` on `<html>`).
    pub async fn refreshes(&self) -> u64 {
        self.attribute("html", "data-refreshes")
            .await
            .parse()
            .unwrap_or(0)
    }

    /// The browser window made `width` × `height` CSS pixels (a screenshot of the viewport
    /// shows what fits in it).
    pub async fn resize(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .await;
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let v = self.get("/screenshot").await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// A PNG of the element a CSS selector finds first, written to `path`.
    pub async fn element_screenshot(&self, css: &str, path: &Path) {
        let v = self.read(css, "/screenshot").await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    pub async fn close(self) {
        call(&self.http, reqwest::Method::DELETE, &self.base, None).await;
    }
}
