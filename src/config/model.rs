//! The validated configuration: what the rest of the program reads, every reference resolved.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use super::apis::Apis;
use super::counting::{CountKind, GateConfig, MediaCosts, TokenizerFiles};
use crate::address::TlsSpec;
use crate::flavor::Flavor;
use crate::reasoning::{OutputField, ThinkTags};
use crate::wire::shape::ShapeSpec;
use crate::wire::{Adapter, Converter};

/// A validated configuration: every reference resolved, every value in range.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: Server,
    pub backends: BTreeMap<String, Arc<Backend>>,
    pub aliases: BTreeMap<String, Arc<Alias>>,
    /// Named clients and the queue's classes.
    pub clients: Arc<super::clients::Clients>,
    /// Where spans go; `None`: tracing off.
    pub tracing: Option<super::tracing::Tracing>,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub reasoning_field: OutputField,
    pub body_limit: usize,
    /// Most bytes of a whole (non-streamed) answer held to be read or rewritten; a longer
    /// one is relayed as it comes when nothing rewrites it, else refused.
    pub answer_limit: usize,
    /// Most bytes of one stream event held until its end; a longer one ends the stream.
    pub event_limit: usize,
    /// A request a backend took and then closed or reset without a byte of answer goes to
    /// the next replica or fallback, once (false: it is the client's 502, as the backend may
    /// have run it). Unset: for the APIs whose adapter says so (chat completions, Responses,
    /// Messages), not for the others.
    pub resend_unanswered: Option<bool>,
    /// Token counts at once, their wait for a turn, and the text one may tokenize.
    pub count: GateConfig,
    pub connect_timeout: Duration,
    pub header_timeout: Duration,
    pub shutdown_grace: Duration,
    pub health_interval: Duration,
    pub queue_timeout: Duration,
    /// Worker threads, each with its own runtime and listener.
    pub workers: usize,
    /// How long to wait for the first event of an SGLang stream (which may be a context error).
    pub stream_peek: Duration,
    /// Client keys accepted in `Authorization: Bearer …`; `None` = open.
    pub api_keys: Option<Vec<String>>,
    /// Keys that may scrape `/metrics` (`Authorization: Bearer …`); `None` = open.
    pub metrics_keys: Option<Vec<String>>,
    /// Keys that see the whole status page (every alias and client); `None`: none do beyond
    /// what a client key or an open proxy shows.
    pub admin_keys: Option<Vec<String>>,
    /// The backend-side timeouts of a backend that sets none of its own.
    pub timeouts: Timeouts,
    /// What a client connection may take: time, connections, nesting.
    pub client: ClientSide,
    pub breaker: BreakerConfig,
    /// Reload when the config file changes (besides SIGHUP).
    pub watch_config: bool,
    /// Changes to the file closer together than this are one reload.
    pub reload_debounce: Duration,
    /// A file that keeps changing is reloaded at least this often.
    pub reload_max_delay: Duration,
    /// The store slot counts and client limits are kept in across processes; `None`: each
    /// process counts on its own.
    pub shared_state: Option<SharedState>,
    /// How often the load of replicas is read from the backends; `None`: never (each process
    /// counts only its own requests).
    pub load_interval: Option<Duration>,
    /// Where a conversation that spilled to its next replica goes next.
    pub after_spill: AfterSpill,
    /// How long a later turn of a conversation waits for a slot of its first replica, when
    /// that is full by this process's own requests, before it goes to the next in its order
    /// (zero: it goes at once).
    pub spill_wait: Duration,
}

/// `server.shared_state`: where the counts several processes share are kept, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedState {
    /// `redis://HOST:PORT/N` (Redis or Valkey, one server, not Cluster).
    pub url: String,
    /// How long a slot or client lease lives without renewal: what a killed process holds
    /// for at most.
    pub lease: Duration,
    /// Longest a call to the store may take before the process counts on its own.
    pub timeout: Duration,
}

/// Where a conversation goes after its first replica was full and it went to the next in its
/// order (`server.after_spill`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterSpill {
    /// Back to its first replica as soon as that has a free slot: every process makes the same
    /// choice from the request and the backends' load alone.
    #[default]
    Return,
    /// On where this process sent it last, while that replica has a free slot (where its
    /// prefix now is cached); another process does not know it spilled.
    Stay,
}

/// The client side's limits (`[server]` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSide {
    /// Time a client has to send a request's whole head, from its first byte.
    pub header_timeout: Duration,
    /// Time a client connection may sit idle between requests (or before the first).
    pub idle_timeout: Duration,
    /// Time a client may leave between two pieces of a request's body (and from the head to
    /// the first piece).
    pub body_timeout: Duration,
    /// Time a client has to send a request's whole body, from its head.
    pub body_total_timeout: Duration,
    /// Most client connections open at once (all workers); `None`: from the process's file
    /// descriptor limit when the server starts ([`crate::http::server`]).
    pub max_connections: Option<usize>,
    /// Deepest nesting of arrays and objects a request body may have.
    pub json_depth_limit: usize,
}

/// The limits of one exchange with a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open the TCP connection.
    pub connect: Duration,
    /// From sending the request to the answer's head (a long prefill counts here).
    pub first_byte: Duration,
    /// Between two pieces of an answer's body (two events of a stream).
    pub idle: Duration,
    /// The whole exchange, head and body.
    pub total: Duration,
}

/// When a backend's circuit breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open it.
    pub failures: NonZeroU32,
    /// How long it stays open before one request (or probe) is let through.
    pub open_for: Duration,
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
    pub fn fixed(self) -> Option<NonZeroU32> {
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

#[derive(Debug, Clone)]
pub struct Backend {
    pub name: String,
    /// Base URL without a trailing slash, e.g. `http://dankclaw:7771`.
    pub url: String,
    pub flavor: Flavor,
    /// `host:port` the backend is reached at (the URL's port, or its scheme's default).
    pub authority: String,
    /// The URL's path, put before every request path (empty for a server root).
    pub path_prefix: String,
    /// For an https backend: the name its certificate must show, and its `ca_file`.
    pub tls: Option<TlsSpec>,
    /// Slots in force: the configured number; with `slots = "auto"` the backend's own count
    /// once discovered, 1 until then.
    pub slots: NonZeroU32,
    /// `slots` as configured.
    pub slots_setting: Sizing,
    pub queue: u32,
    /// The backend's own key as the `Authorization: Bearer …` value that replaces the
    /// client's, made and checked once here (marked sensitive: never logged or shown).
    pub api_key: Option<HeaderValue>,
    pub timeouts: Timeouts,
    /// The wire APIs it serves itself; the others are translated to chat completions.
    pub apis: Apis,
}

impl Backend {
    /// How a request of `api` reaches this backend: `None` when it is sent as it is (chat, or
    /// an API the backend serves itself, converted there by its own converter) — see
    /// [`Backend::counting`] for what is counted then — else the translation to chat
    /// completions.
    pub fn translation(&self, api: &dyn Adapter) -> Option<Converter> {
        (!self.apis.serves(api)).then(|| Converter::translate(self.flavor))
    }

    /// The converter whose chat form of an `api` request is what this backend templates.
    pub fn counting(&self, api: &dyn Adapter) -> Converter {
        self.translation(api)
            .unwrap_or_else(|| Converter::native(self.flavor))
    }
}

pub use crate::wire::shape::Input;

#[derive(Debug, Clone)]
pub struct Alias {
    pub name: String,
    /// `name` as the `X-Switchboard-Alias` value of every answer (made once, here).
    pub served_as: HeaderValue,
    /// The first of `backends`: the one whose flavour shapes the body and whose endpoints
    /// count tokens (`count = "backend"`).
    pub backend: Arc<Backend>,
    /// Every replica, `backend` first; requests go to the least loaded usable one.
    pub backends: Vec<Arc<Backend>>,
    /// Aliases tried in order when no backend of this one can take a request.
    pub fallbacks: Vec<String>,
    pub upstream_model: String,
    /// The window in force: the configured number; with `context_window = "auto"` the
    /// backend's per-slot window once discovered, `None` (no guard) until then.
    pub context_window: Option<NonZeroU32>,
    /// `context_window` as configured; `None` when unset.
    pub window_setting: Option<Sizing>,
    /// The context guard's settings; present when `context_window` is set, in force once the
    /// window is known. Its counter is built with the snapshot (`crate::live`), which loads
    /// the tokenizer.
    pub guard: Option<GuardConfig>,
    /// Where over-window requests go instead of being rejected (an alias with a larger window).
    pub context_fallback: Option<String>,
    /// Defaults, stripped fields, the output cap and the input kinds taken.
    pub shape: ShapeSpec,
    pub old_names: Vec<String>,
    pub reasoning_field: Option<OutputField>,
    /// Inline reasoning markers to split out of `content` (opt-in per alias).
    pub think_tags: Option<Arc<ThinkTags>>,
    pub description: Option<String>,
}

/// How an alias's prompts are counted and judged (`count`, `tokenizer`, `media_tokens`,
/// `clamp_max_tokens`) against the alias's `context_window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardConfig {
    /// The counting strategy (the default resolved: local with a tokenizer, else estimate).
    pub count: CountKind,
    pub tokenizer: Option<TokenizerFiles>,
    pub media: MediaCosts,
    pub clamp_max_tokens: bool,
}

impl GuardConfig {
    /// The key and value to name when the counter of this guard cannot be built.
    pub fn counter_key(&self) -> (&'static str, String) {
        match &self.tokenizer {
            Some(t) if self.count != CountKind::Backend => {
                ("tokenizer", t.file.display().to_string())
            }
            _ => ("count", self.count.as_str().to_string()),
        }
    }
}
