//! Switchboard: an OpenAI-compatible reverse proxy and alias router for a self-hosted LLM fleet.

pub mod error;
pub mod flavor;
pub mod reasoning;
pub mod sim;
pub mod tokens;
pub mod config;
pub mod routes;
pub mod openai;
pub mod metrics;
pub mod slots;
pub mod health;
pub mod state;
pub mod exchange;
pub mod proxy;
pub mod stream;
pub mod api;
pub mod server;
pub mod reload;
