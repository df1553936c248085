//! The live state: config reload and backend health, as metrics, `/v1/models` and routing show them.

use crate::common;
use std::time::Duration;

use common::*;
use serde_json::Value;
use switchboard_proxy::live::AppState;
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;

#[tokio::test]
async fn reload_swaps_config_and_keeps_it_on_error() {
    let sim = sim(SimConfig {
        model: "up-model".into(),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    std::fs::write(
        &path,
        fill(&one_alias("llamacpp", "", ""), &[("b", sim.url())]),
    )
    .unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let c = client();
    let url = p.url("/v1/chat/completions");
    assert_eq!(status(&c, &url, &chat("a", false)).await, 200);

    let renamed = one_alias("llamacpp", "", "").replace("[aliases.a]", "[aliases.z]");
    std::fs::write(&path, fill(&renamed, &[("b", sim.url())])).unwrap();
    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap();
    assert_eq!(status(&c, &url, &chat("z", false)).await, 200);
    assert_eq!(status(&c, &url, &chat("a", false)).await, 404);

    std::fs::write(&path, "[aliases.broken]\nbackend = \"nope\"\n").unwrap();
    let err = switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("aliases.broken.backend"), "{err}");
    assert_eq!(status(&c, &url, &chat("z", false)).await, 200);

    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_config_reloads_total{result="success"}"#),
        1.0
    );
    assert_eq!(
        sample(&m, r#"switchboard_config_reloads_total{result="failure"}"#),
        1.0
    );
}

#[tokio::test]
async fn health_probes_tell_up_loading_and_down() {
    let up = sim(SimConfig::default()).await;
    let loading_llama = sim(SimConfig {
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let loading_vllm = sim(SimConfig {
        flavor: Flavor::Vllm,
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let loading_sglang = sim(SimConfig {
        flavor: Flavor::Sglang,
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let dead_url = dead_url().await;
    let toml = r#"
[server]
health_interval_secs = 1
[backends.up]
url = "{up}"
flavor = "llamacpp"
[backends.ll]
url = "{ll}"
flavor = "llamacpp"
[backends.lv]
url = "{lv}"
flavor = "vllm"
[backends.ls]
url = "{ls}"
flavor = "sglang"
[backends.dead]
url = "{dead}"
flavor = "vllm"
[aliases.a]
backend = "up"
[aliases.b]
backend = "dead"
"#;
    let p = proxy(
        toml,
        &[
            ("up", up.url()),
            ("ll", loading_llama.url()),
            ("lv", loading_vllm.url()),
            ("ls", loading_sglang.url()),
            ("dead", dead_url),
        ],
    )
    .await;
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    let m = p.metrics().await;
    for (backend, state) in [
        ("up", "up"),
        ("ll", "loading"),
        ("lv", "loading"),
        ("ls", "loading"),
        ("dead", "down"),
    ] {
        let labels =
            format!("switchboard_backend_state{{backend=\"{backend}\",state=\"{state}\"}}");
        assert_eq!(sample(&m, &labels), 1.0, "{backend}: {m}");
        let up = sample(
            &m,
            &format!("switchboard_backend_up{{backend=\"{backend}\"}}"),
        );
        assert_eq!(up, if state == "up" { 1.0 } else { 0.0 }, "{backend}");
    }
    let v: Value = p.get_json("/v1/models").await;
    let status: Vec<_> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        status,
        [("a".into(), "up".into()), ("b".into(), "down".into())]
    );
}

/// Write `text` next to `path` and rename it over `path`, as editors save.
fn replace_by_rename(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_file_replaced_by_rename_is_reloaded_without_a_signal() {
    let sim = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    let text = |alias: &str| {
        fill(
            &one_alias("llamacpp", "", "").replace("[aliases.a]", &format!("[aliases.{alias}]")),
            &[("b", sim.url())],
        )
    };
    std::fs::write(&path, text("a")).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let watching = switchboard_proxy::live::watch::start(&p.state).expect("the folder is watched");
    tokio::spawn(watching.run());
    let c = client();
    let url = p.url("/v1/chat/completions");

    // The watch reloads it: the new routes serve within `WAIT`.
    replace_by_rename(&path, &text("z"));
    within("the new routes", async {
        while status(&c, &url, &chat("z", false)).await != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(status(&c, &url, &chat("a", false)).await, 404);

    // A broken file is refused and reported; the running config stays.
    replace_by_rename(&path, "[aliases.broken]\nbackend = \"nope\"\n");
    within("the refused reload", async {
        loop {
            let m = p.metrics().await;
            if sample(&m, r#"switchboard_config_reloads_total{result="failure"}"#) == 1.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(status(&c, &url, &chat("z", false)).await, 200);
}

/// A file renamed over every 20 ms without a pause (a generator rewriting it, a sync loop)
/// is still reloaded: the debounce (here 3 s, far longer than any gap between the renames)
/// waits for a pause only up to `reload_max_delay_ms`.
#[tokio::test]
async fn a_file_that_keeps_changing_is_reloaded_within_the_most_delay() {
    let sim = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    let url = sim.url();
    let text = move |alias: &str| {
        fill(
            &one_alias(
                "llamacpp",
                "reload_debounce_ms = 3000\nreload_max_delay_ms = 300",
                "",
            )
            .replace("[aliases.a]", &format!("[aliases.{alias}]")),
            &[("b", url.clone())],
        )
    };
    std::fs::write(&path, text("a")).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let watching = switchboard_proxy::live::watch::start(&p.state).expect("the folder is watched");
    tokio::spawn(watching.run());
    // Renamed over every 20 ms, a new alias name each time, from a thread of its own, until
    // the test has seen a reload.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renamer = {
        let (stop, path) = (stop.clone(), path.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                replace_by_rename(&path, &text(&format!("z{n}")));
                std::thread::sleep(Duration::from_millis(20));
            }
            n
        })
    };
    within("a reload while the file keeps changing", async {
        loop {
            let m = p.metrics().await;
            if sample(&m, r#"switchboard_config_reloads_total{result="success"}"#) >= 1.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let renames = renamer.join().unwrap();
    assert!(renames > 1, "{renames}");
    assert!(p
        .state
        .live
        .load()
        .config
        .aliases
        .keys()
        .all(|k| k.starts_with('z')));
}

/// A Kubernetes ConfigMap volume: `routes.toml` links to `..data/routes.toml`, and an update
/// writes a new timestamped folder and renames a new `..data` link over the old one.
#[cfg(unix)]
#[tokio::test]
async fn a_configmap_volume_update_is_reloaded_without_a_signal() {
    use std::os::unix::fs::symlink;
    let sim = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let text = |alias: &str| {
        fill(
            &one_alias("llamacpp", "", "").replace("[aliases.a]", &format!("[aliases.{alias}]")),
            &[("b", sim.url())],
        )
    };
    let version = |n: u32, alias: &str| {
        let v = dir.path().join(format!("..2026_12_01_{n}"));
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("routes.toml"), text(alias)).unwrap();
        v
    };
    let first = version(1, "a");
    symlink(&first, dir.path().join("..data")).unwrap();
    let path = dir.path().join("routes.toml");
    symlink("..data/routes.toml", &path).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let watching = switchboard_proxy::live::watch::start(&p.state).expect("the folder is watched");
    tokio::spawn(watching.run());
    let c = client();
    let url = p.url("/v1/chat/completions");

    let second = version(2, "z");
    symlink(&second, dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    within("the new routes", async {
        while status(&c, &url, &chat("z", false)).await != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(status(&c, &url, &chat("a", false)).await, 404);
}

#[tokio::test]
async fn slots_breaker_state_and_affinity_survive_a_reload() {
    let sim = sim(SimConfig {
        fail_status: Some(500),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    let toml = |description: &str| {
        fill(
            &one_alias(
                "llamacpp",
                "breaker_failures = 2\nbreaker_open_ms = 60000",
                &format!("description = \"{description}\""),
            ),
            &[("b", sim.url())],
        )
    };
    std::fs::write(&path, toml("before")).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let c = client();
    let url = p.url("/v1/chat/completions");
    for _ in 0..2 {
        assert_eq!(status(&c, &url, &chat("a", false)).await, 500);
    }
    let old = p.state.live.load_full();
    let held = old.replica("b").unwrap().slots.try_acquire().unwrap();
    old.affinity().set(7, "b");

    std::fs::write(&path, toml("after")).unwrap();
    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap();
    let new = p.state.live.load_full();
    assert_eq!(
        new.routes.alias("a").unwrap().spec.description.as_deref(),
        Some("after")
    );
    assert!(std::sync::Arc::ptr_eq(
        &old.replica("b").unwrap().slots,
        &new.replica("b").unwrap().slots
    ));
    assert_eq!(new.replica("b").unwrap().slots.free(), 7);
    assert_eq!(p.state.shown_state("b"), "breaker_open");
    assert_eq!(new.affinity().get(7).as_deref(), Some("b"));
    // Still open after the reload: refused without reaching the backend.
    let received = sim.recorder().received();
    assert_eq!(status(&c, &url, &chat("a", false)).await, 503);
    assert_eq!(sim.recorder().received(), received);
    drop(held);
    assert_eq!(new.replica("b").unwrap().slots.free(), 8);
}
