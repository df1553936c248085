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

use super::call::Call;
use crate::config::AfterSpill;
use crate::error::ProxyError;
use crate::fleet::balance::{for_conversation, least_loaded, AffinityResult, Load};
use crate::fleet::breaker::{self, Tally};
use crate::fleet::health::BackendState;
use crate::fleet::load;
use crate::fleet::routes::FallbackReason;
use crate::fleet::slots::{Refused, SlotPermit};
use crate::fleet::work::{Job, Need};
use crate::live::alias::{LiveAlias, Replica};

/// The replica a request goes to, with its slot and its breaker's leave.
pub(crate) struct Chosen {
    pub(crate) replica: Arc<Replica>,
    /// Its place in the alias's replicas.
    pub(crate) index: usize,
    pub(crate) slot: SlotPermit,
    /// The attempt's word to the replica's breaker: its leave, then the breaker.
    pub(crate) tally: Tally,
    /// How long it waited for the slot.
    pub(crate) queued: Duration,
    /// Where its conversation was (an alias with replicas and a conversation key only).
    pub(crate) affinity: Option<AffinityResult>,
    /// Its work there, predicted (taken into the record when it answers).
    pub(crate) job: Option<Job>,
    /// The wait for its slot predicted when it queued (none where it took one at once).
    pub(crate) predicted_wait: Option<Duration>,
    /// The answers it asks for (`n`): llama-server runs each past the first on a slot of its
    /// own choice.
    pub(crate) choices: u32,
}

/// Why no replica was chosen: `None` when every usable one was tried already.
pub(crate) type Refusal = Option<(FallbackReason, ProxyError)>;

/// Choose a replica of `alias` that `tried` does not name, for the call that needs `need`.
pub(crate) async fn choose(
    call: &Call<'_>,
    alias: &LiveAlias,
    need: Need,
    tried: &mut Vec<usize>,
) -> Result<Chosen, Refusal> {
    let mut choice = Choice::new(call, alias, need);
    let mut queued = Duration::ZERO;
    // A replica that looks full only by other processes' requests is read again once before
    // its conversation is moved off it.
    let mut reread = choice.max_age.is_some();
    loop {
        let mut now = breaker::now();
        let picked = choice.pick(tried, now);
        let Some(mut index) = picked.index else {
            return Err(picked.why.map(|w| (w, choice.refusal(w, now))));
        };
        let mut waited: Option<(SlotPermit, Job)> = None;
        let moving = picked.first.filter(|f| *f != index);
        let spill = moving.zip(choice.spill_wait.take());
        // Not for a replica its own conversation mostly holds: that wait would be for itself.
        if let Some((first, wait)) = spill.filter(|(f, _)| !choice.held_mostly(*f)) {
            let got = choice.wait(&alias.replicas[first], wait, &mut queued).await;
            now = breaker::now();
            // Still full: on to the next in its order, without waiting again.
            let Ok(permit) = got else { continue };
            (index, waited) = (first, Some(permit));
        } else if moving.is_some() && reread {
            reread = false;
            // Moving the conversation costs its cache: its replicas are read again first, as
            // readings lag (one may still count the conversation's own last turn, sent through
            // another process, or miss requests others sent since).
            choice.read_again().await;
            continue;
        }
        let replica = &alias.replicas[index];
        // Another request may have taken a half-open breaker's one trial first.
        let Some(pass) = replica.breaker.enter(now) else {
            tried.push(index);
            continue;
        };
        let (slot, job) = match waited {
            Some(got) => got,
            None => choice.queue(replica, &mut queued).await.map_err(Some)?,
        };
        return Ok(Chosen {
            replica: Arc::clone(replica),
            index,
            slot,
            tally: Tally::new(Some(pass), Some(Arc::clone(&replica.breaker))),
            queued,
            affinity: choice.key.map(|key| choice.remember(key, replica)),
            job: Some(job),
            predicted_wait: choice.predicted(),
            choices: need.choices,
        });
    }
}

/// One choice of a replica of an alias for a call, and how it reads the replicas and waits,
/// from the config.
struct Choice<'c, 'a> {
    call: &'c Call<'a>,
    alias: &'c LiveAlias,
    /// The conversation's key, where the alias has a choice of replicas.
    key: Option<u64>,
    /// How long a later turn waits for its first replica (once).
    spill_wait: Option<Duration>,
    /// How old a backend's load reading may be and still count (where there is a choice).
    max_age: Option<Duration>,
    need: Need,
    /// The wait predicted where the request last queued.
    predicted: Option<Duration>,
}

/// The replica picked, the first of the conversation's order (when it has one), and why the
/// replicas passed over could not take the request.
struct Picked {
    index: Option<usize>,
    first: Option<usize>,
    why: Option<FallbackReason>,
}

impl<'c, 'a> Choice<'c, 'a> {
    fn new(call: &'c Call<'a>, alias: &'c LiveAlias, need: Need) -> Choice<'c, 'a> {
        let server = &call.snap.config.server;
        let choice = alias.replicas.len() > 1;
        let conversation = call.conversation.filter(|_| choice);
        Choice {
            call,
            alias,
            key: conversation.map(|c| c.key),
            spill_wait: conversation
                .filter(|c| c.later)
                .map(|_| server.spill_wait.min(server.queue_timeout))
                .filter(|w| !w.is_zero()),
            max_age: server.load_interval.filter(|_| choice).map(load::max_age),
            need,
            predicted: None,
        }
    }

    /// Replica `i`'s load at `now` (`None`: it has no load to count), other processes'
    /// requests counted as read no longer than `max_age` ago; else why it cannot take a
    /// request.
    fn load(&self, i: usize, now: Instant) -> Result<Load, FallbackReason> {
        let replica = &self.alias.replicas[i];
        match replica.health.state() {
            Some(BackendState::down) => return Err(FallbackReason::down),
            Some(BackendState::loading) => return Err(FallbackReason::loading),
            _ => {}
        }
        if !replica.breaker.usable(now) {
            return Err(FallbackReason::breaker_open);
        }
        let s = &replica.slots;
        let others = self
            .max_age
            .and_then(|age| replica.health.reported.others(now, age));
        let busy = load::combined(s.busy(), others);
        Ok(Load {
            free: s.slots().saturating_sub(busy),
            load: busy + s.waiting(),
        })
    }

    /// The replica for the request, of those `tried` does not name: with a conversation key
    /// (only where there is a choice), where this process sent it last under
    /// `after_spill = "stay"`, else the first with room in its own order; without a key the
    /// least loaded.
    fn pick(&self, tried: &[usize], now: Instant) -> Picked {
        let mut why: Option<FallbackReason> = None;
        let mut load = |i: usize| {
            if tried.contains(&i) {
                return None;
            }
            self.load(i, now)
                .map_err(|w| why = Some(most_telling(why, w)))
                .ok()
        };
        let n = self.alias.replicas.len();
        let snap = self.call.snap;
        let stay = self
            .key
            .filter(|_| snap.config.server.after_spill == AfterSpill::Stay)
            .and_then(|k| self.where_sent(k, &mut load));
        let (index, first) = match (stay, self.key) {
            (Some(i), _) => (Some(i), None),
            (None, Some(k)) => {
                let p = for_conversation(k, n, |i| {
                    let r = &self.alias.replicas[i];
                    load(i).map(|load| crate::fleet::balance::Replica {
                        name: r.name(),
                        weight: r.backend.slots.get(),
                        load,
                    })
                });
                (p.as_ref().map(|p| p.index), p.map(|p| p.first))
            }
            (None, None) => (least_loaded(n, snap.next_turn(), load), None),
        };
        Picked { index, first, why }
    }

    /// The replica this process last sent conversation `key` to, when it is usable, untried
    /// and has a free slot.
    fn where_sent(&self, key: u64, load: &mut impl FnMut(usize) -> Option<Load>) -> Option<usize> {
        let on = self.call.snap.affinity().get(key)?;
        let i = self.alias.replicas.iter().position(|r| *r.name() == *on)?;
        load(i).filter(|l| l.free > 0).map(|_| i)
    }

    /// The wait predicted where the request last queued.
    fn predicted(&self) -> Option<Duration> {
        self.predicted
    }

    /// Whether more than half the slots of replica `i` are held by requests of the
    /// conversation (this process's count).
    fn held_mostly(&self, i: usize) -> bool {
        let s = &self.alias.replicas[i].slots;
        self.key.is_some_and(|k| 2 * s.held_by(k) > s.slots())
    }

    /// Conversation `key` goes to `replica`: whether that is where this process sent it last
    /// (counted), remembered for next time.
    fn remember(&self, key: u64, replica: &Replica) -> AffinityResult {
        let affinity = self.call.snap.affinity();
        let result = match affinity.get(key) {
            Some(on) if *on == *replica.name() => AffinityResult::hit,
            Some(_) => AffinityResult::moved,
            None => AffinityResult::new,
        };
        self.alias.metrics.affinity(result);
        if result != AffinityResult::hit {
            affinity.set(key, replica.name());
        }
        result
    }

    /// Read the load of the alias's replicas now, within the load interval and
    /// [`REREAD_WAIT`], as the load loop does (a backend that does not answer in time leaves
    /// this process its own count).
    async fn read_again(&self) {
        let Some(interval) = self.call.snap.config.server.load_interval else {
            return;
        };
        let wait = interval.min(REREAD_WAIT);
        let state = self.call.state;
        let reads = self
            .alias
            .replicas
            .iter()
            .map(|r| crate::live::probes::read_load(state, &r.backend, Some(&*r.slots), wait));
        futures_util::future::join_all(reads).await;
    }

    /// What the client is told when no replica of the alias can take its request, for `why`.
    fn refusal(&self, why: FallbackReason, now: Instant) -> ProxyError {
        let alias = self.alias;
        match why {
            FallbackReason::loading => {
                let replica = alias
                    .replicas
                    .iter()
                    .find(|r| r.health.state() == Some(BackendState::loading))
                    .unwrap_or(alias.first());
                ProxyError::UpstreamLoading {
                    backend: replica.name().to_string(),
                    retry_after: 5,
                }
            }
            FallbackReason::breaker_open => {
                let soonest = alias.replicas.iter().map(|r| r.breaker.retry_in(now)).min();
                ProxyError::NoBackend {
                    alias: alias.name().to_string(),
                    why: "circuit breaker open",
                    retry_after: soonest.unwrap_or_default().as_secs_f64().ceil().max(1.0) as u64,
                }
            }
            _ => ProxyError::NoBackend {
                alias: alias.name().to_string(),
                why: "down",
                retry_after: self
                    .call
                    .snap
                    .config
                    .server
                    .health_interval
                    .as_secs()
                    .max(1),
            },
        }
    }

    /// A slot of `replica`, waited for in its queue up to the queue timeout; the wait added
    /// to `queued`.
    async fn queue(
        &mut self,
        replica: &Replica,
        queued: &mut Duration,
    ) -> Result<(SlotPermit, Job), Failing> {
        let timeout = self.call.snap.config.server.queue_timeout;
        self.wait(replica, timeout, queued).await
    }

    /// [`Self::slot`] within `timeout`, the wait added to `queued`.
    async fn wait(
        &mut self,
        replica: &Replica,
        timeout: Duration,
        queued: &mut Duration,
    ) -> Result<(SlotPermit, Job), Failing> {
        let since = breaker::now();
        let got = self.slot(replica, timeout).await;
        *queued += breaker::now() - since;
        got
    }

    /// A slot of `replica` now, or a place in its queue for up to `timeout` (429 when full,
    /// 503 when the wait runs out), in the order of the call's ticket carrying its work there.
    async fn slot(
        &mut self,
        replica: &Replica,
        timeout: Duration,
    ) -> Result<(SlotPermit, Job), Failing> {
        let (slots, place) = (&replica.slots, &self.call.place);
        let cost = (&replica.slots, &replica.health.cost);
        let mut job = Job::predict(cost, &self.call.state.outputs, &place.ticket, self.need);
        let ticket = job.ticket(place.ticket);
        if let Some(p) = slots.try_acquire_for(ticket) {
            job.granted(p.index());
            return Ok((p, job));
        }
        let predicted = slots.predicted_wait(&ticket);
        self.predicted = Some(predicted);
        self.alias.metrics.predicted_wait(predicted.as_secs_f64());
        if let Some(limit) = place.max_wait.filter(|l| predicted > *l) {
            let e = ProxyError::WaitTooLong {
                alias: self.alias.name().to_string(),
                predicted,
                limit,
                retry_after: predicted.as_secs_f64().ceil().max(1.0) as u64,
            };
            return Err((FallbackReason::queue_timeout, e));
        }
        let _queued = place.queued();
        let got = slots.acquire(timeout, ticket, &*self.alias.metrics).await;
        got.map(|p| {
            job.granted(p.index());
            (p, job)
        })
        .map_err(|refused| {
            let reason = match refused {
                Refused::Full { .. } => FallbackReason::overloaded,
                Refused::TimedOut(_) => FallbackReason::queue_timeout,
            };
            (reason, refused.error(self.alias.name()))
        })
    }
}

/// Why a replica gave no slot: the fallback's reason and the client's error.
type Failing = (FallbackReason, ProxyError);

/// Of two reasons no replica could take a request, the one that tells the client most:
/// loading (it keeps its model_loading answer), then an open breaker over a backend down.
fn most_telling(why: Option<FallbackReason>, w: FallbackReason) -> FallbackReason {
    match (why, w) {
        (Some(FallbackReason::loading), _) => FallbackReason::loading,
        (Some(FallbackReason::breaker_open), FallbackReason::down) => FallbackReason::breaker_open,
        _ => w,
    }
}

/// The longest a request waits for its replicas' load read again.
const REREAD_WAIT: Duration = Duration::from_millis(250);
