//! Switchboard: an OpenAI-compatible reverse proxy and alias router for a self-hosted LLM fleet.
//!
//! Layers, each using only the ones listed after it: `http` (the surface) → `pipeline` (one
//! routed request, step by step) → `live` (the config snapshot in force) → `clients` →
//! `observe` (metrics, the request record) → `fleet` (routes, slots, health) → `guard` →
//! `tokens` → `batches` (the Batch API opened for a config) → `config` → `upstream` (the one
//! HTTP client, the `switchboard-upstream` crate) and the store (`ledger`, `budget`,
//! `calendar`, `kinds`, `db` and the Batch API's state: the `switchboard-store` crate) →
//! `wire` (one adapter per API) → `reasoning` → `runtime`
//! (one file per backend runtime) → `error`, `flavor`, `address`, `files`; below them all, the
//! JSON helpers' crate (`switchboard-json`). `.ci/module-cycles.py`
//! fails the build on a cycle, on `config` naming a new layer, and on `observe` naming
//! `tokens`.

pub(crate) use switchboard_upstream as upstream;
pub(crate) use switchboard_wire::{self as wire, echo, error, flavor, reasoning, runtime, words};

pub(crate) use switchboard_store::{budget, calendar};
pub use switchboard_store::{db, kinds, ledger};

pub(crate) mod address;
pub(crate) mod batches;
pub(crate) mod clients;
pub mod config;
pub mod export;
pub mod files;
pub mod fleet;
pub mod guard;
pub mod http;
pub mod live;
pub(crate) use switchboard_sync as lock;
pub mod observe;
pub mod path;
pub mod pipeline;
pub(crate) mod seconds;
pub mod shared;
pub mod tokens;
