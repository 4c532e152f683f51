//! A weighted fair share of one bulkhead's permits between the consumers of
//! its calls (`share by consumer { crm 3  web 1  default 1 }`).
//!
//! Every call belongs to a class: a consumer the share names, or `default`
//! (every other consumer, and calls without one). A class is *active* while
//! it has a call in flight or waiting. A call is *within its share* while its
//! class holds fewer permits than `limit x weight / (the weights of the
//! active classes, its own counted)`: served ahead of borrowers up to that
//! share rounded up, and sure of it rounded down (those fit in the pool
//! together); else it *borrows* what an idle class's share leaves free.
//!
//! - A free permit goes to a call within its share at once; to a borrower
//!   only when no call within its share waits (and, for a newcomer, when
//!   nobody waits at all: it does not overtake the queue).
//! - The pool keeps one permit free for each other active class below the
//!   share it is sure of: a call beyond its own sure share (a borrower, or
//!   a call of the rounded-up part) does not take it. So the next call of a
//!   consumer already served finds a permit at once, instead of waiting
//!   for a borrower's call to end: without it, a freed permit that a
//!   borrower takes a moment before that call arrives costs it up to a
//!   whole call of the borrower's in wait. A class with nothing in flight
//!   and nothing waiting keeps nothing (its share is lent whole).
//! - A full pool makes a call within its share wait (if the bulkhead waits
//!   at all: `max_wait`), whatever `queue` says: such waiters are bounded by
//!   the class's share. A borrower waits only within `queue`.
//! - Each released permit wakes the waiters of the pool; the ones within
//!   their share take it first, so a returning consumer takes its share back
//!   one released permit at a time, from the borrowers, and a greedy
//!   consumer never holds more than what the others leave idle.
//!
//! The counts per class sit behind one lock per bulkhead, taken once per
//! admission and once per release (never across an await); the classes are
//! a table made once from the config, so a call allocates nothing. The
//! permits themselves stay in the pool's word (in use, waiting), shared with
//! the bulkhead before a config change: calls admitted by that one count
//! against the limit, not against a class.
//!
//! This module knows the pool only through [`Pool`], the references the
//! bulkhead hands it, so it never imports its parent.

use std::collections::HashMap;
use std::sync::atomic::{
    AtomicU32, AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::invalid::{Ctx, InvalidConfig};
use crate::rejection::RejectReason;
use crate::route::FxBuild;
use gov_proto::v1 as proto;

/// The most consumers a share names (besides `default`).
pub const MAX_CONSUMERS: usize = 64;

/// One waiter in the high half of the pool's word (its layout: permits in
/// use in the low 32 bits, calls waiting in the high 32).
const WAITER: u64 = 1 << 32;
const IN_USE: u64 = 0xffff_ffff;

/// A fair share's weights, from the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareSpec {
    /// The consumers the share names and their weights (each > 0).
    pub weights: Vec<(Box<str>, u32)>,
    /// The weight of every other consumer, together (> 0).
    pub default_weight: u32,
}

/// A fair share's spec from the wire: weights > 0, each consumer once.
pub(crate) fn spec(ctx: &Ctx<'_>, s: &proto::FairShare) -> Result<ShareSpec, InvalidConfig> {
    if s.default_weight == 0 {
        return Err(ctx.err("`share`: the `default` weight must be > 0"));
    }
    if s.weights.len() > MAX_CONSUMERS {
        return Err(ctx.err(format!(
            "`share` names {} consumers, at most {MAX_CONSUMERS}",
            s.weights.len()
        )));
    }
    let mut weights: Vec<(Box<str>, u32)> = Vec::with_capacity(s.weights.len());
    for w in &s.weights {
        if w.consumer.is_empty() {
            return Err(ctx.err("`share`: a consumer without a name"));
        }
        if w.weight == 0 {
            return Err(ctx.err(format!(
                "`share`: the weight of `{}` must be > 0",
                w.consumer
            )));
        }
        if weights.iter().any(|(n, _)| **n == *w.consumer) {
            return Err(ctx.err(format!("`share` names `{}` twice", w.consumer)));
        }
        weights.push((w.consumer.as_str().into(), w.weight));
    }
    Ok(ShareSpec {
        weights,
        default_weight: s.default_weight,
    })
}

/// A call's class: the index of its consumer's weight (the last: `default`).
pub(crate) type Class = u8;

/// The pool a share divides: the bulkhead's scope and limit.
pub(crate) struct Pool<'a> {
    /// Permits in use (low 32 bits) and calls waiting (high 32 bits).
    pub state: &'a AtomicU64,
    pub notify: &'a Notify,
    /// Calls waiting in the pool (for `queue`).
    pub waiting: &'a AtomicU32,
    /// The rule's waiting gauge.
    pub gauge: &'a AtomicU64,
    /// The permits now.
    pub limit: &'a AtomicU32,
}

/// The most consumers a share looks up by a scan of their names; past
/// that, by a map.
const SCANNED: usize = 8;

/// The share of one bulkhead: its classes and their counts.
#[derive(Debug)]
pub(crate) struct Share {
    /// The consumers the share names, by class: a call's is found by a
    /// scan while they are few (issue 39: most names differ from the
    /// call's in length, and the scan costs less than the name's hash).
    names: Box<[Box<str>]>,
    /// The classes by consumer, when the share names more than
    /// [`SCANNED`].
    classes: Option<HashMap<Box<str>, Class, FxBuild>>,
    /// By class; the last is `default`.
    weights: Box<[u32]>,
    counts: Mutex<Counts>,
}

#[derive(Debug)]
struct Counts {
    /// Permits held, by class.
    in_use: Box<[u32]>,
    /// Calls waiting, by class.
    waiting: Box<[u32]>,
    /// The weights of the active classes summed.
    active: u64,
}

impl Share {
    pub(crate) fn new(spec: &ShareSpec) -> Self {
        let n = spec.weights.len() + 1;
        let mut weights: Vec<u32> = spec.weights.iter().map(|&(_, w)| w).collect();
        weights.push(spec.default_weight);
        let names: Box<[Box<str>]> = spec.weights.iter().map(|(n, _)| n.clone()).collect();
        let classes = (names.len() > SCANNED).then(|| {
            let mut classes = HashMap::with_capacity_and_hasher(n, FxBuild::default());
            for (i, name) in names.iter().enumerate() {
                classes.insert(name.clone(), Class::try_from(i).unwrap_or(Class::MAX));
            }
            classes
        });
        Self {
            names,
            classes,
            weights: weights.into(),
            counts: Mutex::new(Counts {
                in_use: vec![0; n].into(),
                waiting: vec![0; n].into(),
                active: 0,
            }),
        }
    }

    /// The class of a call of `consumer` (unknown or none: `default`).
    #[inline]
    pub(crate) fn class(&self, consumer: Option<&str>) -> Class {
        let default = (self.weights.len() - 1) as Class;
        let Some(consumer) = consumer else {
            return default;
        };
        let class = match &self.classes {
            Some(classes) => classes.get(consumer).copied(),
            None => (self.names.iter())
                .position(|name| **name == *consumer)
                .map(|i| i as Class),
        };
        class.unwrap_or(default)
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn idx(&self, class: Class) -> usize {
        usize::from(class).min(self.weights.len() - 1)
    }

    /// Counts `d_use` permits and `d_wait` waiters more for class `i`,
    /// keeping the active weight.
    fn count(&self, c: &mut Counts, i: usize, d_use: i32, d_wait: i32) {
        let was = c.in_use[i] > 0 || c.waiting[i] > 0;
        c.in_use[i] = c.in_use[i].saturating_add_signed(d_use);
        c.waiting[i] = c.waiting[i].saturating_add_signed(d_wait);
        let is = c.in_use[i] > 0 || c.waiting[i] > 0;
        let w = u64::from(self.weights[i]);
        match (was, is) {
            (false, true) => c.active += w,
            (true, false) => c.active = c.active.saturating_sub(w),
            _ => {}
        }
    }

    /// [`Share::count`] of a permit taken by class `i` (issue 39: no
    /// signed counts, no second test of its activity).
    #[inline]
    fn count_taken(&self, c: &mut Counts, i: usize) {
        let idle = c.in_use[i] == 0 && c.waiting[i] == 0;
        c.in_use[i] = c.in_use[i].saturating_add(1);
        if idle {
            c.active += u64::from(self.weights[i]);
        }
    }

    /// [`Share::count`] of a permit class `i` gives back.
    #[inline]
    fn count_given(&self, c: &mut Counts, i: usize) {
        let held = c.in_use[i];
        if held == 0 {
            return;
        }
        c.in_use[i] = held - 1;
        if held == 1 && c.waiting[i] == 0 {
            c.active = c.active.saturating_sub(u64::from(self.weights[i]));
        }
    }

    /// Class `i`'s weight, and the active classes' weights with `i`'s
    /// counted (whether or not it is active yet).
    fn weights_with(&self, c: &Counts, i: usize) -> (u64, u64) {
        let w = u64::from(self.weights[i]);
        let active = if c.in_use[i] > 0 || c.waiting[i] > 0 {
            c.active
        } else {
            c.active + w
        };
        (w, active)
    }

    /// Whether class `i`, holding `extra - 1` more permits than now, is still
    /// below its share of `limit` (`limit x weight / active weights`): it is
    /// served ahead of borrowers up to its share rounded up, and sure of it
    /// rounded down.
    fn within(&self, c: &Counts, i: usize, extra: u32, limit: u32) -> bool {
        let (w, active) = self.weights_with(c, i);
        (u64::from(c.in_use[i]) + u64::from(extra.saturating_sub(1))) * active
            < u64::from(limit) * w
    }

    /// Whether class `i` is sure of one more permit: holding it, still
    /// within its share rounded down.
    fn sure(&self, c: &Counts, i: usize, limit: u32) -> bool {
        let (w, active) = self.weights_with(c, i);
        (u64::from(c.in_use[i]) + 1) * active <= u64::from(limit) * w
    }

    /// The permits kept free for the active classes other than `i` that
    /// are below their sure share (one each).
    fn kept_free(&self, c: &Counts, i: usize, limit: u32) -> u64 {
        (0..self.weights.len())
            .filter(|&j| j != i && (c.in_use[j] > 0 || c.waiting[j] > 0))
            .filter(|&j| self.sure(c, j, limit))
            .count() as u64
    }

    /// Whether a call within its share waits.
    fn entitled_waiter(&self, c: &Counts, limit: u32) -> bool {
        (0..self.weights.len()).any(|j| c.waiting[j] > 0 && self.within(c, j, 1, limit))
    }

    /// Takes a permit for class `i` if the share lets it have one now;
    /// `waiter`: the call is one of the pool's waiters.
    fn admit(&self, c: &mut Counts, pool: &Pool<'_>, i: usize, waiter: bool) -> bool {
        let limit = pool.limit.load(Relaxed);
        let state = pool.state.load(Relaxed);
        if state & IN_USE >= u64::from(limit) {
            return false;
        }
        // Beyond its sure share, a call leaves the permits kept free.
        let free = u64::from(limit) - (state & IN_USE);
        let sure = self.sure(c, i, limit);
        if !sure && free <= self.kept_free(c, i, limit) {
            return false;
        }
        // A call sure of its permit is within its share (issue 39: not
        // computed again).
        let allowed = if sure || self.within(c, i, 1, limit) {
            // Not ahead of a waiter of its own class.
            waiter || c.waiting[i] == 0
        } else if waiter {
            !self.entitled_waiter(c, limit)
        } else {
            state >> 32 == 0
        };
        if !allowed || !take(pool.state, limit) {
            return false;
        }
        self.count_taken(c, i);
        true
    }

    /// Takes a permit for a call of `class` if one is its now.
    pub(crate) fn try_take(&self, pool: &Pool<'_>, class: Class) -> bool {
        let i = self.idx(class);
        let mut c = self.lock();
        self.admit(&mut c, pool, i, false)
    }

    /// Waits at most `max_wait` for a permit for a call of `class`; a
    /// borrower only if fewer than `max_queue` calls wait.
    pub(crate) async fn wait(
        &self,
        pool: &Pool<'_>,
        class: Class,
        max_wait: Duration,
        max_queue: Option<u32>,
    ) -> Result<(), RejectReason> {
        let i = self.idx(class);
        {
            let mut c = self.lock();
            if self.admit(&mut c, pool, i, false) {
                return Ok(());
            }
            let limit = pool.limit.load(Relaxed);
            let mine = c.waiting[i].saturating_add(1);
            let full = max_queue.is_some_and(|q| pool.waiting.load(Relaxed) >= q);
            if max_wait.is_zero() || full && !self.within(&c, i, mine, limit) {
                return Err(RejectReason::BulkheadFull);
            }
            self.count(&mut c, i, 0, 1);
            pool.state.fetch_add(WAITER, AcqRel);
            pool.waiting.fetch_add(1, Relaxed);
            pool.gauge.fetch_add(1, Relaxed);
        }
        let _queued = Queued {
            share: self,
            pool,
            i,
        };
        let deadline = Instant::now() + max_wait;
        loop {
            // Register for a wake-up before looking, so a release in between
            // is not missed.
            let notified = pool.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut c = self.lock();
                if self.admit(&mut c, pool, i, true) {
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(RejectReason::BulkheadTimeout);
            }
        }
    }

    /// Gives back a permit of a call of `class`, and wakes the waiters.
    pub(crate) fn release(&self, pool: &Pool<'_>, class: Class) {
        let i = self.idx(class);
        let waiters = {
            let mut c = self.lock();
            self.count_given(&mut c, i);
            pool.state.fetch_sub(1, Release) >> 32
        };
        if waiters > 0 {
            pool.notify.notify_waiters();
        }
    }

    /// Permits held and calls waiting by consumer (the last: `default`).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> Vec<(u32, u32)> {
        let c = self.lock();
        c.in_use
            .iter()
            .copied()
            .zip(c.waiting.iter().copied())
            .collect()
    }
}

/// Takes a permit of the pool's word while fewer than `limit` are in use.
fn take(state: &AtomicU64, limit: u32) -> bool {
    let mut current = state.load(Relaxed);
    loop {
        if current & IN_USE >= u64::from(limit) {
            return false;
        }
        match state.compare_exchange_weak(current, current + 1, Acquire, Relaxed) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}

/// A waiter of class `i`, counted until it leaves (also when cancelled).
struct Queued<'a> {
    share: &'a Share,
    pool: &'a Pool<'a>,
    i: usize,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let after = {
            let mut c = self.share.lock();
            self.share.count(&mut c, self.i, 0, -1);
            self.pool.state.fetch_sub(WAITER, AcqRel) - WAITER
        };
        self.pool.waiting.fetch_sub(1, Relaxed);
        self.pool.gauge.fetch_sub(1, Relaxed);
        // Its leaving may let a borrower have a free permit.
        if after >> 32 > 0 && after & IN_USE < u64::from(self.pool.limit.load(Relaxed)) {
            self.pool.notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of its own: the word, the wake-ups, the gauges and the limit.
    struct Owned {
        state: AtomicU64,
        notify: Notify,
        waiting: AtomicU32,
        gauge: AtomicU64,
        limit: AtomicU32,
    }

    impl Owned {
        fn new(limit: u32) -> Self {
            Self {
                state: AtomicU64::new(0),
                notify: Notify::new(),
                waiting: AtomicU32::new(0),
                gauge: AtomicU64::new(0),
                limit: AtomicU32::new(limit),
            }
        }

        fn pool(&self) -> Pool<'_> {
            Pool {
                state: &self.state,
                notify: &self.notify,
                waiting: &self.waiting,
                gauge: &self.gauge,
                limit: &self.limit,
            }
        }
    }

    /// `crm` 3, `web` 1, `default` 1.
    fn share() -> Share {
        Share::new(&ShareSpec {
            weights: vec![("crm".into(), 3), ("web".into(), 1)],
            default_weight: 1,
        })
    }

    #[test]
    fn consumers_are_classes_and_every_other_one_is_default() {
        let s = share();
        assert_eq!(s.class(Some("crm")), 0);
        assert_eq!(s.class(Some("web")), 1);
        assert_eq!(s.class(Some("CRM")), 2, "names are exact");
        assert_eq!(s.class(Some("")), 2);
        assert_eq!(s.class(None), 2);
    }

    /// A share of many consumers finds their classes by a map, of few by
    /// a scan: the same classes.
    #[test]
    fn classes_are_found_by_a_scan_or_a_map() {
        for n in [1, SCANNED, SCANNED + 1, MAX_CONSUMERS] {
            let s = Share::new(&ShareSpec {
                weights: (0..n).map(|i| (format!("c{i}").into(), 1)).collect(),
                default_weight: 1,
            });
            assert_eq!(s.classes.is_some(), n > SCANNED);
            for i in 0..n {
                assert_eq!(usize::from(s.class(Some(&format!("c{i}")))), i);
            }
            for other in [None, Some(""), Some("c"), Some("C0"), Some("c0 ")] {
                assert_eq!(usize::from(s.class(other)), n, "{other:?}");
            }
        }
    }

    /// A class sure of one more permit is within its share ([`Share::admit`]
    /// tests only the first then), and the counts of a permit taken or given
    /// back are [`Share::count`]'s.
    #[test]
    fn a_sure_class_is_within_its_share_and_counts_are_counts() {
        let s = share();
        let n = [0, 1, 2, 3, 7, u32::MAX - 1, u32::MAX];
        for (in_use, waiting, other, limit) in
            product(&n, &n, &[0, 1, 5], &[0, 1, 2, 4, 10, 1000, u32::MAX])
        {
            let counts = |in_use, waiting| {
                let mut c = Counts {
                    in_use: vec![0; 3].into(),
                    waiting: vec![0; 3].into(),
                    active: 0,
                };
                s.count(&mut c, 2, 0, i32::try_from(other).unwrap());
                s.count(&mut c, 1, in_use, waiting);
                c
            };
            let sat = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
            let c = counts(sat(in_use), sat(waiting));
            if s.sure(&c, 1, limit) {
                assert!(s.within(&c, 1, 1, limit), "{in_use} {waiting} {limit}");
            }
            for (delta, mut fast) in [(1, counts(sat(in_use), sat(waiting))), (-1, c)] {
                let mut slow = counts(sat(in_use), sat(waiting));
                s.count(&mut slow, 1, delta, 0);
                if delta > 0 {
                    s.count_taken(&mut fast, 1);
                } else {
                    s.count_given(&mut fast, 1);
                }
                assert_eq!(
                    (fast.in_use, fast.waiting, fast.active),
                    (slow.in_use, slow.waiting, slow.active),
                    "{delta}: {in_use} {waiting} {other}"
                );
            }
        }
    }

    /// Every tuple of the four lists.
    fn product<'a>(
        a: &'a [u32],
        b: &'a [u32],
        c: &'a [u32],
        d: &'a [u32],
    ) -> impl Iterator<Item = (u32, u32, u32, u32)> + 'a {
        a.iter().flat_map(move |&a| {
            b.iter().flat_map(move |&b| {
                c.iter()
                    .flat_map(move |&c| d.iter().map(move |&d| (a, b, c, d)))
            })
        })
    }

    #[test]
    fn a_lone_consumer_borrows_the_whole_pool() {
        let (s, p) = (share(), Owned::new(8));
        for _ in 0..8 {
            assert!(s.try_take(&p.pool(), 1));
        }
        assert!(!s.try_take(&p.pool(), 1), "the pool is full");
        assert_eq!(s.counts()[1], (8, 0));
        for _ in 0..8 {
            s.release(&p.pool(), 1);
        }
        assert_eq!(p.state.load(Relaxed), 0);
        assert_eq!(s.counts()[1], (0, 0));
    }

    /// A borrower does not take a free permit while a call within its share
    /// waits; the call within its share does.
    #[tokio::test(start_paused = true)]
    async fn a_released_permit_goes_to_the_waiter_within_its_share() {
        let (s, p) = (share(), Owned::new(4));
        for _ in 0..4 {
            assert!(s.try_take(&p.pool(), 1), "web borrows");
        }
        let pool = p.pool();
        let crm = s.wait(&pool, 0, Duration::from_secs(1), None);
        let web = s.wait(&pool, 1, Duration::from_secs(1), None);
        tokio::pin!(crm, web);
        // Both wait: the pool is full.
        assert!(futures::poll!(crm.as_mut()).is_pending());
        assert!(futures::poll!(web.as_mut()).is_pending());
        assert_eq!(s.counts(), [(0, 1), (4, 1), (0, 0)]);
        s.release(&pool, 1);
        // The borrower, woken too, defers to crm (within 3 of 4).
        assert!(futures::poll!(web.as_mut()).is_pending());
        assert_eq!(crm.await, Ok(()));
        assert_eq!(s.counts(), [(1, 0), (3, 1), (0, 0)]);
        // The next permit freed is kept for crm (1 in flight, sure of 3):
        // neither borrower takes it.
        s.release(&pool, 1);
        assert!(!s.try_take(&pool, 1));
        assert!(futures::poll!(web.as_mut()).is_pending());
        // Once crm has nothing in flight, the waiting borrower has it, and
        // a newcomer borrower does not overtake it.
        s.release(&pool, 0);
        assert!(!s.try_take(&pool, 1));
        assert_eq!(web.await, Ok(()));
    }

    /// A borrower leaves one permit free for a consumer that has a call in
    /// flight and is below its sure share, so that consumer's next call
    /// does not wait for a borrower's call to end; a consumer with nothing
    /// in flight keeps nothing.
    #[tokio::test(start_paused = true)]
    async fn a_borrower_leaves_a_permit_for_an_active_consumer_below_its_share() {
        let (s, p) = (share(), Owned::new(10));
        let pool = p.pool();
        assert!(s.try_take(&pool, 1), "web has a call in flight");
        // `default` (weight 1 of 2 active) is sure of 5 and borrows 3 more.
        for _ in 0..8 {
            assert!(s.try_take(&pool, 2));
        }
        assert!(!s.try_take(&pool, 2), "the last permit is web's");
        let borrower = s.wait(&pool, 2, Duration::from_secs(1), None);
        tokio::pin!(borrower);
        assert!(futures::poll!(borrower.as_mut()).is_pending());
        assert!(s.try_take(&pool, 1), "web's next call: at once");
        // A permit freed by `default` goes to web's next call too, not to
        // the waiting borrower (web, at 2 of its sure 5, keeps one free).
        s.release(&pool, 2);
        assert!(futures::poll!(borrower.as_mut()).is_pending());
        assert!(s.try_take(&pool, 1));
        // Once web has nothing in flight, its share is lent whole.
        for _ in 0..3 {
            s.release(&pool, 1);
        }
        assert_eq!(borrower.await, Ok(()));
        assert!(s.try_take(&pool, 2) && s.try_take(&pool, 2));
        assert_eq!(s.counts(), [(0, 0), (0, 0), (10, 0)]);
    }

    /// A borrower waits only within `queue`; a call within its share waits
    /// whatever the queue.
    #[tokio::test(start_paused = true)]
    async fn the_queue_bounds_borrowers_only() {
        let (s, p) = (share(), Owned::new(2));
        let pool = p.pool();
        assert!(s.try_take(&pool, 1) && s.try_take(&pool, 1));
        let queue = Some(1);
        let mut first = Box::pin(s.wait(&pool, 1, Duration::from_secs(1), queue));
        assert!(futures::poll!(first.as_mut()).is_pending());
        let start = Instant::now();
        assert_eq!(
            s.wait(&pool, 1, Duration::from_secs(1), queue).await,
            Err(RejectReason::BulkheadFull),
            "a second borrower is refused at once"
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        let crm = s.wait(&pool, 0, Duration::from_millis(50), queue);
        assert_eq!(crm.await, Err(RejectReason::BulkheadTimeout), "crm waited");
        assert_eq!(start.elapsed(), Duration::from_millis(50));
        assert_eq!(p.waiting.load(Relaxed), 1);
        drop(first);
        assert_eq!((p.waiting.load(Relaxed), p.gauge.load(Relaxed)), (0, 0));
        assert_eq!(p.state.load(Relaxed), 2, "no waiter counted in the word");
    }

    /// A limit that shrank (adaptive) admits nobody until the calls in
    /// flight fall below it; the shares are of the limit now.
    #[test]
    fn the_shares_follow_the_limit() {
        let (s, p) = (share(), Owned::new(8));
        for _ in 0..6 {
            assert!(s.try_take(&p.pool(), 0));
        }
        p.limit.store(4, Relaxed);
        assert!(!s.try_take(&p.pool(), 1));
        for _ in 0..3 {
            s.release(&p.pool(), 0);
        }
        // 3 in use of 4: web (1 of 4 with crm active) takes the last.
        assert!(s.try_take(&p.pool(), 1));
        assert!(!s.try_take(&p.pool(), 0));
    }

    #[test]
    fn specs_are_checked() {
        let ctx = Ctx::new("svc/b");
        let w = |c: &str, weight| proto::ShareWeight {
            consumer: c.into(),
            weight,
        };
        let ok = proto::FairShare {
            weights: vec![w("crm", 3), w("web", 1)],
            default_weight: 1,
        };
        assert!(spec(&ctx, &ok).is_ok());
        for bad in [
            proto::FairShare {
                default_weight: 0,
                ..ok.clone()
            },
            proto::FairShare {
                weights: vec![w("crm", 0)],
                default_weight: 1,
            },
            proto::FairShare {
                weights: vec![w("crm", 1), w("crm", 2)],
                default_weight: 1,
            },
            proto::FairShare {
                weights: vec![w("", 1)],
                default_weight: 1,
            },
            proto::FairShare {
                weights: (0..65).map(|i| w(&format!("c{i}"), 1)).collect(),
                default_weight: 1,
            },
        ] {
            assert!(spec(&ctx, &bad).is_err(), "{bad:?}");
        }
    }
}
