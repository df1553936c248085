//! The fleet as the proxy sees it: the alias table, each backend's slots and queue, its health.

pub mod discovery;
pub mod drift;
pub mod health;
pub mod routes;
pub mod slots;
