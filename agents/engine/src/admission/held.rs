//! [`Held`] and [`Plain`]: what an admitted call holds of the rules that
//! granted it, and the helpers of the passes over them.

use std::time::Duration;

use smallvec::SmallVec;

use crate::primitive::Grant;
use crate::rejection::RejectReason;
use crate::snapshot::Snapshot;
use crate::state::{Scope, State};

/// The keyed scopes of a call's holds (consumers, instances), by rule;
/// `None` (no drop to run) until a rule keys the call.
pub(super) type Keyed = Option<SmallVec<[(u32, Scope); 1]>>;

/// What an admission holds of one rule that granted it until it ends, in
/// 8 bytes (issue 39: a hold is written by one step and read by three
/// passes). Copied whole: a keyed scope (an `Arc`) is kept aside in
/// [`Call::keyed`](super::call::Call).
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) rule: u32,
    /// [`PROBE`], [`BYTES`], [`KEYED`], [`GIVES_BACK`].
    bits: u8,
    /// The grant's share class.
    share_class: Option<u8>,
}

/// The grant is a half-open fuse's probe ([`Grant::probe`]).
const PROBE: u8 = 1;
/// The rule counts the call's bytes ([`Grant::bytes`]).
const BYTES: u8 = 2;
/// The scope is in `Call::keyed`, else the rule's own.
const KEYED: u8 = 4;
/// The rule has something to give back when the call ends (a bulkhead
/// permit, a fuse's probe): the end of the call visits only these.
const GIVES_BACK: u8 = 8;

impl Held {
    /// The hold of `grant` by `rule`.
    #[inline]
    pub(super) fn new(rule: u32, grant: Grant, keyed: bool, gives_back: bool) -> Self {
        let bit = |on: bool, bit: u8| if on { bit } else { 0 };
        Self {
            rule,
            bits: bit(grant.probe, PROBE)
                | bit(grant.bytes, BYTES)
                | bit(keyed, KEYED)
                | bit(gives_back || grant.probe, GIVES_BACK),
            share_class: grant.share_class,
        }
    }

    /// What the rule granted (a system error is the call's, not kept here).
    #[inline]
    pub(super) fn grant(&self) -> Grant {
        Grant {
            probe: self.bits & PROBE != 0,
            bytes: self.bytes(),
            system_error: false,
            share_class: self.share_class,
        }
    }

    /// Whether the rule counts the call's bytes.
    #[inline]
    pub(super) fn bytes(&self) -> bool {
        self.bits & BYTES != 0
    }

    /// Whether the scope is a keyed one, in `Call::keyed`.
    #[inline]
    pub(super) fn keyed(&self) -> bool {
        self.bits & KEYED != 0
    }

    /// Whether the end of the call visits the rule.
    #[inline]
    pub(super) fn gives_back(&self) -> bool {
        self.bits & GIVES_BACK != 0
    }
}

/// A call's plain holds (issue 39: most holds): the rules below 64 that
/// granted it with nothing to keep (no probe, no bytes, no share class, in
/// their own scope), a bit each (a step sets one, not a [`Held`] pushed).
/// What each granted is [`Grant::default`]; those that give back at the
/// end are told by the snapshot's mask ([`Snapshot::gives_back`]), not
/// kept here (issue 39: one word a step sets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plain {
    held: u64,
}

impl Plain {
    /// Holds `rule`'s `grant` here when it is plain (and the rule's own
    /// scope): whether it did.
    #[inline]
    pub(super) fn add(&mut self, rule: u32, grant: Grant) -> bool {
        // Field by field (issue 39: a grant a kind's arm built of constants
        // is then tested by none; compared whole, it was read back).
        let Grant {
            probe,
            bytes,
            system_error,
            share_class,
        } = grant;
        if probe || bytes || system_error || share_class.is_some() || rule >= 64 {
            return false;
        }
        self.held |= 1 << rule;
        true
    }

    /// The rules held here or in `other`.
    #[inline]
    pub(super) fn joined(self, other: Plain) -> Plain {
        Plain {
            held: self.held | other.held,
        }
    }

    /// The rules held, lowest first.
    #[inline]
    pub(super) fn rules(self) -> Bits {
        Bits(self.held)
    }

    /// The rules held that give back at the end, lowest first, of those
    /// that do in the snapshot (`gives_back`: [`Snapshot::gives_back`]).
    #[inline]
    pub(super) fn giving(self, gives_back: u64) -> Bits {
        Bits(self.held & gives_back)
    }
}

/// The rules of a mask, lowest first.
pub(super) struct Bits(u64);

impl Iterator for Bits {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let rule = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(rule)
    }
}

/// The state of `rule`, a rule a call of `states`' snapshot holds (in
/// bounds). Its panic is out of line (issue 39: a pass over the holds
/// indexed `states`, and kept the panic's location in a register or on the
/// stack throughout).
#[inline(always)]
pub(super) fn state_of(states: &[State], rule: u32) -> &State {
    match states.get(rule as usize) {
        Some(state) => state,
        None => past_the_states(rule, states.len()),
    }
}

/// A rule past its snapshot's states: a broken invariant.
#[cold]
#[inline(never)]
fn past_the_states(rule: u32, len: usize) -> ! {
    panic!("rule {rule} held past the snapshot's {len} states")
}

/// What `h` gives back once its call recorded an outcome: not a probe (it
/// reported).
#[inline]
pub(super) fn reported(h: &Held) -> Grant {
    Grant {
        probe: false,
        ..h.grant()
    }
}

/// The keyed scope in `keyed` held for `h` (`None`: the rule's own).
#[inline]
pub(super) fn scope_in<'a>(keyed: &'a Keyed, h: &Held) -> Option<&'a Scope> {
    if !h.keyed() {
        return None;
    }
    keyed_scope(keyed, h.rule)
}

/// The keyed scope in `keyed` of `rule`. Out of line (issue 39: inline, a
/// pass over the holds read `keyed` before its first hold, keyed or not).
#[inline(never)]
fn keyed_scope(keyed: &Keyed, rule: u32) -> Option<&Scope> {
    keyed
        .iter()
        .flatten()
        .find_map(|(r, scope)| (*r == rule).then_some(scope))
}

/// A shadow rule's deadline is not enforced: counts the calls that
/// outlived it as the timeouts it would have cut off.
#[cold]
pub(super) fn shadow_timeouts(
    snap: &Snapshot,
    rules: impl Iterator<Item = u32>,
    elapsed: Duration,
) {
    for rule in rules.filter(|&rule| snap.is_shadow(rule)) {
        if snap.states[rule as usize]
            .timeout()
            .is_some_and(|t| elapsed > t)
        {
            snap.shadow_reject(rule, RejectReason::Timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold is 8 bytes, and keeps what the rule granted.
    #[test]
    fn a_hold_is_one_word() {
        assert_eq!(std::mem::size_of::<Held>(), 8);
        let grant = Grant {
            probe: true,
            bytes: true,
            system_error: false,
            share_class: Some(3),
        };
        let h = Held::new(7, grant, true, false);
        assert_eq!((h.rule, h.grant()), (7, grant));
        assert!(h.keyed() && h.bytes() && h.gives_back());
        let plain = Held::new(1, Grant::default(), false, false);
        assert!(!plain.keyed() && !plain.bytes() && !plain.gives_back());
        assert_eq!(plain.grant(), Grant::default());
    }

    /// A rule past the states is a broken invariant, told as such (not
    /// skipped).
    #[test]
    #[should_panic(expected = "rule 3 held past the snapshot's 0 states")]
    fn a_rule_past_the_states_panics() {
        state_of(&[], 3);
    }

    /// Only a plain grant of a rule below 64 is held as a bit; the rules
    /// come back lowest first, those that give back apart.
    #[test]
    fn plain_holds_are_bits_of_rules_below_64() {
        let mut p = Plain::default();
        assert_eq!(p, Plain::default());
        assert!(p.add(9, Grant::default()));
        assert!(p.add(2, Grant::default()));
        assert!(p.add(63, Grant::default()));
        assert!(!p.add(64, Grant::default()), "rule 64 has no bit");
        for grant in [
            Grant {
                probe: true,
                ..Grant::default()
            },
            Grant {
                bytes: true,
                ..Grant::default()
            },
            Grant {
                share_class: Some(0),
                ..Grant::default()
            },
        ] {
            assert!(!p.add(5, grant), "{grant:?} is kept in a Held");
        }
        assert_eq!(p.rules().collect::<Vec<_>>(), [2, 9, 63]);
        let mut q = Plain::default();
        assert!(q.add(4, Grant::default()) && q.add(9, Grant::default()));
        assert_eq!(p.joined(q).rules().collect::<Vec<_>>(), [2, 4, 9, 63]);
        let gives_back = 1 << 2 | 1 << 5 | 1 << 63;
        assert_eq!(p.giving(gives_back).collect::<Vec<_>>(), [2, 63]);
    }
}
