//! Deadlines of an answer's body: the idle time allowed between two pieces (two events of a
//! stream) and the total time of the exchange. One timer per body, made the first time the
//! body has to wait (a whole answer read at once never makes one) and moved only when it
//! fires; the clock is read when the body waits, not per piece.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

use crate::upstream::BodyStream;
use crate::upstream::BoxError;

/// The body error of a deadline that passed.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub(crate) enum Expired {
    #[error("no data for {0:?} (the idle limit)")]
    Idle(Duration),
    #[error("the exchange took longer than {0:?} (the total limit)")]
    Total(Duration),
}

impl Expired {
    /// The deadline error behind a body error, if it is one.
    pub(crate) fn of(e: &BoxError) -> Option<Expired> {
        e.downcast_ref::<Expired>().copied()
    }

    /// The limit that passed.
    pub(crate) fn limit(self) -> Duration {
        match self {
            Expired::Idle(d) | Expired::Total(d) => d,
        }
    }
}

struct Bounded {
    inner: BodyStream,
    idle: Duration,
    total: Duration,
    /// When the exchange must be over.
    end: Instant,
    /// When the body last waited after a piece (or was made): idle time counts from here.
    last: Instant,
    /// A piece came since `last` was read.
    moved: bool,
    timer: Option<Pin<Box<Sleep>>>,
    done: bool,
}

/// `body` ended with [`Expired`] when it is idle for `idle`, or at `started + total`.
pub fn bounded(
    body: BodyStream,
    idle: Duration,
    started: std::time::Instant,
    total: Duration,
) -> BodyStream {
    Bounded {
        inner: body,
        idle,
        total,
        end: Instant::from_std(started) + total,
        last: Instant::now(),
        moved: false,
        timer: None,
        done: false,
    }
    .boxed()
}

impl Stream for Bounded {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(piece))) => {
                this.moved = true;
                return Poll::Ready(Some(Ok(piece)));
            }
            Poll::Ready(other) => {
                this.done = other.is_none();
                return Poll::Ready(other);
            }
            Poll::Pending => {}
        }
        // Waiting starts now: the last piece came just before (it was handed on, and the
        // body polled again, without waiting).
        if std::mem::take(&mut this.moved) {
            this.last = Instant::now();
        }
        let (last, idle, end) = (this.last, this.idle, this.end);
        // The timer is where it was set; pieces since then only moved `last`.
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until((last + idle).min(end))));
        while timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let due = (this.last + this.idle).min(this.end);
            if now >= due {
                this.done = true;
                let e = if due == this.end {
                    Expired::Total(this.total)
                } else {
                    Expired::Idle(this.idle)
                };
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            timer.as_mut().reset(due);
        }
        Poll::Pending
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// On the paused clock: time moves only when every task waits, straight to the next
    /// timer, so the limits are met to the millisecond whatever the machine's load.
    #[tokio::test(start_paused = true)]
    async fn an_idle_body_ends_with_the_idle_error_and_a_busy_one_with_the_total() {
        let ms = Duration::from_millis;
        let started = Instant::now();
        let pending = futures_util::stream::pending().boxed();
        let mut b = bounded(pending, ms(50), started.into_std(), ms(10_000));
        let e = b.next().await.unwrap().unwrap_err();
        assert!(matches!(Expired::of(&e), Some(Expired::Idle(_))), "{e}");
        assert_eq!(started.elapsed(), ms(50));
        assert!(b.next().await.is_none());

        // Pieces every 10 ms never let it go idle for 200 ms; the total of 300 ms ends it.
        let ticks = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Some((Ok::<_, BoxError>(Bytes::from_static(b"x")), ()))
        })
        .boxed();
        let started = Instant::now();
        let mut b = bounded(ticks, ms(200), started.into_std(), ms(300));
        let e = loop {
            match b.next().await.unwrap() {
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        assert!(matches!(Expired::of(&e), Some(Expired::Total(_))), "{e}");
        assert_eq!(started.elapsed(), ms(300));
    }
}
