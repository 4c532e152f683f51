//! A weighted fair share of one limit's calls between the consumers of its
//! calls (`share by consumer { crm 3  web 1  default 1 }` on a `limit`).
//!
//! Every call belongs to a class: a consumer the share names, or `default`
//! (every other consumer, and calls without one). The share counts each
//! class's admitted calls in fixed windows of the limit's `calls` window
//! (whatever the algorithm), and a class is *active* while it asked for a
//! call in the current window or the one before. With `N` the calls per
//! window (times the slow-start weight under `scale with warmup`) and `W`
//! the weights of the active classes summed, a call of class `i`:
//!
//! - is *within its share* while the class's calls in this window are fewer
//!   than `N x weight(i) / W`: the limit's algorithm alone decides it (so a
//!   class is sure of its share rounded down, and served up to it rounded
//!   up);
//! - else *borrows*: it is admitted only while the calls the algorithm would
//!   still admit now, less this one, cover what the other active classes
//!   below their share are still owed (`N x weight(j) / W - used(j)`,
//!   summed exactly). An idle class's share is lent; once it calls again it
//!   is active, owed its share, and the borrowers stop short of it.
//!
//! So a greedy consumer cannot use up a window before the polite ones ask:
//! it stops where the room left is what they are owed. A borrower refused
//! is not the limit exceeded: no latch engages for it.
//!
//! The counts sit behind one lock per limit, taken once per call (the
//! limit's algorithm runs under it, so the class counts follow the
//! algorithm's exactly); the classes are a table made once from the config,
//! so a call allocates nothing. `scope cluster` refuses a share (the share's
//! counts are one agent's).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::route::FxBuild;
use crate::state::bulkhead::share::ShareSpec;

/// A call's class: the index of its consumer's weight (the last: `default`).
pub(crate) type Class = u8;

/// One class's counts.
#[derive(Clone, Copy, Debug, Default)]
struct ClassCount {
    /// The last window it asked in, plus one (0: never).
    asked: u64,
    /// The window `used` counts in.
    window: u64,
    /// Calls admitted in `window`.
    used: u64,
}

impl ClassCount {
    fn used_in(&self, window: u64) -> u64 {
        if self.window == window { self.used } else { 0 }
    }

    /// Asked in `window` or the one before.
    fn active(&self, window: u64) -> bool {
        self.asked >= window.max(1)
    }
}

/// What the share says of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Within its share: the algorithm decides.
    Within,
    /// Over its share, and the room left covers what the others are owed.
    Borrows,
    /// Over its share, and the room left is owed to the others.
    Refused,
}

/// The share of one limit: its classes and their counts.
#[derive(Debug)]
pub(crate) struct LimitShare {
    classes: HashMap<Box<str>, Class, FxBuild>,
    /// By class; the last is `default`.
    weights: Box<[u32]>,
    counts: Mutex<Box<[ClassCount]>>,
}

/// The counts of a share, locked for one call.
pub(crate) struct Turn<'a> {
    share: &'a LimitShare,
    counts: MutexGuard<'a, Box<[ClassCount]>>,
    i: usize,
    window: u64,
}

impl LimitShare {
    pub(crate) fn new(spec: &ShareSpec) -> Self {
        let n = spec.weights.len() + 1;
        let mut weights = Vec::with_capacity(n);
        let mut classes = HashMap::with_capacity_and_hasher(n, FxBuild::default());
        for (i, (name, w)) in spec.weights.iter().enumerate() {
            classes.insert(name.clone(), Class::try_from(i).unwrap_or(Class::MAX));
            weights.push(*w);
        }
        weights.push(spec.default_weight);
        Self {
            classes,
            weights: weights.into(),
            counts: Mutex::new(vec![ClassCount::default(); n].into()),
        }
    }

    /// The class of a call of `consumer` (unknown or none: `default`).
    #[inline]
    pub(crate) fn class(&self, consumer: Option<&str>) -> Class {
        let default = (self.weights.len() - 1) as Class;
        consumer
            .and_then(|c| self.classes.get(c).copied())
            .unwrap_or(default)
    }

    /// Locks the counts for a call of `class` in share window `window`, and
    /// counts the class as active.
    pub(crate) fn turn(&self, class: Class, window: u64) -> Turn<'_> {
        let i = usize::from(class).min(self.weights.len() - 1);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts[i].asked = window.saturating_add(1);
        Turn {
            share: self,
            counts,
            i,
            window,
        }
    }

    /// Calls admitted in `window` by class (the last: `default`).
    #[cfg(test)]
    pub(crate) fn used(&self, window: u64) -> Vec<u64> {
        let c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        c.iter().map(|c| c.used_in(window)).collect()
    }
}

impl Turn<'_> {
    /// Whether the call may have one of `amount` calls per window: within its
    /// share, or borrowing; `room` (called only for a borrower): the calls
    /// the limit's algorithm would admit now.
    pub(crate) fn verdict(&self, amount: u64, room: impl FnOnce() -> u64) -> Verdict {
        let (c, w, window) = (&self.counts, &self.share.weights, self.window);
        let active: u64 = c
            .iter()
            .zip(w.iter())
            .filter(|(c, _)| c.active(window))
            .map(|(_, w)| u64::from(*w))
            .sum();
        let amount = u128::from(amount);
        let total = u128::from(active);
        // `used < amount x weight / active`, in integers.
        let owed = |j: usize| {
            (amount * u128::from(w[j])).saturating_sub(u128::from(c[j].used_in(window)) * total)
        };
        if owed(self.i) > 0 {
            return Verdict::Within;
        }
        let others: u128 = (0..c.len())
            .filter(|&j| j != self.i && c[j].active(window))
            .map(owed)
            .sum();
        // The room left after this call, against the others' shares.
        match room() {
            0 => Verdict::Refused,
            r if u128::from(r - 1) * total >= others => Verdict::Borrows,
            _ => Verdict::Refused,
        }
    }

    /// The call was admitted: counts it for its class.
    pub(crate) fn admitted(&mut self) {
        let (window, c) = (self.window, &mut self.counts[self.i]);
        if c.window != window {
            *c = ClassCount {
                window,
                used: 0,
                ..*c
            };
        }
        c.used += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crm` 3, `web` 1, `default` 1.
    fn share() -> LimitShare {
        LimitShare::new(&ShareSpec {
            weights: vec![("crm".into(), 3), ("web".into(), 1)],
            default_weight: 1,
        })
    }

    /// Admits a call of `class` in `window` of a limit of `amount` calls
    /// whose algorithm has `room` left; returns the verdict.
    fn call(s: &LimitShare, class: Class, window: u64, amount: u64, room: u64) -> Verdict {
        let mut t = s.turn(class, window);
        let v = t.verdict(amount, || room);
        if v != Verdict::Refused && room > 0 {
            t.admitted();
        }
        v
    }

    #[test]
    fn consumers_are_classes_and_every_other_one_is_default() {
        let s = share();
        assert_eq!(s.class(Some("crm")), 0);
        assert_eq!(s.class(Some("web")), 1);
        assert_eq!(s.class(Some("CRM")), 2, "names are exact");
        assert_eq!(s.class(None), 2);
    }

    /// Alone, a class is within its share of the whole window.
    #[test]
    fn a_lone_class_has_the_whole_window() {
        let s = share();
        for k in 0..10 {
            assert_eq!(call(&s, 1, 1, 10, 10 - k), Verdict::Within, "call {k}");
        }
        assert_eq!(s.used(1), [0, 10, 0]);
    }

    /// With crm (3) and web (1) active, web's share of 8 is 2; past it web
    /// borrows only while the room left covers what crm is still owed.
    #[test]
    fn a_borrower_stops_at_what_the_others_are_owed() {
        let s = share();
        assert_eq!(call(&s, 0, 1, 8, 8), Verdict::Within, "crm asks once");
        // crm holds 1 of its 6: owed 5. web: 2 within, then borrows while
        // the room after its call is >= 5.
        assert_eq!(call(&s, 1, 1, 8, 7), Verdict::Within);
        assert_eq!(call(&s, 1, 1, 8, 6), Verdict::Within);
        assert_eq!(call(&s, 1, 1, 8, 5), Verdict::Refused, "4 left < 5 owed");
        // crm still gets the rest.
        for room in (1..=5).rev() {
            assert_eq!(call(&s, 0, 1, 8, room), Verdict::Within);
        }
        assert_eq!(s.used(1), [6, 2, 0]);
        assert_eq!(call(&s, 1, 1, 8, 0), Verdict::Refused, "no room at all");
    }

    /// A class that has not asked for two windows is idle: its share is
    /// lent; once it asks again it is owed it.
    #[test]
    fn an_idle_share_is_lent_and_taken_back() {
        let s = share();
        assert_eq!(call(&s, 0, 1, 8, 8), Verdict::Within);
        // Window 3: crm asked last in 1, so web has the whole window.
        for k in 0..7 {
            assert_eq!(call(&s, 1, 3, 8, 8 - k), Verdict::Within, "call {k}");
        }
        // crm asks again: it is owed 6 of 8, web (7 of its 2) stops.
        assert_eq!(call(&s, 0, 3, 8, 1), Verdict::Within);
        assert_eq!(call(&s, 1, 3, 8, 3), Verdict::Refused);
        // In window 4 crm is still active (it asked in 3).
        assert_eq!(call(&s, 1, 4, 8, 8), Verdict::Within);
        assert_eq!(call(&s, 1, 4, 8, 7), Verdict::Within);
        assert_eq!(call(&s, 1, 4, 8, 6), Verdict::Refused, "5 left < 6 owed");
    }

    /// Equal weights that do not divide the amount: each is sure of its
    /// share rounded down, and a borrower leaves the others theirs exactly.
    #[test]
    fn shares_that_do_not_divide_the_amount() {
        let s = LimitShare::new(&ShareSpec {
            weights: vec![("a".into(), 1), ("b".into(), 1)],
            default_weight: 1,
        });
        // All three active; 10 per window: 3.33 each.
        for class in 0..3 {
            assert_eq!(
                call(&s, class, 1, 10, 10 - u64::from(class)),
                Verdict::Within
            );
        }
        // a: within up to 4 (3 < 3.33).
        for room in [7, 6, 5] {
            assert_eq!(call(&s, 0, 1, 10, room), Verdict::Within);
        }
        // b and default are owed 2.33 each: a borrows with 6 left, not 5.
        assert_eq!(call(&s, 0, 1, 10, 5), Verdict::Refused, "4 left < 4.67");
        assert_eq!(call(&s, 0, 1, 10, 6), Verdict::Borrows, "5 left >= 4.67");
    }
}
