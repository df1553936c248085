//! How prompt tokens are counted, as configured: an alias's strategy, tokenizer files and
//! media costs, and the server's count gate. The counters themselves are `tokens`'.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Counting strategy of an alias (config key `count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CountKind {
    Local,
    Backend,
    Estimate,
}

impl CountKind {
    /// The config value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CountKind::Local => "local",
            CountKind::Backend => "backend",
            CountKind::Estimate => "estimate",
        }
    }
}

/// The model's tokenizer files (config key `tokenizer = { file, config }`); either may be
/// gzip-compressed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerFiles {
    /// `tokenizer.json`.
    pub file: PathBuf,
    /// `tokenizer_config.json`, holding `chat_template`.
    pub config: PathBuf,
}

/// Tokens charged per media part (config key `media_tokens = { image, audio }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediaCosts {
    /// Per image (or video) part. Default 1024.
    #[serde(default = "default_media")]
    pub image: u32,
    /// Per audio part. Default 1024.
    #[serde(default = "default_media")]
    pub audio: u32,
}

fn default_media() -> u32 {
    1024
}

impl Default for MediaCosts {
    fn default() -> Self {
        MediaCosts {
            image: default_media(),
            audio: default_media(),
        }
    }
}

/// The count gate's settings (`server.count_concurrency`, `server.count_queue_timeout_ms`,
/// `server.count_limit_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateConfig {
    /// Counts running at once.
    pub(crate) concurrency: usize,
    /// Longest wait for a turn.
    pub(crate) wait: Duration,
    /// Most bytes one count may tokenize (text not in the fragment cache).
    pub(crate) limit_bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keys_deserialize() {
        let media: MediaCosts = serde_json::from_str(r#"{"image": 256}"#).unwrap_or_default();
        assert_eq!(
            media,
            MediaCosts {
                image: 256,
                audio: 1024
            }
        );
        assert!(serde_json::from_str::<MediaCosts>(r#"{"video": 1}"#).is_err());
        let kind: Result<CountKind, _> = serde_json::from_str(r#""backend""#);
        assert_eq!(kind.ok(), Some(CountKind::Backend));
        let files: Result<TokenizerFiles, _> =
            serde_json::from_str(r#"{"file": "t.json", "config": "c.json", "x": 1}"#);
        assert!(files.is_err());
    }
}
