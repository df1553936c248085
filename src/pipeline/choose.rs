//! Choose: a slot of the alias's backend, or a place in its bounded queue (429 when full).

use crate::config::Alias;
use crate::error::ProxyError;
use crate::fleet::slots::SlotPermit;
use crate::live::Snapshot;

/// Wait for a slot of `alias`'s backend; held until the answer (or stream) ends.
pub async fn slot(snap: &Snapshot, alias: &Alias) -> Result<Option<SlotPermit>, ProxyError> {
    let Some(slots) = snap.slots(&alias.backend.name) else {
        return Ok(None);
    };
    let m = snap.metrics(Some(&alias.name));
    let timeout = snap.config.server.queue_timeout;
    slots.acquire(&alias.name, timeout, &**m).await.map(Some)
}
