//! A client's limits as data: each a [`Limit`], a resource counted over a window, named by its
//! key (`tokens_per_day`, `output_tokens_per_month`, `gpu_seconds_per_minute`, …), one value each in a [`ByLimit`]; the
//! words a 429, a header and the status page tell it by.

use crate::kinds::{Key, PerKind};

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    Requests = 0,
    /// Prompt and output tokens together.
    Tokens = 1,
    /// GPU time of a backend's slot, counted in milliseconds, written and told in seconds.
    Gpu = 2,
    /// Output tokens alone.
    OutputTokens = 3,
}

impl Resource {
    pub const ALL: [Resource; 4] = [
        Resource::Requests,
        Resource::Tokens,
        Resource::Gpu,
        Resource::OutputTokens,
    ];

    /// Its name in a limit's key (`tokens` of `tokens_per_day`).
    fn stem(self) -> &'static str {
        match self {
            Resource::Requests => "requests",
            Resource::Tokens => "tokens",
            Resource::Gpu => "gpu_seconds",
            Resource::OutputTokens => "output_tokens",
        }
    }

    /// Its unit in words: `requests`, `tokens`, `GPU-seconds`, `output tokens`.
    pub fn unit(self) -> &'static str {
        match self {
            Resource::Requests => "requests",
            Resource::Tokens => "tokens",
            Resource::Gpu => "GPU-seconds",
            Resource::OutputTokens => "output tokens",
        }
    }

    /// Its unit as the status page abbreviates it.
    pub fn short(self) -> &'static str {
        match self {
            Resource::Gpu => "GPU-s",
            other => other.unit(),
        }
    }

    /// Counted in milliseconds, written and told in seconds.
    pub fn millis(self) -> bool {
        self == Resource::Gpu
    }

    /// Counted in tokens (its client's requests' tokens are counted and reserved).
    pub fn in_tokens(self) -> bool {
        matches!(self, Resource::Tokens | Resource::OutputTokens)
    }

    /// The rate-limit headers that tell it (`x-ratelimit-*-requests`, …; output tokens as
    /// `x-ratelimit-*-output-tokens`, Anthropic's `anthropic-ratelimit-output-tokens-*`; GPU
    /// time as `x-switchboard-ratelimit-*-gpu-seconds`); `None`: none does.
    pub fn header(self) -> Option<&'static str> {
        match self {
            Resource::Requests => Some("requests"),
            Resource::Tokens => Some("tokens"),
            Resource::Gpu => Some("gpu-seconds"),
            Resource::OutputTokens => Some("output-tokens"),
        }
    }
}

/// What a limit counts over: a rolling minute, or a day or month of the budgets' calendar
/// (`server.budget_timezone`), kept in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    Minute = 0,
    Day = 1,
    Month = 2,
}

impl Window {
    pub(crate) const ALL: [Window; 3] = [Window::Minute, Window::Day, Window::Month];

    pub fn word(self) -> &'static str {
        match self {
            Window::Minute => "minute",
            Window::Day => "day",
            Window::Month => "month",
        }
    }

    /// As the status page abbreviates it.
    pub(crate) fn short(self) -> &'static str {
        match self {
            Window::Minute => "min",
            other => other.word(),
        }
    }

    /// A period of the calendar (a budget kept in the ledger), not a rolling one.
    pub fn calendar(self) -> bool {
        self != Window::Minute
    }
}

impl Key for Window {
    const ALL: &'static [Window] = &Window::ALL;
    fn index(self) -> usize {
        self as usize
    }
}

/// One kind of limit: a resource over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub resource: Resource,
    pub window: Window,
}

/// A value for each kind of limit (GPU time in milliseconds).
pub type ByLimit<T> = PerKind<Limit, T, { Limit::COUNT }>;

/// Every kind of limit, a resource's windows together.
const ALL: [Limit; Limit::COUNT] = {
    let mut all = [Limit::new(Resource::Requests, Window::Minute); Limit::COUNT];
    let mut i = 0;
    while i < Limit::COUNT {
        let w = Window::ALL.len();
        all[i] = Limit::new(Resource::ALL[i / w], Window::ALL[i % w]);
        i += 1;
    }
    all
};

impl Key for Limit {
    const ALL: &'static [Limit] = &ALL;
    fn index(self) -> usize {
        self.resource as usize * Window::ALL.len() + self.window as usize
    }
}

impl Limit {
    pub(crate) const COUNT: usize = Resource::ALL.len() * Window::ALL.len();

    pub const fn new(resource: Resource, window: Window) -> Limit {
        Limit { resource, window }
    }

    /// Its key under `[clients.NAME]`: `tokens_per_day`.
    pub fn key(self) -> String {
        format!("{}_per_{}", self.resource.stem(), self.window.word())
    }

    /// `tokens per day`, `GPU-seconds per month`.
    pub fn words(self) -> String {
        format!("{} per {}", self.resource.unit(), self.window.word())
    }

    /// `tokens / day`, `GPU-s / min`.
    pub fn label(self) -> String {
        format!("{} / {}", self.resource.short(), self.window.short())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_place_and_key() {
        for (i, limit) in ALL.iter().enumerate() {
            assert_eq!(limit.index(), i);
        }
        let gpu_day = Limit::new(Resource::Gpu, Window::Day);
        assert_eq!(gpu_day.key(), "gpu_seconds_per_day");
        assert_eq!(gpu_day.words(), "GPU-seconds per day");
        assert_eq!(gpu_day.label(), "GPU-s / day");
        let rpm = Limit::new(Resource::Requests, Window::Minute);
        assert_eq!(
            (rpm.key().as_str(), rpm.label()),
            ("requests_per_minute", "requests / min".into())
        );
        let output_day = Limit::new(Resource::OutputTokens, Window::Day);
        assert_eq!(output_day.key(), "output_tokens_per_day");
        assert_eq!(output_day.words(), "output tokens per day");
        assert_eq!(output_day.label(), "output tokens / day");
        assert!(Resource::OutputTokens.in_tokens() && !Resource::OutputTokens.millis());
    }
}
