//! The integration tests: one binary, each file a module. Each test starts the real proxy on
//! 127.0.0.1:0 (`common`) in front of simulated or real backends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../fixtures/conversation_gen.rs"]
mod conversation_gen;
mod webdriver;

mod affinity;
mod api_tokens;
mod apis;
mod apis_guard;
mod backend_figures;
mod batch_faults;
mod batch_lines;
mod batches;
mod budgets;
mod cache_privacy;
mod charges;
mod cli;
mod client_limits;
mod clients;
mod config_docs;
mod connections;
mod count_limits;
mod early_answer;
mod fleet;
mod gpu_time;
mod guard;
mod ledger;
mod live;
mod observe;
mod openai_client;
mod pipeline;
mod real_llama;
mod real_llama_batches;
mod real_llama_privacy;
mod reasoning;
mod replicas;
mod shape;
mod shared_state;
mod sim;
mod sim_gpu;
mod status_page;
mod strictness;
mod timeouts;
mod tls;
mod tokens;
mod tracing;
mod translation;
mod wire;
