//! Switchboard: an OpenAI-compatible reverse proxy and alias router for a self-hosted LLM fleet.
//!
//! Layers, each using only the ones listed after it: `http` (the surface) → `pipeline` (one
//! routed request, step by step) → `live` (the config snapshot in force) → `clients` →
//! `observe` (metrics, the request record) → `ledger` (usage rows in a database) → `fleet`
//! (routes, slots, health) → `upstream` (the one HTTP client) → `guard` → `tokens` → `config`
//! → `wire` (one adapter per API) → `reasoning` → `runtime` (one file per backend runtime) →
//! `error`, `flavor`, `address`, `files`, `json_scan`, `json_walk`. `.ci/module-cycles.py`
//! fails the build on a cycle, on `config` naming a new layer, and on `observe` naming
//! `tokens`.

pub mod address;
pub mod alloc;
pub mod batches;
pub mod budget;
pub mod calendar;
pub mod clients;
pub mod config;
pub mod demo;
pub mod echo;
pub mod envelope;
pub mod error;
pub mod export;
pub mod files;
pub mod flavor;
pub mod fleet;
pub mod guard;
pub mod http;
pub mod json_depth;
mod json_key;
mod json_number;
mod json_scan;
mod json_walk;
pub mod kinds;
pub mod ledger;
pub mod live;
pub mod observe;
pub mod path;
pub mod pipeline;
pub mod reasoning;
pub mod runtime;
pub mod seconds;
pub mod shared;
pub mod sim;
pub mod tokens;
pub mod upstream;
pub mod utf8;
pub mod wire;
pub mod words;
