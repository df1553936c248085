//! A PostgreSQL server of a test's own (Debian package `postgresql`), in a temp dir on a
//! loopback port; skipped without it, unless `SWITCHBOARD_TEST_NEED_POSTGRES` is set, as CI
//! does.

use std::path::PathBuf;
use std::process::Command;

use super::free_port;

/// A PostgreSQL server of its own in a temp dir, on a loopback port.
pub struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

impl Postgres {
    /// Started, or `None` after saying the test is skipped (a failure where
    /// `SWITCHBOARD_TEST_NEED_POSTGRES` is set).
    pub fn start() -> Option<Postgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|d| d.flatten().map(|e| e.path().join("bin")).max());
        let Some(bin) = bin.filter(|b| b.join("initdb").exists()) else {
            assert!(
                std::env::var_os("SWITCHBOARD_TEST_NEED_POSTGRES").is_none(),
                "PostgreSQL is not installed (Debian package postgresql)"
            );
            eprintln!("skipped: PostgreSQL is not installed (Debian package postgresql)");
            return None;
        };
        let (dir, port) = (tempfile::tempdir().unwrap(), free_port());
        let pg = Postgres { bin, dir, port };
        if is_root() {
            // initdb refuses root: the server runs as `postgres`.
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(pg.dir.path())
                .status()
                .unwrap();
            assert!(ok.success());
        }
        pg.run(
            "initdb",
            &["-D", &pg.data(), "-A", "trust", "-U", "postgres"],
        );
        pg.ctl_start();
        pg.run(
            "createdb",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "usage",
            ],
        );
        Some(pg)
    }

    pub fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/usage", self.port)
    }

    pub fn ctl_start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-l", &log, "-w", "-o", &opts, "start"],
        );
    }

    pub fn stop(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    pub fn run(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        let out = cmd.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let exe = self.bin.join("pg_ctl");
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "stop"];
        let _ = if is_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(exe)
                .args(args)
                .output()
        } else {
            Command::new(exe).args(args).output()
        };
    }
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
