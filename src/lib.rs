//! Switchboard: an OpenAI-compatible reverse proxy and alias router for a self-hosted LLM fleet.

pub mod alloc;
pub mod api;
pub mod config;
pub mod demo;
pub mod error;
pub mod exchange;
pub mod flavor;
pub mod guard;
pub mod health;
pub mod hop;
mod json_scan;
pub mod metrics;
pub mod openai;
pub mod path;
pub mod proxy;
pub mod reasoning;
pub mod reload;
pub mod routes;
pub mod server;
pub mod sim;
pub mod slots;
pub mod state;
pub mod stream;
pub mod tokens;
pub mod upstream;
pub mod usage;
pub mod workers;
