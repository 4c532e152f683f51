//! How a bulkhead serves the calls that wait for a permit: its queue
//! discipline, and the ordered wait list that serves them by criticality.
//!
//! A bulkhead whose discipline is FIFO and whose config declares no class
//! keeps its plain FIFO queue (a `Notify`, `bulkhead.rs`). Any other
//! ("ordered") keeps its waiters here, one list per scope under a lock
//! taken only by calls that wait and by releases while someone waits:
//!
//! - **Order.** The waiter served next is the one of the highest class
//!   ([`Class`]); within a class the oldest (FIFO), or, with `lifo`, the
//!   newest once the queue has *stood* (held a waiter without a break) for
//!   `interval`: adaptive LIFO, as Facebook's servers do, so that under a
//!   standing queue the calls whose clients are still there are served.
//! - **CoDel.** With `codel target T interval I`, a waiter that has waited
//!   `T` while the queue has stood for `I` is refused at once: its wait
//!   ends at `max(joined + T, stood_since + I)` when that comes before
//!   `joined + max_wait`. The queue stands as long as any waiter waits, so
//!   the deadline is fixed when the call joins. Under a standing queue the
//!   waiting time thus drops to `T`; a queue that empties within `I` (a
//!   burst) waits up to `max_wait` as FIFO does.
//! - **Shedding.** A sheddable call never waits (the bulkhead refuses it
//!   when it finds no permit); a critical call that finds the queue full
//!   (`max_queue`) displaces the newest waiter of the lowest class below
//!   critical, which is refused at once; with none, it is refused itself.
//!
//! A permit freed while someone waits is handed to the waiter chosen, under
//! the lock (the permit word counts waiters, so a newcomer never takes it
//! first). The list is a slab reused across waits: no allocation per call
//! once it has held as many waiters as it ever will; choosing a waiter
//! scans the list (`O(waiters)`, only while someone waits).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::invalid::{Ctx, InvalidConfig};
use crate::criticality::Class;
use crate::rejection::RejectReason;
use gov_proto::v1 as proto;

/// How a bulkhead serves the calls waiting for a permit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueDiscipline {
    /// First come, first served, each up to `max_wait` (the default).
    #[default]
    Fifo,
    /// Refused after `target` once the queue has stood for `interval`.
    Codel {
        target: Duration,
        interval: Duration,
    },
    /// FIFO until the queue has stood for `interval`, then LIFO.
    Lifo { interval: Duration },
}

/// A bulkhead's queue from the wire (absent: FIFO).
pub(crate) fn spec(
    ctx: &Ctx<'_>,
    q: Option<&proto::Queue>,
) -> Result<QueueDiscipline, InvalidConfig> {
    use proto::queue::Kind;
    let Some(q) = q else {
        return Ok(QueueDiscipline::Fifo);
    };
    match &q.kind {
        None => Err(ctx.err(
            "`queue` names no discipline, or one this agent does not know (upgrade the agent)",
        )),
        Some(Kind::Fifo(_)) => Ok(QueueDiscipline::Fifo),
        Some(Kind::Codel(c)) => {
            let target = ctx.positive_ms("queue.codel.target_ms", c.target_ms)?;
            let interval = ctx.positive_ms("queue.codel.interval_ms", c.interval_ms)?;
            if target >= interval {
                return Err(ctx.err("`queue.codel.target_ms` must be < `interval_ms`"));
            }
            Ok(QueueDiscipline::Codel { target, interval })
        }
        Some(Kind::Lifo(l)) => Ok(QueueDiscipline::Lifo {
            interval: ctx.positive_ms("queue.lifo.interval_ms", l.interval_ms)?,
        }),
    }
}

/// The permit word of one scope, as the wait list sees it.
pub(crate) trait Permits {
    /// Counts a waiter (newcomers no longer take free permits).
    fn join(&self);
    /// Takes a free permit for a waiter and uncounts it; `false` when none is free.
    fn grant(&self) -> bool;
    /// Uncounts a waiter that leaves without a permit.
    fn leave(&self);
    /// Gives back a permit granted to a waiter that left before taking it.
    fn give_back(&self);
}

/// What one waiter is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Told {
    Waiting,
    Granted,
    /// Displaced by a critical call.
    Shed,
}

#[derive(Debug)]
struct Entry {
    live: bool,
    class: Class,
    seq: u64,
    told: Told,
    waker: Option<Waker>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: Vec<Entry>,
    free: Vec<u32>,
    /// Entries told `Waiting`.
    waiting: u32,
    /// Since when some call has waited without a break.
    since: Option<Instant>,
    seq: u64,
}

/// The ordered waiters of one scope.
#[derive(Debug, Default)]
pub(crate) struct Waitlist {
    inner: Mutex<Inner>,
}

/// What a bulkhead's waiters are served by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    pub discipline: QueueDiscipline,
    pub max_wait: Duration,
    pub max_queue: Option<u32>,
}

impl Inner {
    /// Whether the queue has stood for `interval` at `now`.
    fn stood(&self, interval: Duration, now: Instant) -> bool {
        self.since
            .is_some_and(|s| now.saturating_duration_since(s) >= interval)
    }

    /// The waiter to serve next.
    fn pick(&self, discipline: QueueDiscipline, now: Instant) -> Option<usize> {
        let newest = match discipline {
            QueueDiscipline::Lifo { interval } => self.stood(interval, now),
            QueueDiscipline::Fifo | QueueDiscipline::Codel { .. } => false,
        };
        let key = |e: &Entry| {
            let order = if newest { e.seq } else { u64::MAX - e.seq };
            (e.class, order)
        };
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.live && e.told == Told::Waiting)
            .max_by_key(|(_, e)| key(e))
            .map(|(i, _)| i)
    }

    /// The waiter a critical call displaces: the newest of the lowest class
    /// below critical.
    fn victim(&self) -> Option<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.live && e.told == Told::Waiting && e.class < Class::Critical)
            .min_by_key(|(_, e)| (e.class, u64::MAX - e.seq))
            .map(|(i, _)| i)
    }

    /// `i` stops waiting, told `told`.
    fn tell(&mut self, i: usize, told: Told) {
        let e = &mut self.entries[i];
        e.told = told;
        if let Some(w) = e.waker.take() {
            w.wake();
        }
        self.waiting -= 1;
        if self.waiting == 0 {
            self.since = None;
        }
    }

    /// Hands free permits to the waiters, in order.
    fn dispatch<P: Permits>(&mut self, permits: &P, discipline: QueueDiscipline, now: Instant) {
        while self.waiting > 0 {
            let Some(i) = self.pick(discipline, now) else {
                break;
            };
            if !permits.grant() {
                break;
            }
            self.tell(i, Told::Granted);
        }
    }

    fn free(&mut self, i: usize) {
        self.entries[i].live = false;
        self.entries[i].waker = None;
        // The index fits: a slab never holds more than u32::MAX waiters.
        self.free.push(u32::try_from(i).unwrap_or(u32::MAX));
    }
}

impl Waitlist {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the list consistent (every
        // step is a single assignment), so a poisoned lock is used as is.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands a freed permit to the waiter whose turn it is (a release while
    /// someone waits).
    pub(crate) fn dispatch<P: Permits>(&self, permits: &P, discipline: QueueDiscipline) {
        self.lock().dispatch(permits, discipline, Instant::now());
    }

    /// Waits for a permit as `rules` say, for a call of `class`.
    pub(crate) async fn wait<P: Permits + Unpin>(
        &self,
        permits: P,
        class: Class,
        rules: Rules,
    ) -> Result<(), RejectReason> {
        let now = Instant::now();
        let (slot, deadline) = {
            let mut inner = self.lock();
            if rules.max_queue.is_some_and(|max| inner.waiting >= max) {
                // A full queue: a critical call takes a lower one's place.
                match inner.victim().filter(|_| class == Class::Critical) {
                    Some(v) => {
                        inner.tell(v, Told::Shed);
                        permits.leave();
                    }
                    None => return Err(RejectReason::BulkheadFull),
                }
            }
            permits.join();
            if inner.waiting == 0 {
                inner.since = Some(now);
            }
            inner.waiting += 1;
            inner.seq += 1;
            let entry = Entry {
                live: true,
                class,
                seq: inner.seq,
                told: Told::Waiting,
                waker: None,
            };
            let slot = match inner.free.pop() {
                Some(i) => {
                    inner.entries[i as usize] = entry;
                    i as usize
                }
                None => {
                    inner.entries.push(entry);
                    inner.entries.len() - 1
                }
            };
            let mut deadline = now + rules.max_wait;
            if let QueueDiscipline::Codel { target, interval } = rules.discipline {
                let since = inner.since.unwrap_or(now);
                deadline = deadline.min((now + target).max(since + interval));
            }
            // A permit may have been freed before this call was counted.
            inner.dispatch(&permits, rules.discipline, now);
            (slot, deadline)
        };
        let ticket = Ticket {
            list: self,
            permits,
            slot,
            discipline: rules.discipline,
            done: false,
        };
        match tokio::time::timeout_at(deadline, ticket).await {
            Ok(told) => told,
            Err(_) => Err(RejectReason::BulkheadTimeout),
        }
    }

    /// Calls waiting now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> u32 {
        self.lock().waiting
    }
}

/// One waiter's place in the list, for as long as it waits: dropped
/// before its answer (a timeout, a cancelled call), it leaves the list and
/// gives back a permit handed to it meanwhile.
struct Ticket<'a, P: Permits> {
    list: &'a Waitlist,
    permits: P,
    slot: usize,
    discipline: QueueDiscipline,
    done: bool,
}

impl<P: Permits + Unpin> Future for Ticket<'_, P> {
    type Output = Result<(), RejectReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut inner = this.list.lock();
        let told = inner.entries[this.slot].told;
        let answer = match told {
            Told::Waiting => {
                let e = &mut inner.entries[this.slot];
                match &mut e.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    w => *w = Some(cx.waker().clone()),
                }
                return Poll::Pending;
            }
            Told::Granted => Ok(()),
            Told::Shed => Err(RejectReason::BulkheadFull),
        };
        inner.free(this.slot);
        this.done = true;
        Poll::Ready(answer)
    }
}

impl<P: Permits> Drop for Ticket<'_, P> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut inner = self.list.lock();
        match inner.entries[self.slot].told {
            Told::Waiting => {
                inner.tell(self.slot, Told::Shed);
                self.permits.leave();
            }
            Told::Granted => self.permits.give_back(),
            Told::Shed => {}
        }
        inner.free(self.slot);
        inner.dispatch(&self.permits, self.discipline, Instant::now());
    }
}

#[cfg(test)]
mod tests;
