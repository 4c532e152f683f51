//! Thread-striped counters: per-rule statistics bumped on every request
//! without a locked read-modify-write.
//!
//! Each counter set has one stripe per thread slot plus one shared stripe.
//! A thread leases a slot from a small global registry when it first
//! decides with a snapshot it loads ([`lease`]: the first decision of every
//! thread fills its cache so) and gives it back when it exits (a
//! thread-local destructor); until then it counts in the shared stripe.
//! The thread owning a slot is the only writer of that slot's stripe in
//! every counter set, so it bumps it with a plain `Relaxed` load and store
//! (no lock prefix, no cache line shared with other writers).
//! Threads beyond the slot count, and code running after the thread's lease
//! is gone (other thread-local destructors), use the shared stripe with
//! `fetch_add`. A reader sums the stripes: sums are exact (no count is
//! lost), and only momentarily behind a concurrent writer.
//!
//! A slot handed from an exited thread to a new one carries its values over:
//! the lease is returned with `Release` and taken with `Acquire`, so the new
//! owner's first load sees the last store of the old one.
//!
//! [`Slot`] is neither `Send` nor `Sync`: a slot read on one thread cannot be
//! used to write from another (an admission may move between threads, so it
//! asks for the slot again in each phase).

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most thread slots; the number used is [`slots`].
const MAX_SLOTS: usize = 64;

static TAKEN: [AtomicBool; MAX_SLOTS] = [const { AtomicBool::new(false) }; MAX_SLOTS];

/// Thread slots of every counter set (the shared stripe comes on top): the
/// number of CPUs (threads that can count at the same moment), at least 2,
/// at most 64. Fixed for the life of the process.
pub(crate) fn slots() -> usize {
    static SLOTS: OnceLock<usize> = OnceLock::new();
    *SLOTS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(2, std::num::NonZeroUsize::get)
            .clamp(2, MAX_SLOTS)
    })
}

/// A thread's lease on one slot ([`SHARED`]: every slot was taken).
struct Lease(usize);

impl Lease {
    fn take() -> Self {
        let slot = (0..slots()).find(|&i| {
            TAKEN[i]
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        });
        Self(slot.unwrap_or(SHARED))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The thread stops writing the slot before it is free for another.
        IDX.set(SHARED);
        if let Some(taken) = TAKEN.get(self.0) {
            taken.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static LEASE: Lease = Lease::take();
    /// The slot of this thread's lease, [`SHARED`] without one (not asked
    /// for yet, every slot taken, or the lease gone): a `const` cell that
    /// needs no drop, read with one load and no test of a lazy state (issue
    /// 39: a read of [`LEASE`] took five instructions), nor of whether the
    /// thread asked (issue 39: [`lease`] is asked for off the hot path).
    static IDX: Cell<usize> = const { Cell::new(SHARED) };
}

/// The calling thread's stripe, valid on this thread only (not `Send`):
/// its index in every counter set, worked out once per [`current`] (issue
/// 39: a look-up is then one bounds test, which tells whether the thread
/// owns the stripe too).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    /// The thread's own slot, or [`SHARED`] (past every counter set's
    /// stripes: the shared stripe).
    idx: usize,
    _not_send: PhantomData<*const ()>,
}

/// The index of a [`Slot`] without a stripe of its own.
const SHARED: usize = usize::MAX;

impl Slot {
    /// The shared stripe (always correct, from any thread).
    #[cfg(test)]
    pub(crate) fn shared() -> Self {
        Self {
            idx: SHARED,
            _not_send: PhantomData,
        }
    }

    /// Whether this thread owns a stripe (else it uses the shared one).
    #[cfg(test)]
    pub(crate) fn is_owned(self) -> bool {
        self.idx < slots()
    }
}

/// The calling thread's stripe: its own slot once it has one ([`lease`]),
/// else the shared stripe.
#[inline]
pub(crate) fn current() -> Slot {
    Slot {
        idx: IDX.get(),
        _not_send: PhantomData,
    }
}

/// Gives the calling thread its slot if it has none yet: asked for by a
/// decision that loads its snapshot (each thread's first, and the first
/// after a swap), off the hot path. Takes a slot once in the thread's life
/// (none when every slot is taken or the thread is exiting), kept in
/// [`IDX`]; later calls read what it took.
#[cold]
#[inline(never)]
pub(crate) fn lease() {
    if IDX.get() == SHARED {
        IDX.set(LEASE.try_with(|l| l.0).unwrap_or(SHARED));
    }
}

/// Whether the calling thread counts in the slot its lease took (it asked
/// for it: [`lease`]).
#[cfg(test)]
pub(crate) fn leased() -> bool {
    LEASE.with(|l| l.0) == IDX.get()
}

/// Adds `n` to a counter of the stripe `owned` says the caller owns (plain
/// load and store) or shares (`fetch_add`).
#[inline]
pub(crate) fn add(counter: &AtomicU64, owned: bool, n: u64) {
    if owned {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    } else {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// One value of `T` per thread slot plus the shared one.
#[derive(Debug)]
pub(crate) struct Striped<T> {
    // INVARIANT: `slots()` stripes, one a slot.
    stripes: Box<[T]>,
    /// The shared stripe, apart (issue 39: a look-up in it is an offset
    /// from `self`, not a call or a read of the stripes' length, so the
    /// look-up of an owned stripe compares the length in memory and keeps
    /// nothing in a register for it).
    shared: T,
}

impl<T: Default> Default for Striped<T> {
    fn default() -> Self {
        Self {
            stripes: (0..slots()).map(|_| T::default()).collect(),
            shared: T::default(),
        }
    }
}

impl<T> Striped<T> {
    /// The stripe of `slot`, and whether the caller owns it (may write it
    /// with plain stores).
    #[inline]
    pub(crate) fn get(&self, slot: Slot) -> (&T, bool) {
        // A thread's own slot is below `slots()` (in bounds: the invariant
        // above), [`SHARED`] past every stripe.
        match self.stripes.get(slot.idx) {
            Some(s) => (s, true),
            None => (&self.shared, false),
        }
    }

    /// Every stripe (the shared one last), to sum them.
    pub(crate) fn all(&self) -> impl Iterator<Item = &T> {
        self.stripes.iter().chain(std::iter::once(&self.shared))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    #[derive(Debug, Default)]
    struct One(AtomicU64);

    fn sum(s: &Striped<One>) -> u64 {
        s.all().map(|o| o.0.load(Ordering::Relaxed)).sum()
    }

    fn bump(s: &Striped<One>, n: u64) -> bool {
        lease();
        let slot = current();
        for _ in 0..n {
            let (one, owned) = s.get(slot);
            add(&one.0, owned, 1);
        }
        slot.is_owned()
    }

    #[test]
    fn sums_are_exact_across_threads_exits_and_fallback() {
        let s = Arc::new(Striped::<One>::default());
        // More threads at once than slots: at least one counts in the shared
        // stripe; all hold their lease until everyone has counted.
        let threads = slots() + 2;
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (s, barrier) = (s.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let owned = bump(&s, 10_000);
                    barrier.wait();
                    owned
                })
            })
            .collect();
        let owned: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(
            owned.iter().any(|o| !o),
            "a thread fell back to the shared stripe"
        );
        assert_eq!(sum(&s), 10_000 * threads as u64);

        // Those threads have exited: their slots are free again, and new
        // owners continue from the values they left.
        let again: Vec<_> = (0..3)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || bump(&s, 1_000))
            })
            .collect();
        for h in again {
            h.join().unwrap();
        }
        assert_eq!(sum(&s), 10_000 * threads as u64 + 3_000);
    }

    /// A thread counts in the shared stripe until it asks for its slot
    /// ([`lease`], once: later asks keep it); once its lease is dropped (at
    /// thread exit) it counts in the shared stripe: the slot may then be
    /// another thread's.
    #[test]
    fn a_thread_keeps_its_slot_until_its_lease_is_dropped() {
        std::thread::spawn(|| {
            assert_eq!(current().idx, SHARED, "no slot before it is asked for");
            lease();
            let first = current();
            lease();
            assert_eq!(current().idx, first.idx, "one slot in a thread's life");
            // What `LEASE`'s destructor does (a lease of no slot: nothing
            // else is given back).
            drop(Lease(SHARED));
            assert_eq!(current().idx, SHARED);
            assert!(!current().is_owned());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn shared_slot_counts_with_fetch_add() {
        let s = Striped::<One>::default();
        let (one, owned) = s.get(Slot::shared());
        assert!(!owned);
        add(&one.0, owned, 5);
        assert_eq!(sum(&s), 5);
        assert!(std::ptr::eq(one, s.all().last().unwrap()));
    }
}
