//! A `switchboard serve` of a test's own, as a process: its config written to a temp dir, its
//! listener on a free loopback port (`SWITCHBOARD_SERVER__LISTEN`), its log in a file beside
//! (read with [`Served::log`]); killed when dropped.

use std::time::Duration;

use super::{client, free_port, within};

pub struct Served {
    pub child: std::process::Child,
    pub base: String,
    dir: tempfile::TempDir,
}

impl Served {
    /// Serving `config`, with `env` set; returns once it answers `/health`.
    pub async fn start(config: &str, env: &[(&str, &str)]) -> Served {
        Served::start_under(config, env, &[]).await
    }

    /// As [`Served::start`], the binary started by `launcher` (its program and first arguments,
    /// the binary's path and arguments after them: `prlimit`, a shell): none, by itself.
    pub async fn start_under(config: &str, env: &[(&str, &str)], launcher: &[&str]) -> Served {
        let (dir, port) = (tempfile::tempdir().unwrap(), free_port());
        let path = dir.path().join("routes.toml");
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let bin = env!("CARGO_BIN_EXE_switchboard");
        let mut cmd = match launcher.split_first() {
            None => std::process::Command::new(bin),
            Some((program, args)) => {
                let mut c = std::process::Command::new(program);
                c.args(args).arg(bin);
                c
            }
        };
        let child = cmd
            .args(["serve", "--config"])
            .arg(&path)
            .env("SWITCHBOARD_SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let c = client();
        within("a proxy's health", async {
            while c.get(format!("{base}/health")).send().await.is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        Served { child, base, dir }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap()
    }

    /// Stopped as a service manager stops it (SIGTERM), waited for; how it exited.
    pub async fn stop(self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(term.success());
        tokio::task::spawn_blocking(move || {
            let mut s = self;
            s.child.wait().unwrap()
        })
        .await
        .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Prometheus text of the proxy at `base`.
pub async fn metrics_at(base: &str) -> String {
    let resp = client().get(format!("{base}/metrics")).send().await;
    resp.unwrap().text().await.unwrap()
}
