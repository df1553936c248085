//! What the proxy tells about itself: metric families registered once, one record per request,
//! the rolling five-minute window the status page shows.

pub mod metrics;
pub mod record;
pub(crate) mod trace;
pub mod window;
