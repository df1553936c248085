//! Fair share of one backend's GPU time among its clients: start-time fair queuing over work.
//! Each client has a finish tag, the GPU-seconds it was given as the queue counts them; a
//! request's start tag is its client's finish tag, or the queue's virtual time when that is
//! later (a client that was away comes back at the present, with no credit saved up). The
//! waiting client with the least start tag goes next; a grant moves the virtual time to the
//! least start tag of those it served and those still waiting (a grant out of the fair order,
//! to a conversation's own slot, does not move the present past the clients it went ahead of)
//! and adds the request's predicted work to its client's tag; the measured work replaces the
//! prediction when the request ends.

/// The tags of one backend's clients.
#[derive(Debug, Default)]
pub(super) struct Fair {
    /// (client, finish tag in GPU-seconds).
    tags: Vec<(u64, f64)>,
    /// The least start tag of the request last granted and those then waiting (never falls).
    virtual_time: f64,
}

/// Tags past this many are swept of those at or below the virtual time (they start there).
const SWEEP_AT: usize = 64;

impl Fair {
    fn tag(&self, client: u64) -> Option<&f64> {
        self.tags.iter().find(|(c, _)| *c == client).map(|(_, t)| t)
    }

    /// The start tag a request of `client` would get now.
    pub(crate) fn start(&self, client: u64) -> f64 {
        self.tag(client)
            .copied()
            .unwrap_or(f64::MIN)
            .max(self.virtual_time)
    }

    /// A request of `client` predicted at `work` GPU-seconds was given a slot; `waiting`: the
    /// least start tag of the requests still waiting (infinite when none wait).
    pub(crate) fn granted(&mut self, client: u64, work: f64, waiting: f64) {
        let start = self.start(client);
        self.virtual_time = self.virtual_time.max(start.min(waiting));
        self.set(client, start + work.max(0.0));
        if self.tags.len() > SWEEP_AT {
            let v = self.virtual_time;
            self.tags.retain(|(_, t)| *t > v);
        }
    }

    /// A request of `client` granted at `predicted` took `measured` GPU-seconds.
    pub(crate) fn settle(&mut self, client: u64, predicted: f64, measured: f64) {
        let at = self.tag(client).copied().unwrap_or(self.virtual_time);
        self.set(client, at + measured.max(0.0) - predicted.max(0.0));
    }

    fn set(&mut self, client: u64, tag: f64) {
        match self.tags.iter_mut().find(|(c, _)| *c == client) {
            Some((_, t)) => *t = tag,
            None => self.tags.push((client, tag)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_given_more_work_starts_later() {
        let mut f = Fair::default();
        assert_eq!(f.start(1), f.start(2));
        f.granted(1, 12.0, f64::INFINITY);
        f.granted(2, 1.0, f64::INFINITY);
        assert!(f.start(2) < f.start(1));
        // Ten short turns of client 2 catch up with one compaction of client 1.
        for _ in 0..10 {
            f.granted(2, 1.0, f64::INFINITY);
        }
        assert!((f.start(2) - 11.0).abs() < 1e-9, "{}", f.start(2));
        assert!((f.start(1) - 12.0).abs() < 1e-9);
    }

    #[test]
    fn the_measure_replaces_the_prediction() {
        let mut f = Fair::default();
        f.granted(1, 10.0, f64::INFINITY);
        f.settle(1, 10.0, 2.0);
        f.granted(2, 3.0, f64::INFINITY);
        assert!(f.start(1) < f.start(2));
    }

    #[test]
    fn a_client_coming_back_has_no_credit_saved() {
        let mut f = Fair::default();
        f.granted(1, 1.0, f64::INFINITY);
        for _ in 0..50 {
            f.granted(2, 1.0, f64::INFINITY);
        }
        // Client 1 was away: it starts at the virtual time, not 49 seconds ahead of 2.
        assert_eq!(f.start(1), f.virtual_time);
        assert!(f.start(2) - f.start(1) <= 1.0 + 1e-9);
    }

    #[test]
    fn a_grant_out_of_order_keeps_the_present_at_those_waiting() {
        let mut f = Fair::default();
        f.granted(2, 1.0, f64::INFINITY);
        // Client 1 runs ahead on its own slot, three times, while client 2 waits at 1.0.
        for _ in 0..3 {
            let waiting = f.start(2);
            f.granted(1, 5.0, waiting);
        }
        assert!((f.start(2) - 1.0).abs() < 1e-9, "{}", f.start(2));
        assert!((f.start(1) - 15.0).abs() < 1e-9, "{}", f.start(1));
    }
}
