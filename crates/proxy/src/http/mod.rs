//! The HTTP surface: workers and the accept loop, the Router, intake, the fixed routes' handlers,
//! the status page.

pub mod batches;
pub(crate) mod client_io;
pub(crate) mod count;
pub(crate) mod handlers;
pub(crate) mod intake;
pub(crate) mod routed;
pub mod router;
pub mod server;
pub mod status;
pub(crate) mod upload;
pub(crate) mod usage;
pub mod workers;
