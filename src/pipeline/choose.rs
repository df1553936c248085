//! Choose: a replica of the alias that can take the request (not down, not loading, breaker not
//! open) — the first of its conversation's own order with a free slot, else the least loaded —
//! its breaker's leave and its slot, or a place in its bounded queue (429 when full, 503 when
//! the wait runs out). A replica's load is this process's own requests on it and the other
//! processes' as the backend last reported them. A later turn whose first replica is full
//! waits for it up to `server.spill_wait_ms` (in this process's queue when its own requests
//! fill it, in the backend's when others' do) before it moves, as a move costs its cached
//! prefix — unless more than half that replica's slots are held by its own conversation's
//! requests (a flood of one session waits for none but itself: it spills at once); before
//! any other conversation is moved off its first replica, the replicas are read again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clients::Caller;
use crate::config::{AfterSpill, Alias, Backend};
use crate::error::ProxyError;
use crate::fleet::balance::{
    for_conversation, least_loaded, AffinityResult, Conversation, Load, Replica,
};
use crate::fleet::breaker::{Breaker, Pass};
use crate::fleet::health::BackendState;
use crate::fleet::load;
use crate::fleet::routes::FallbackReason;
use crate::fleet::slots::{Refused, SlotPermit, Slots};
use crate::fleet::ticket::Ticket;
use crate::live::{AppState, Snapshot};

/// The replica a request goes to, with its slot and its breaker's leave.
pub struct Chosen {
    pub backend: Arc<Backend>,
    /// Its place in the alias's `backends`.
    pub index: usize,
    pub slot: Option<SlotPermit>,
    pub pass: Option<Pass>,
    pub breaker: Option<Arc<Breaker>>,
    /// How long it waited for the slot.
    pub queued: std::time::Duration,
    /// Where its conversation was (an alias with replicas and a conversation key only).
    pub affinity: Option<AffinityResult>,
}

/// Why no replica was chosen: `None` when every usable one was tried already.
pub type Refusal = Option<(FallbackReason, ProxyError)>;

/// Why one replica cannot take a request now; else its breaker.
fn unusable<'s>(
    state: &AppState,
    snap: &'s Snapshot,
    b: &Backend,
    now: Instant,
) -> Result<Option<&'s Arc<Breaker>>, FallbackReason> {
    match state.health.get(&b.name) {
        Some(BackendState::down) => return Err(FallbackReason::down),
        Some(BackendState::loading) => return Err(FallbackReason::loading),
        _ => {}
    }
    let breaker = snap.breaker(&b.name);
    match breaker {
        Some(br) if !br.usable(now) => Err(FallbackReason::breaker_open),
        _ => Ok(breaker),
    }
}

/// A replica's breaker and slots, as the snapshot holds them.
type Handles<'s> = (Option<&'s Arc<Breaker>>, Option<&'s Arc<Slots>>);

/// The handles of the first few replicas, as looked up for their load (so the chosen one's
/// are not looked up again).
const KEPT: usize = 4;

/// Where a request stands in a queue: its ticket, and its client (for the client's queue
/// figures).
pub struct Place {
    pub ticket: Ticket,
    pub caller: Option<Caller>,
}

/// Choose a replica of `alias` that `tried` does not name, for `conversation`.
pub async fn choose(
    state: &AppState,
    snap: &Snapshot,
    alias: &Alias,
    tried: &mut Vec<usize>,
    conversation: Option<Conversation>,
    place: &Place,
) -> Result<Chosen, Refusal> {
    let mut now = Instant::now();
    let Rules {
        key,
        mut spill_wait,
        max_age,
    } = Rules::new(snap, alias, conversation);
    let mut queued = Duration::ZERO;
    // A replica that looks full only by other processes' requests is read again once before
    // its conversation is moved off it.
    let mut reread = max_age.is_some();
    loop {
        let mut why: Option<FallbackReason> = None;
        let mut kept: [Option<Handles<'_>>; KEPT] = [None; KEPT];
        let mut load = |i: usize| {
            if tried.contains(&i) {
                return None;
            }
            match replica_load(state, snap, &alias.backends[i], now, max_age) {
                Ok((handles, load)) => {
                    if let Some(k) = kept.get_mut(i) {
                        *k = Some(handles);
                    }
                    load
                }
                Err(w) => {
                    why = Some(most_telling(why, w));
                    None
                }
            }
        };
        let (index, first) = pick(snap, alias, key, &mut load);
        let Some(mut index) = index else {
            return Err(why.map(|w| (w, refusal(state, snap, alias, w, now))));
        };
        let mut waited = None;
        let spill = first.filter(|f| *f != index).zip(spill_wait.take());
        let spill = spill.map(|(f, wait)| (f, wait, handles(snap, alias, &kept, f).1));
        // Not for a replica its own conversation mostly holds: that wait would be for itself.
        if let Some((f, wait, slots)) = spill.filter(|s| !held_mostly(s.2, key)) {
            let since = Instant::now();
            let got = slot(snap, alias, slots, place, wait).await;
            now = Instant::now();
            queued += now - since;
            // Still full: on to the next in its order, without waiting again.
            let Ok(permit) = got else { continue };
            (index, waited) = (f, Some(permit));
        } else if first.is_some_and(|f| f != index) && reread {
            reread = false;
            // Moving the conversation costs its cache: its replicas are read again first, as
            // readings lag (one may still count the conversation's own last turn, sent through
            // another process, or miss requests others sent since).
            read_again(state, snap, alias).await;
            continue;
        }
        let backend = &alias.backends[index];
        let (breaker, slots) = handles(snap, alias, &kept, index);
        // Another request may have taken a half-open breaker's one trial first.
        let Some(pass) = enter(breaker, now) else {
            tried.push(index);
            continue;
        };
        let breaker = breaker.cloned();
        let slot = match waited {
            Some(permit) => permit,
            None => {
                let since = Instant::now();
                let timeout = snap.config.server.queue_timeout;
                let got = slot(snap, alias, slots, place, timeout).await;
                queued += since.elapsed();
                got.map_err(Some)?
            }
        };
        return Ok(Chosen {
            backend: Arc::clone(backend),
            index,
            slot,
            pass,
            breaker,
            queued,
            affinity: key.map(|key| remember(snap, alias, key, &backend.name)),
        });
    }
}

/// How one choice for a request reads its alias's replicas and waits, from the config.
struct Rules {
    /// The conversation's key, where the alias has a choice of replicas.
    key: Option<u64>,
    /// How long a later turn waits for its first replica (once).
    spill_wait: Option<Duration>,
    /// How old a backend's load reading may be and still count (where there is a choice).
    max_age: Option<Duration>,
}

impl Rules {
    fn new(snap: &Snapshot, alias: &Alias, conversation: Option<Conversation>) -> Rules {
        let server = &snap.config.server;
        let conversation = conversation.filter(|_| alias.backends.len() > 1);
        Rules {
            key: conversation.map(|c| c.key),
            spill_wait: conversation
                .filter(|c| c.later)
                .map(|_| server.spill_wait.min(server.queue_timeout))
                .filter(|w| !w.is_zero()),
            max_age: server
                .load_interval
                .filter(|_| alias.backends.len() > 1)
                .map(load::max_age),
        }
    }
}

/// Whether more than half the slots of a replica with `slots` are held by requests of the
/// conversation `key` (this process's count).
fn held_mostly(slots: Option<&Arc<Slots>>, key: Option<u64>) -> bool {
    match (slots, key) {
        (Some(s), Some(k)) => 2 * s.held_by(k) > s.slots(),
        _ => false,
    }
}

/// A breaker's leave for one request (`Some(None)` with no breaker); `None` when its half-open
/// trial is taken.
fn enter(breaker: Option<&Arc<Breaker>>, now: Instant) -> Option<Option<Pass>> {
    match breaker {
        Some(br) => br.enter(now).map(Some),
        None => Some(None),
    }
}

/// Replica `b`'s handles and its load at `now` (`None`: it has no slots to count), other
/// processes' requests counted as read no longer than `max_age` ago; else why it cannot take a
/// request.
fn replica_load<'s>(
    state: &AppState,
    snap: &'s Snapshot,
    b: &Backend,
    now: Instant,
    max_age: Option<Duration>,
) -> Result<(Handles<'s>, Option<Load>), FallbackReason> {
    let breaker = unusable(state, snap, b, now)?;
    let slots = snap.slots(&b.name);
    let load = slots.map(|s| {
        let others = max_age.and_then(|age| state.health.reported().others(&b.name, now, age));
        let busy = load::combined(s.busy(), others);
        Load {
            free: s.slots().saturating_sub(busy),
            load: busy + s.waiting(),
        }
    });
    Ok(((breaker, slots), load))
}

/// Replica `i`'s handles: as `kept` holds them from its load, else looked up.
fn handles<'s>(
    snap: &'s Snapshot,
    alias: &Alias,
    kept: &[Option<Handles<'s>>],
    i: usize,
) -> Handles<'s> {
    kept.get(i).copied().flatten().unwrap_or_else(|| {
        let name = &alias.backends[i].name;
        (snap.breaker(name), snap.slots(name))
    })
}

/// Of two reasons no replica could take a request, the one that tells the client most:
/// loading (it keeps its model_loading answer), then an open breaker over a backend down.
fn most_telling(why: Option<FallbackReason>, w: FallbackReason) -> FallbackReason {
    match (why, w) {
        (Some(FallbackReason::loading), _) => FallbackReason::loading,
        (Some(FallbackReason::breaker_open), FallbackReason::down) => FallbackReason::breaker_open,
        _ => w,
    }
}

/// The replica for a request with conversation `key` (only where there is a choice): where
/// this process sent it last under `after_spill = "stay"`, else the first with room in its
/// own order; without a key the least loaded. Also the first of its order, when it has one.
fn pick(
    snap: &Snapshot,
    alias: &Alias,
    key: Option<u64>,
    load: &mut impl FnMut(usize) -> Option<Load>,
) -> (Option<usize>, Option<usize>) {
    let n = alias.backends.len();
    let stay = key
        .filter(|_| snap.config.server.after_spill == AfterSpill::Stay)
        .and_then(|k| where_sent(snap, alias, k, load));
    match (stay, key) {
        (Some(i), _) => (Some(i), None),
        (None, Some(k)) => {
            let p = for_conversation(k, n, |i| {
                let b = &alias.backends[i];
                load(i).map(|load| Replica {
                    name: &b.name,
                    weight: b.slots.get(),
                    load,
                })
            });
            (p.as_ref().map(|p| p.index), p.map(|p| p.first))
        }
        (None, None) => (least_loaded(n, snap.next_turn(), load), None),
    }
}

/// Conversation `key` goes to `backend`: whether that is where this process sent it last
/// (counted), remembered for next time.
fn remember(snap: &Snapshot, alias: &Alias, key: u64, backend: &str) -> AffinityResult {
    let result = match snap.affinity().get(key) {
        Some(on) if *on == *backend => AffinityResult::hit,
        Some(_) => AffinityResult::moved,
        None => AffinityResult::new,
    };
    snap.metrics(Some(&alias.name)).affinity(result);
    if result != AffinityResult::hit {
        snap.affinity().set(key, backend);
    }
    result
}

/// The longest a request waits for its replicas' load read again.
const REREAD_WAIT: Duration = Duration::from_millis(250);

/// Read the load of `alias`'s replicas now, within the load interval and [`REREAD_WAIT`], as
/// the load loop does (a backend that does not answer in time leaves this process its own
/// count).
async fn read_again(state: &AppState, snap: &Snapshot, alias: &Alias) {
    let Some(interval) = snap.config.server.load_interval else {
        return;
    };
    let wait = interval.min(REREAD_WAIT);
    let reads = alias.backends.iter().map(|b| {
        let slots = snap.slots(&b.name).map(Arc::as_ref);
        crate::live::probes::read_load(state, b, slots, wait)
    });
    futures_util::future::join_all(reads).await;
}

/// The replica this process last sent conversation `key` to, when it is usable, untried and
/// has a free slot.
fn where_sent(
    snap: &Snapshot,
    alias: &Alias,
    key: u64,
    load: &mut impl FnMut(usize) -> Option<Load>,
) -> Option<usize> {
    let on = snap.affinity().get(key)?;
    let i = alias.backends.iter().position(|b| *b.name == *on)?;
    load(i).filter(|l| l.free > 0).map(|_| i)
}

/// What a client is told when no replica of `alias` can take its request, for `why`.
fn refusal(
    state: &AppState,
    snap: &Snapshot,
    alias: &Alias,
    why: FallbackReason,
    now: Instant,
) -> ProxyError {
    let server = &snap.config.server;
    match why {
        FallbackReason::loading => {
            let backend = alias
                .backends
                .iter()
                .find(|b| state.health.get(&b.name) == Some(BackendState::loading))
                .unwrap_or(&alias.backend);
            ProxyError::UpstreamLoading {
                backend: backend.name.clone(),
                retry_after: 5,
            }
        }
        FallbackReason::breaker_open => {
            let soonest = alias
                .backends
                .iter()
                .filter_map(|b| snap.breaker(&b.name))
                .map(|b| b.retry_in(now))
                .min()
                .unwrap_or_default();
            ProxyError::NoBackend {
                alias: alias.name.clone(),
                why: "circuit breaker open",
                retry_after: soonest.as_secs_f64().ceil().max(1.0) as u64,
            }
        }
        _ => ProxyError::NoBackend {
            alias: alias.name.clone(),
            why: "down",
            retry_after: server.health_interval.as_secs().max(1),
        },
    }
}

/// A slot of a replica with `slots` now, or a place in its queue for up to `timeout` (429 when
/// full, 503 when the wait runs out).
async fn slot(
    snap: &Snapshot,
    alias: &Alias,
    slots: Option<&Arc<Slots>>,
    place: &Place,
    timeout: Duration,
) -> Result<Option<SlotPermit>, (FallbackReason, ProxyError)> {
    let Some(slots) = slots else {
        return Ok(None);
    };
    if let Some(p) = slots.try_acquire_for(place.ticket.conversation) {
        return Ok(Some(p));
    }
    let m = snap.metrics(Some(&alias.name));
    let _queued = place.caller.as_ref().map(ClientQueued::enter);
    let got = slots.acquire(timeout, place.ticket, &**m).await;
    got.map(Some).map_err(|refused| {
        let reason = match refused {
            Refused::Full { .. } => FallbackReason::overloaded,
            Refused::TimedOut(_) => FallbackReason::queue_timeout,
        };
        (reason, refused.error(&alias.name))
    })
}

/// A client's request waiting for a slot: its queue gauge and wait, however the wait ends.
struct ClientQueued<'a> {
    caller: &'a Caller,
    since: Instant,
}

impl<'a> ClientQueued<'a> {
    fn enter(caller: &'a Caller) -> ClientQueued<'a> {
        caller.state.metrics.queued.inc();
        caller
            .state
            .queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ClientQueued {
            caller,
            since: Instant::now(),
        }
    }
}

impl Drop for ClientQueued<'_> {
    fn drop(&mut self) {
        let s = &self.caller.state;
        s.metrics.queued.dec();
        s.queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        s.metrics
            .queue_wait
            .observe(self.since.elapsed().as_secs_f64());
    }
}
