//! Fleet discovery (`"auto"` windows and slots, `check --probe`) and the harness
//! export, against simulators whose windows, slots and input kinds differ from the config.

use crate::common;

use std::process::{Command, Output};

use common::*;
use serde_json::{json, Value};
use switchboard_proxy::live::figures::Source;
use switchboard_proxy::live::AppState;
use switchboard_sim::{Sim, SimConfig};
use switchboard_wire::flavor::Flavor;

fn sim_cfg(flavor: Flavor, model: &str, slot_ctx: u32, slots: u32) -> SimConfig {
    SimConfig {
        flavor,
        model: model.into(),
        slot_ctx,
        slots,
        ..SimConfig::default()
    }
}

async fn models(p: &Proxy) -> Value {
    p.get_json("/v1/models").await
}

fn entry<'a>(list: &'a Value, id: &str) -> &'a Value {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed: {list}"))
}

/// A request whose `max_tokens` alone is larger than `window`.
fn too_long_for(model: &str, window: u32) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": window + 1000,
    })
}

const AUTO: &str = r#"
[server]
health_interval_secs = 2
[backends.b]
url = "{b}"
flavor = "{flavor}"
slots = "auto"
[aliases.a]
backend = "b"
upstream_model = "up-model"
context_window = "auto"
"#;

fn auto(flavor: &str) -> String {
    AUTO.replace("{flavor}", flavor)
}

#[tokio::test]
async fn auto_window_and_slots_are_taken_at_start() {
    let sim = sim(sim_cfg(Flavor::Llamacpp, "up-model", 3000, 3)).await;
    let p = proxy(&auto("llamacpp"), &[("b", sim.url())]).await;
    let c = client();
    let url = p.url("/v1/chat/completions");

    // Before the first probe: no window (no guard), 1 slot, both pending.
    let before = models(&p).await;
    let a = entry(&before, "a");
    assert_eq!(a["context_window_source"], "pending", "{a}");
    assert_eq!(
        (a["slots"].clone(), a["slots_source"].clone()),
        (json!(1), json!("pending"))
    );
    assert!(a.get("context_length").is_none(), "{a}");
    assert_eq!(status(&c, &url, &too_long_for("a", 3000)).await, 200);

    // The first round of health probes (what `serve` starts with) discovers the figures.
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    let after = models(&p).await;
    let a = entry(&after, "a");
    assert_eq!(a["context_length"], 3000, "{a}");
    assert_eq!(a["context_window_source"], "discovered", "{a}");
    assert_eq!(
        (a["slots"].clone(), a["slots_source"].clone()),
        (json!(3), json!("discovered"))
    );
    assert!(a["discovered_at"].as_u64().unwrap() > 0, "{a}");
    let snap = p.state.live.load_full();
    assert_eq!(snap.replica("b").unwrap().slots.slots(), 3);
    let figures = snap.figures("a").unwrap();
    assert!(matches!(
        figures.window_source,
        Some(Source::Discovered { .. })
    ));

    // The guard now holds the discovered window: refused before the backend sees it.
    let posts = sim.recorder().requests().len();
    let resp = c
        .post(&url)
        .json(&too_long_for("a", 3000))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(sim.recorder().requests().len(), posts);
    assert_eq!(status(&c, &url, &chat("a", false)).await, 200);
}

#[tokio::test]
async fn auto_figures_are_taken_again_on_reload() {
    let llama = sim(sim_cfg(Flavor::Llamacpp, "up-model", 3000, 3)).await;
    let sglang = sim(sim_cfg(Flavor::Sglang, "up-model", 5000, 2)).await;
    let vllm = sim(sim_cfg(Flavor::Vllm, "up-model", 7000, 8)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, fill(&auto("llamacpp"), &[("b", llama.url())])).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    assert_eq!(entry(&models(&p).await, "a")["context_length"], 3000);

    // The alias moves to an SGLang backend: its window from /v1/models, slots from /server_info.
    std::fs::write(&path, fill(&auto("sglang"), &[("b", sglang.url())])).unwrap();
    within("reload", switchboard_proxy::live::reload::reload(&p.state))
        .await
        .unwrap();
    let a = entry(&models(&p).await, "a").clone();
    assert_eq!(a["context_length"], 5000, "{a}");
    assert_eq!(
        (a["slots"].clone(), a["slots_source"].clone()),
        (json!(2), json!("discovered"))
    );
    assert_eq!(p.state.live.load().replica("b").unwrap().slots.slots(), 2);

    // vLLM reports its window but no slot count: "auto" slots are refused there, a number kept.
    let to_vllm = auto("vllm").replace("slots = \"auto\"", "slots = 5");
    std::fs::write(&path, fill(&to_vllm, &[("b", vllm.url())])).unwrap();
    within("reload", switchboard_proxy::live::reload::reload(&p.state))
        .await
        .unwrap();
    let a = entry(&models(&p).await, "a").clone();
    assert_eq!(a["context_length"], 7000, "{a}");
    assert_eq!(
        (a["slots"].clone(), a["slots_source"].clone()),
        (json!(5), json!("config"))
    );
    let refused = auto("vllm");
    std::fs::write(&path, fill(&refused, &[("b", vllm.url())])).unwrap();
    let err = within("reload", switchboard_proxy::live::reload::reload(&p.state))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("backends.b.slots: \"auto\" needs a number"),
        "{err}"
    );
}

#[tokio::test]
async fn auto_figures_are_taken_when_the_backend_recovers() {
    // A port that accepts connections but answers nothing (as a backend loading its model).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let p = proxy(&auto("llamacpp"), &[("b", url)]).await;
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    let a = entry(&models(&p).await, "a").clone();
    assert_eq!(a["status"], "loading", "{a}");
    assert_eq!(a["context_window_source"], "pending", "{a}");
    assert_eq!(a["slots"], 1, "{a}");

    // The backend comes up on that port: the next probe finds it up and takes its figures.
    let sim = Sim::spawn_on(sim_cfg(Flavor::Llamacpp, "up-model", 2500, 2), listener)
        .await
        .unwrap();
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    let a = entry(&models(&p).await, "a").clone();
    assert_eq!(a["status"], "up", "{a}");
    assert_eq!(a["context_length"], 2500, "{a}");
    assert_eq!(
        (a["slots"].clone(), a["slots_source"].clone()),
        (json!(2), json!("discovered"))
    );
    drop(sim);
}

// --- the binary: check --probe, routes, export ---

fn switchboard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchboard"))
}

/// Run the binary off the runtime's threads, so the simulators keep answering.
async fn run(args: Vec<String>) -> Output {
    let out = tokio::task::spawn_blocking(move || switchboard().args(args).output().unwrap());
    within("the command", out).await.unwrap()
}

fn write(dir: &tempfile::TempDir, text: &str) -> String {
    let p = dir.path().join("routes.toml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A fleet whose backends report less than the config says.
struct Drifted {
    llama: Sim,
    sglang: Sim,
    dead: String,
}

impl Drifted {
    async fn start() -> Drifted {
        Drifted {
            llama: sim(SimConfig {
                image: true,
                ..sim_cfg(Flavor::Llamacpp, "zealot", 2048, 2)
            })
            .await,
            sglang: sim(sim_cfg(Flavor::Sglang, "served", 8192, 3)).await,
            dead: dead_url().await,
        }
    }

    fn config(&self) -> String {
        fill(
            r#"
[server]
listen = "127.0.0.1:7788"
[backends.gpu]
url = "{gpu}"
flavor = "llamacpp"
slots = 4
[backends.sg]
url = "{sg}"
flavor = "sglang"
slots = "auto"
[backends.gone]
url = "{gone}"
flavor = "vllm"
slots = 1
[aliases.zealot]
backend = "gpu"
context_window = 4096
max_output_tokens = 1024
inputs = ["text", "image", "audio"]
[aliases.dragoon]
backend = "sg"
upstream_model = "not-served"
context_window = "auto"
max_output_tokens = 2000
[aliases.ghost]
backend = "gone"
context_window = 1000
[aliases.plain]
backend = "gpu"
upstream_model = "zealot"
"#,
            &[
                ("gpu", self.llama.url()),
                ("sg", self.sglang.url()),
                ("gone", self.dead.clone()),
            ],
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_probe_reports_every_disagreement_and_exits_1() {
    let fleet = Drifted::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &fleet.config());
    let out = run(args(&["check", "--probe", "--config", &path])).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "alias zealot: context_window: configured 4096, discovered 2048 per slot",
        "alias zealot: backends.gpu.slots: configured 4, discovered 2",
        "alias zealot: inputs: configured [text, image, audio], discovered [text, image]: the model does not take audio",
        "alias dragoon: upstream_model: configured \"not-served\", discovered [served]",
        &format!("alias ghost: backends.gone: configured {}, discovered unreachable", fleet.dead),
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    // plain shares zealot's backend, and so its slots.
    assert!(
        stdout.contains("alias plain: backends.gpu.slots: configured 4, discovered 2"),
        "{stdout}"
    );
    assert!(stdout.contains("6 disagreement(s)"), "{stdout}");
    // The window SGLang reported fills dragoon's "auto"; its slots are SGLang's own.
    assert!(
        !stdout.contains("alias dragoon: context_window"),
        "{stdout}"
    );
    assert!(!stdout.contains("backends.sg.slots"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_probe_exits_0_when_the_fleet_agrees() {
    let llama = sim(sim_cfg(Flavor::Llamacpp, "m", 4096, 2)).await;
    let vllm = sim(sim_cfg(Flavor::Vllm, "v", 32768, 16)).await;
    let toml = fill(
        r#"
[backends.gpu]
url = "{gpu}"
flavor = "llamacpp"
slots = "auto"
[backends.big]
url = "{big}"
flavor = "vllm"
slots = 8
[aliases.m]
backend = "gpu"
context_window = 4096
[aliases.v]
backend = "big"
context_window = "auto"
"#,
        &[("gpu", llama.url()), ("big", vllm.url())],
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &toml);
    let out = run(args(&["check", "--probe", "--config", &path])).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("alias m: ok"), "{stdout}");
    assert!(stdout.contains("alias v: ok"), "{stdout}");
    assert!(stdout.contains("the fleet agrees with"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_says_which_figures_were_discovered() {
    let llama = sim(sim_cfg(Flavor::Llamacpp, "up-model", 3000, 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &fill(&auto("llamacpp"), &[("b", llama.url())]));
    let out = run(args(&["routes", "--config", &path])).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let row = stdout.lines().find(|l| l.starts_with("a ")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cols[4..8],
        ["3000", "discovered", "3", "discovered"],
        "{stdout}"
    );
    assert!(
        stdout.contains("backend b: figures discovered at"),
        "{stdout}"
    );
}

/// The models of the exported document, by id.
fn exported(doc: &Value) -> (&Value, std::collections::BTreeMap<String, Value>) {
    let provider = &doc["providers"]["switchboard"];
    let models = provider["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_string(), m.clone()))
        .collect();
    (provider, models)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_parses_back_and_matches_the_config() {
    let fleet = Drifted::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &fleet.config());
    let yml = run(args(&[
        "export",
        "--format",
        "models-yml",
        "--config",
        &path,
    ]))
    .await;
    assert!(
        yml.status.success(),
        "{}",
        String::from_utf8_lossy(&yml.stderr)
    );
    let doc: Value = serde_norway::from_slice(&yml.stdout).unwrap();
    let json = run(args(&["export", "--format", "json", "--config", &path])).await;
    let same: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc, same, "models-yml and json carry the same document");

    let cfg = switchboard_proxy::config::load(std::path::Path::new(&path)).unwrap();
    let (provider, models) = exported(&doc);
    assert_eq!(provider["baseUrl"], "http://127.0.0.1:7788/v1");
    assert_eq!(provider["api"], "openai-completions");
    assert_eq!(models.len(), cfg.aliases.len());
    for a in cfg.aliases.values() {
        let m = &models[&a.name];
        assert_eq!(m["name"], a.name.as_str());
        assert_eq!(m["input"], json!(a.shape.inputs.names()), "{m}");
        assert_eq!(
            m.get("maxTokens").cloned(),
            a.shape.max_output_tokens.map(|t| json!(t.get())),
            "{m}"
        );
        assert_eq!(
            m.get("contextWindow").cloned(),
            a.context_window.map(|w| json!(w.get())),
            "{m}"
        );
    }
    assert!(
        models["dragoon"].get("contextWindow").is_none(),
        "auto: known only by probing"
    );
    assert!(
        models["plain"].get("contextWindow").is_none(),
        "no window configured"
    );
    let stderr = String::from_utf8_lossy(&yml.stderr);
    assert!(
        stderr.contains("alias dragoon: context_window = \"auto\""),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_probe_takes_the_simulators_figures() {
    let fleet = Drifted::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, &fleet.config());
    let out = run(args(&[
        "export",
        "--probe",
        "--format",
        "models-yml",
        "--base-url",
        "http://proxy.example:7700/v1",
        "--config",
        &path,
    ]))
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_norway::from_slice(&out.stdout).unwrap();
    let (provider, models) = exported(&doc);
    assert_eq!(provider["baseUrl"], "http://proxy.example:7700/v1");
    // The llama.cpp simulator: 2048 tokens per slot, text and images (the alias said audio too).
    assert_eq!(models["zealot"]["contextWindow"], 2048);
    assert_eq!(models["zealot"]["input"], json!(["text", "image"]));
    assert_eq!(models["zealot"]["maxTokens"], 1024);
    // The SGLang simulator's max_model_len fills the "auto" window.
    assert_eq!(models["dragoon"]["contextWindow"], 8192);
    assert_eq!(models["dragoon"]["input"], json!(["text"]));
    // No window in the config: the backend's.
    assert_eq!(models["plain"]["contextWindow"], 2048);
    // An unreachable backend: its alias from the config, and a warning.
    assert_eq!(models["ghost"]["contextWindow"], 1000);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("backend gone: unreachable"), "{stderr}");
}

#[tokio::test]
async fn simulators_report_their_knobs_in_each_flavours_shape() {
    let llama = sim(SimConfig {
        audio: true,
        ..sim_cfg(Flavor::Llamacpp, "m", 1234, 3)
    })
    .await;
    let c = client();
    let props: Value = c
        .get(format!("{}/props", llama.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(props["default_generation_settings"]["n_ctx"], 1234);
    assert_eq!(props["total_slots"], 3);
    assert_eq!(
        props["modalities"],
        json!({"vision": false, "video": false, "audio": true})
    );
    let sglang = sim(SimConfig {
        image: true,
        ..sim_cfg(Flavor::Sglang, "s", 4321, 5)
    })
    .await;
    for path in ["/server_info", "/get_server_info"] {
        let info: Value = c
            .get(format!("{}{path}", sglang.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            info["internal_states"][0]["max_running_requests"], 5,
            "{path}"
        );
    }
    for path in ["/model_info", "/get_model_info"] {
        let info: Value = c
            .get(format!("{}{path}", sglang.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(info["has_image_understanding"], true, "{path}");
        assert_eq!(info["has_audio_understanding"], false, "{path}");
    }
    let listing: Value = c
        .get(format!("{}/v1/models", sglang.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listing["data"][0]["max_model_len"], 4321);
}
