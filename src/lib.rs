//! Switchboard: an OpenAI-compatible reverse proxy and alias router for a self-hosted LLM fleet.

pub mod error;
pub mod flavor;
pub mod guard;
pub mod reasoning;
pub mod sim;
pub mod tokens;
