//! What the proxy tells about itself: metric families registered once, one record per request.

pub mod metrics;
pub mod record;
