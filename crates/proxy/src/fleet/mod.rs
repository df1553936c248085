//! The fleet as the proxy sees it: the alias table, each backend's slots and queue, its health,
//! its circuit breaker, the load it reports, and how a replica is chosen.

pub mod balance;
pub mod breaker;
pub mod conversation;
pub mod cost;
pub mod discovery;
pub mod drift;
pub mod health;
pub mod lease;
pub mod load;
pub(crate) mod named;
pub(crate) mod reported;
pub mod routes;
pub mod slots;
pub mod ticket;
pub mod timeline;
pub mod work;
