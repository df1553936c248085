//! A test's `routes.toml`, built table by table: backends at `{NAME}` placeholders that
//! [`super::proxy`] fills with the servers' URLs, aliases on them, and any other keys as written.

use std::fmt::Display;

/// Config text; each key method sets a key of the table opened last.
#[derive(Debug, Default, Clone)]
pub struct Fleet {
    text: String,
}

impl Fleet {
    pub fn new() -> Fleet {
        Fleet::default()
    }

    /// `[server]` with `lines` (`key = value` lines, possibly none).
    pub fn server(self, lines: &str) -> Fleet {
        self.text("[server]").text(lines)
    }

    /// `[backends.NAME]` of `flavor`, its `url` the placeholder `{NAME}`.
    pub fn backend(self, name: &str, flavor: &str) -> Fleet {
        self.text(&format!(
            "[backends.{name}]\nurl = \"{{{name}}}\"\nflavor = \"{flavor}\""
        ))
    }

    /// `[aliases.NAME]` on the one backend `backend`.
    pub fn alias(self, name: &str, backend: &str) -> Fleet {
        self.text(&format!("[aliases.{name}]\nbackend = \"{backend}\""))
    }

    /// `[aliases.NAME]` on the replicas `backends`, in their order.
    pub fn replicas(self, name: &str, backends: &[&str]) -> Fleet {
        let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
        self.text(&format!(
            "[aliases.{name}]\nbackends = [{}]",
            list.join(", ")
        ))
    }

    /// A backend's `slots`.
    pub fn slots(self, n: u32) -> Fleet {
        self.set("slots", n)
    }

    /// A backend's `queue`.
    pub fn queue(self, n: u32) -> Fleet {
        self.set("queue", n)
    }

    /// An alias's `upstream_model`.
    pub fn model(self, upstream: &str) -> Fleet {
        self.set("upstream_model", format!("\"{upstream}\""))
    }

    /// An alias's `context_window`.
    pub fn window(self, tokens: u32) -> Fleet {
        self.set("context_window", tokens)
    }

    /// `key = value`, the value written as TOML (a string with its quotes).
    pub fn set(self, key: &str, value: impl Display) -> Fleet {
        self.text(&format!("{key} = {value}"))
    }

    /// TOML as written: keys of the last table, or tables of their own (`[clients.NAME]`, …).
    pub fn text(mut self, toml: &str) -> Fleet {
        self.text.push_str(toml);
        if !toml.is_empty() && !toml.ends_with('\n') {
            self.text.push('\n');
        }
        self
    }

    pub fn render(self) -> String {
        self.text
    }
}
