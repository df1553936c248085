//! A client's token buckets kept in the store, one budget for every process: reserved and
//! settled atomically there, their levels handed back for the caller to judge and show.

use std::sync::Arc;
use std::time::Duration;

use super::{scripts, Op, Store};

/// One bucket: its capacity and window (a capacity of 0: no such limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub capacity: u64,
    pub window: Duration,
}

/// The two buckets of a client: requests and tokens a minute.
pub(crate) type Specs = [Option<Spec>; 2];

/// What the store answered to a reservation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Levels {
    /// The reservation was taken.
    pub took: bool,
    /// Each bucket's level after it (requests, tokens).
    pub levels: [Option<f64>; 2],
}

fn args(specs: &Specs) -> Vec<i64> {
    specs
        .iter()
        .flat_map(|s| match s {
            Some(s) => [s.capacity as i64, s.window.as_millis() as i64],
            None => [0, 1],
        })
        .collect()
}

impl Store {
    /// Take one request and `tokens` from client `key`'s buckets, all or nothing; `None`:
    /// the store is unreachable (count on your own).
    pub async fn reserve(&self, key: &Arc<str>, specs: &Specs, tokens: u64) -> Option<Levels> {
        let args = args(specs);
        let out = self
            .call(|mut c| async move {
                let mut inv = scripts::BUCKETS.prepare_invoke();
                inv.key(key.as_ref()).arg("reserve").arg(tokens);
                for a in args {
                    inv.arg(a);
                }
                inv.invoke_async::<(i64, String, String)>(&mut c).await
            })
            .await?;
        let level = |s: &str| s.parse::<f64>().ok();
        Some(Levels {
            took: out.0 == 1,
            levels: [level(&out.1), level(&out.2)],
        })
    }

    /// Give `back` tokens to client `key`'s token buckets (take them, when negative), off
    /// the request's path.
    pub fn settle(&self, key: &Arc<str>, specs: &Specs, back: i64) {
        let mut all = vec![back];
        all.extend(args(specs));
        self.send(Op::Settle {
            key: Arc::clone(key),
            args: all,
        });
    }
}
