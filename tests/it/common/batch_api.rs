//! The Batch API as a client uses it: files uploaded as multipart forms, batches created and
//! polled, their output and error files read back.

use std::time::Duration;

use serde_json::{json, Value};

/// Longest a batch may take to reach a status in these tests (lines run in real time).
pub const BATCH_WAIT: Duration = Duration::from_secs(90);

/// A client of one proxy's Batch API.
pub struct Api {
    pub c: reqwest::Client,
    pub base: String,
}

impl Api {
    pub fn new(base: String) -> Api {
        Api {
            c: super::client(),
            base,
        }
    }

    pub async fn upload(&self, key: &str, text: String) -> (u16, Value) {
        let form = reqwest::multipart::Form::new()
            .text("purpose", "batch")
            .part(
                "file",
                reqwest::multipart::Part::bytes(text.into_bytes()).file_name("in.jsonl"),
            );
        let r = self.c.post(format!("{}/v1/files", self.base));
        answer(r.bearer_auth(key).multipart(form)).await
    }

    pub async fn create(&self, key: &str, file: &Value) -> (u16, Value) {
        let body = json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
                          "completion_window": "24h", "metadata": {"run": "t"}});
        self.post(key, "/v1/batches", &body).await
    }

    pub async fn post(&self, key: &str, path: &str, body: &Value) -> (u16, Value) {
        let r = self.c.post(format!("{}{path}", self.base));
        answer(r.bearer_auth(key).json(body)).await
    }

    pub async fn get(&self, key: &str, path: &str) -> (u16, Value) {
        answer(self.getting(key, path)).await
    }

    pub async fn text(&self, key: &str, path: &str) -> String {
        let r = self.getting(key, path).send().await.unwrap();
        r.text().await.unwrap()
    }

    /// A GET of `path` with `key`.
    fn getting(&self, key: &str, path: &str) -> reqwest::RequestBuilder {
        self.c.get(format!("{}{path}", self.base)).bearer_auth(key)
    }

    /// The batch once `done` holds of it (polled; within [`BATCH_WAIT`]).
    pub async fn until(&self, key: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let path = format!("/v1/batches/{id}");
        let waited = tokio::time::timeout(BATCH_WAIT, async {
            loop {
                let (status, b) = self.get(key, &path).await;
                assert_eq!(status, 200, "{b}");
                if done(&b) {
                    return b;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        waited.await.expect("the batch reaches the status awaited")
    }

    /// The batch once it is `completed`.
    pub async fn completed(&self, key: &str, id: &str) -> Value {
        self.until(key, id, |b| b["status"] == "completed").await
    }

    /// Each line of a file by its custom_id.
    pub async fn lines(&self, key: &str, file: &Value) -> Vec<Value> {
        let Some(id) = file.as_str() else {
            return Vec::new();
        };
        let text = self.text(key, &format!("/v1/files/{id}/content")).await;
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The status and JSON body of the answer to `r`.
async fn answer(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

pub fn ids(lines: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// A chat line of the batch input, its message `marker-{id}` (the backend's requests are told
/// apart by it).
pub fn chat_line(id: &str, model: &str, max_tokens: i64) -> String {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": model, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": format!("marker-{id}")}]}})
    .to_string()
}

/// `n` chat lines `l0`, `l1`, … of `model`, one per line of the text.
pub fn chat_lines(n: usize, model: &str) -> String {
    (0..n)
        .map(|i| chat_line(&format!("l{i}"), model, 3) + "\n")
        .collect()
}
