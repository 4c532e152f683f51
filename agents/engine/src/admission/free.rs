//! The per-thread free list of [`Call`] boxes (issue 39): a decision takes
//! one and the end of the call gives it back blank, on the thread that ends
//! it, so a steady flow of calls allocates nothing; each list keeps at most
//! [`KEPT`] boxes and frees what is given beyond that.

use std::cell::Cell;
use std::mem::ManuallyDrop;

use crate::clock::Now;

use super::call::{Call, Marks};
use super::course::{Course, Progress};
use super::held::Plain;

/// The most boxes one thread's free list keeps.
pub(super) const KEPT: u32 = 64;

thread_local! {
    /// This thread's free boxes, a list through [`Call::next`]. Needs no
    /// drop (issue 39: a thread-local that needs one is read after a test
    /// of its state, twice a call): [`GUARD`]'s frees the boxes at exit.
    pub(super) static FREE: Cell<ManuallyDrop<Option<Box<Call>>>> =
        const { Cell::new(ManuallyDrop::new(None)) };
    /// Whether [`GUARD`] will free [`FREE`]'s boxes: [`UNGUARDED`],
    /// [`GUARDED`] or [`GONE`]. A box is kept only while [`GUARDED`].
    pub(super) static GUARD_STATE: Cell<u8> = const { Cell::new(UNGUARDED) };
    /// Frees [`FREE`]'s boxes when the thread exits; registered by the first
    /// box kept.
    static GUARD: Guard = const { Guard };
}

/// [`GUARD`] is not registered yet: no box is kept.
pub(super) const UNGUARDED: u8 = 0;
/// [`GUARD`] is registered: boxes are kept.
pub(super) const GUARDED: u8 = 1;
/// [`GUARD`] was dropped (the thread is exiting): boxes given are freed.
pub(super) const GONE: u8 = 2;

/// Frees this thread's free boxes when it exits ([`GUARD`]).
pub(super) struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        GUARD_STATE.set(GONE);
        drop(ManuallyDrop::into_inner(FREE.take()));
    }
}

/// This thread's free list, taken (empty until set again).
#[inline]
pub(super) fn free_head() -> Option<Box<Call>> {
    ManuallyDrop::into_inner(FREE.take())
}

impl Call {
    /// A call whose decision began at `start` (`None`: no rule matched, the
    /// call is admitted and recorded as far as rules go), with the rule of
    /// its shortest matched timeout (issue 39: set once, not reset and then
    /// set), from this thread's free list when it has one. The rule is
    /// taken by reference (issue 39: copied as one word, not as its two
    /// halves).
    #[inline]
    pub(crate) fn take(start: Option<Now>, timeout: &Option<u32>) -> Box<Self> {
        let free = free_head().map(|mut call| {
            FREE.set(ManuallyDrop::new(call.next.take()));
            call
        });
        // A decision's call is marked admitted from the start (issue 39: not
        // by one more store when it is): one that is not at once is marked
        // deciding (`Call::deciding`).
        let course = Course::at(if start.is_none() {
            Progress::Recorded
        } else {
            Progress::Admitted
        });
        let marks = Marks {
            awaits_grpc_status: false,
            has_bytes: false,
            course,
            caller_deadline: false,
        };
        match free {
            Some(mut call) => {
                // Blank but for these (`give`).
                if let Some(start) = start {
                    call.start = start;
                }
                call.timeout = *timeout;
                call.marks = marks;
                call
            }
            None => Box::new(Self {
                snap: None,
                plain: Plain::default(),
                held: Vec::new(),
                refused: Vec::with_capacity(2),
                keyed: None,
                start: start.unwrap_or_else(Now::read),
                timeout: *timeout,
                caller_deadline: None,
                marks,
                waits: Vec::new(),
                trace: None,
                next: None,
                kept: 0,
            }),
        }
    }

    /// Puts the box of an ended call on this thread's free list, blank
    /// (freed when the list is full). Its snapshot was taken (and dropped)
    /// by the caller (issue 39: the pointer is tested once, not again here).
    #[inline]
    pub(super) fn give(mut self: Box<Self>) {
        if self.marks.course.aside() {
            self.put_back_aside();
        }
        self.give_plain();
    }

    /// [`Call::give`] of a box that holds nothing aside (issue 39: told by
    /// the caller, with the rest of its course).
    #[inline]
    pub(super) fn give_plain(mut self: Box<Self>) {
        debug_assert!(self.snap.is_none());
        debug_assert!(!self.marks.course.aside());
        self.plain = Plain::default();
        // A box in use has no next (`take` took it): nothing to drop, and
        // nothing to set on an empty list (issue 39: not even the test of
        // it; the count of an empty list's one box a constant).
        debug_assert!(self.next.is_none());
        match free_head() {
            // An empty list keeps a box only once its guard will free it.
            None if GUARD_STATE.get() == GUARDED => {
                self.kept = 1;
                FREE.set(ManuallyDrop::new(Some(self)));
            }
            None => Self::give_unguarded(self),
            Some(head) if head.kept < KEPT => {
                self.kept = head.kept + 1;
                std::mem::forget(self.next.replace(head));
                FREE.set(ManuallyDrop::new(Some(self)));
            }
            // Full: this box is freed.
            Some(head) => FREE.set(ManuallyDrop::new(Some(head))),
        }
    }

    /// [`Call::give`] to an empty list without a guard: registers the
    /// guard and keeps the box, or frees it when the thread is exiting.
    #[cold]
    #[inline(never)]
    fn give_unguarded(mut self: Box<Self>) {
        if GUARD_STATE.get() == UNGUARDED && GUARD.try_with(|_| ()).is_ok() {
            GUARD_STATE.set(GUARDED);
            self.kept = 1;
            FREE.set(ManuallyDrop::new(Some(self)));
        }
    }
}
