//! The integration tests that measure or change the whole process — its heap (counted by this
//! binary's allocator), its resident memory, its descriptor limit — in a binary of their own,
//! one test at a time ([`ONE_AT_A_TIME`]): no other test's allocations, memory or sockets are
//! in what they measure, and none is starved of what they take away.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The harness of `tests/it`, of which these tests use a part.
#[allow(dead_code)]
#[path = "../it/common/mod.rs"]
mod common;

mod batch_line_memory;
mod bounded;
mod descriptors;

/// Taken by every test here for its whole run.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
