//! The HTTP surface: workers and the accept loop, the Router, intake, the fixed routes' handlers,
//! the status page.

pub mod batches;
pub mod client_io;
pub mod count;
pub mod handlers;
pub mod intake;
pub mod routed;
pub mod router;
pub mod server;
pub mod status;
pub mod upload;
pub mod usage;
pub mod workers;
