//! A config's errors, each naming the key and the value it concerns.

/// One problem in the config, naming the key and the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Load(String),
    #[error("aliases.{alias}.backend: {name:?} is not a defined backend")]
    UnknownBackend { alias: String, name: String },
    #[error("{key}: name {name:?} is already used by {other}")]
    DuplicateName {
        key: String,
        name: String,
        other: String,
    },
    #[error("{key}: {value:?} is not a valid URL ({reason})")]
    BadUrl {
        key: String,
        value: String,
        reason: String,
    },
    #[error("{key}: must be greater than zero, got 0")]
    Zero { key: String },
    #[error("{key}: {value:?} {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
    },
}

/// Every error found in one config; printed one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
