//! `slots` and `context_window`: a number, or the word `"auto"` (the backend's own figure),
//! as written and as validated.

use std::num::NonZeroU32;

use serde::Deserialize;

use super::error::ConfigError;

/// `context_window` / `slots` as written: a number, or the word `"auto"` (the backend's own
/// figure). A number written as a string (as environment overrides may give) is a number.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum RawSizing {
    Number(u64),
    Word(String),
}

impl RawSizing {
    /// The number written, if it is one.
    pub fn number(&self) -> Option<u64> {
        match self {
            RawSizing::Number(n) => Some(*n),
            RawSizing::Word(w) => w.trim().parse().ok(),
        }
    }
}

/// A figure the config gives (`Fixed`) or leaves to the backend (`"auto"`, taken from what
/// the backend reports when the snapshot is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    Fixed(NonZeroU32),
    Auto,
}

impl Sizing {
    pub fn is_auto(self) -> bool {
        self == Sizing::Auto
    }

    /// The configured number; `None` for `"auto"`.
    pub(crate) fn fixed(self) -> Option<NonZeroU32> {
        match self {
            Sizing::Fixed(n) => Some(n),
            Sizing::Auto => None,
        }
    }
}

impl std::fmt::Display for Sizing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sizing::Fixed(n) => write!(f, "{n}"),
            Sizing::Auto => f.write_str("auto"),
        }
    }
}

/// A number greater than zero or `"auto"`; `auto_refused` says why "auto" cannot be had here.
pub(super) fn sizing(
    key: &str,
    raw: RawSizing,
    auto_refused: Option<&str>,
    errs: &mut Vec<ConfigError>,
) -> Option<Sizing> {
    let number = match raw {
        RawSizing::Word(w) if w == "auto" => {
            if let Some(reason) = auto_refused {
                errs.push(ConfigError::BadValue {
                    key: key.into(),
                    value: w,
                    reason: reason.into(),
                });
                return None;
            }
            return Some(Sizing::Auto);
        }
        RawSizing::Word(w) => match w.trim().parse::<u64>() {
            Ok(n) => n,
            Err(_) => {
                errs.push(ConfigError::BadValue {
                    key: key.into(),
                    value: w,
                    reason: "is neither a number nor \"auto\"".into(),
                });
                return None;
            }
        },
        RawSizing::Number(n) => n,
    };
    match u32::try_from(number).ok().and_then(NonZeroU32::new) {
        Some(n) => Some(Sizing::Fixed(n)),
        None if number == 0 => {
            errs.push(ConfigError::Zero { key: key.into() });
            None
        }
        None => {
            errs.push(ConfigError::BadValue {
                key: key.into(),
                value: number.to_string(),
                reason: "is larger than 4294967295".into(),
            });
            None
        }
    }
}
