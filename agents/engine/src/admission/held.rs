//! [`Held`]: what an admitted call holds of one rule that granted it.

use smallvec::SmallVec;

use crate::primitive::Grant;
use crate::state::Scope;

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
}
