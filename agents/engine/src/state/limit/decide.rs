//! A call's decision in one limit without waiting, off the inline path
//! of a plain limit's own counter ([`Limit::plain`], issue 39): any scope
//! and set-up, a refusal, and whether a limit is plain.

use std::time::Duration;

use std::sync::atomic::Ordering::Relaxed;

use super::{
    Algorithm, CellRef, Exceeded, LEASE_FIRST, Limit, LimitCell, NOT_ENGAGED, Paced, Plain,
    RateSpec, ms, scope_ref,
};
use crate::clock::Now;
use crate::divisor::Divisor;
use crate::primitive::Answer;
use crate::state::limit::algo::{interval_ns, tolerance_ns};

impl Limit {
    /// `Primitive::try_acquire` in the limit's own scope, of a decision
    /// that began `now`, inline (the one part of this file that is): `Ok`
    /// for a plain limit's grant (the default), or a paced one's at once,
    /// any other answer (a grant of the other paths too) in `Err` (issue
    /// 39: such a grant is then a constant where it is held, not an answer
    /// merged through memory with the out-of-line paths').
    #[inline(always)]
    pub(crate) fn try_acquire_own(&self, now: Now) -> Result<(), Answer> {
        if let Some(plain) = &self.plain
            && self.single.engaged_until.load(Relaxed) == NOT_ENGAGED
        {
            return match Self::plain_calls(&self.single, plain, now.ns(), self.epoch_ns) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.refused(&self.single, e, now, now)),
            };
        }
        // A paced limit's call that fits at once too (issue 39: its grant a
        // constant, not an answer through memory); any other is counted
        // by `try_acquire_any`, as if this had not looked.
        if Self::paced_at_once(&self.single, self.paced.as_ref(), now.ns(), self.epoch_ns) {
            return Ok(());
        }
        Err(self.try_acquire_any(None, now, now))
    }

    /// [`Primitive::try_acquire`](crate::primitive::Primitive::try_acquire) of any scope and set-up.
    #[inline(never)]
    pub(super) fn try_acquire_any(&self, scope: Option<&CellRef>, now: Now, start: Now) -> Answer {
        if scope.is_none()
            && let Some(paced) = &self.paced
            && self.single.engaged_until.load(Relaxed) == NOT_ENGAGED
        {
            // As `try_admit` would go after its latch test: a paced limit
            // counts no bytes, its grant is the default.
            let since_ns = now.ns().saturating_sub(self.epoch_ns);
            return match Self::paced_calls(&self.single, paced, since_ns) {
                Ok(()) => Answer::Granted(crate::primitive::Grant::default()),
                Err(e) => self.refused(&self.single, e, now, start),
            };
        }
        if let Some(CellRef::Full) = scope {
            return self.no_room(now.at());
        }
        if self.remote() {
            // `sync exact`: counted in the store, asynchronously.
            return Answer::Wait(Duration::ZERO);
        }
        let scope = scope_ref(scope);
        let cell = self.cell(scope);
        let admitted = match scope {
            CellRef::Own(class, crit) => self.try_admit_as(cell, now, *class, *crit),
            _ => self.try_admit(cell, now),
        };
        match admitted {
            Ok(()) => Answer::Granted(self.grant()),
            Err(e) => self.refused(cell, e, now, start),
        }
    }

    /// A call `cell` did not admit at once.
    #[cold]
    #[inline(never)]
    pub(super) fn refused(&self, cell: &LimitCell, e: Exceeded, now: Now, start: Now) -> Answer {
        match e {
            // `sync batch` with an empty lease: asked from the store.
            LEASE_FIRST => Answer::Wait(Duration::ZERO),
            e => self.shape(cell, e, now.at(), start.at()),
        }
    }

    /// Sets [`Limit::plain`] and [`Limit::paced`] by this limit's spec and
    /// set-up.
    pub(super) fn set_plain(&mut self) {
        self.plain = self.plain_window();
        self.paced = match (&self.spec.calls, self.spec.algorithm) {
            (Some(rate), Algorithm::SlidingWindow) if self.alone() => {
                let w_ms = ms(rate.window).max(1);
                Some(match self.plain_numbers(rate) {
                    Some(window) => Paced::SlidingPlain(window),
                    None => Paced::Sliding {
                        amount: rate.amount,
                        w_ms,
                        w: Divisor::new(w_ms),
                    },
                })
            }
            (Some(rate), Algorithm::TokenBucket { burst }) if self.alone() => Some(Paced::Bucket {
                interval_ns: interval_ns(rate),
                tolerance_ns: tolerance_ns(rate, burst),
            }),
            _ => None,
        };
    }

    /// Calls are counted here alone: no store, no bytes, no share, no
    /// warm-up weight.
    fn alone(&self) -> bool {
        self.cluster.is_none()
            && self.spec.bytes.is_none()
            && self.share.is_none()
            && self.weight.is_none()
    }

    /// [`Limit::plain`] of this limit's spec and set-up.
    fn plain_window(&self) -> Option<Plain> {
        match (&self.spec.calls, self.spec.algorithm) {
            (Some(rate), Algorithm::FixedWindow) if self.alone() => self.plain_numbers(rate),
            _ => None,
        }
    }

    /// The [`Plain`] numbers of a window of `rate`: none for a window of
    /// 584 years or more, nor for an epoch 292 years or more after the
    /// clock's base (`plain_calls` and `paced_at_once` take a time before
    /// it for one past the multiply's range).
    fn plain_numbers(&self, rate: &RateSpec) -> Option<Plain> {
        if self.epoch_ns >= 1 << 63 {
            return None;
        }
        Plain::new(rate)
    }
}

impl Plain {
    /// The numbers of a window of `rate`: none for a window of 584 years
    /// or more (its nanoseconds past a `u64`).
    pub(super) fn new(rate: &RateSpec) -> Option<Self> {
        let w_ms = ms(rate.window).max(1);
        let w_ns = w_ms.checked_mul(1_000_000)?;
        Some(Self {
            amount: rate.amount,
            room: rate.amount.min(0xffff_ffff),
            at: 32,
            w_ms,
            w_ns: Divisor::new(w_ns),
        })
    }
}
