//! What a decision is given of the rules a request matched: each rule's
//! [`RuleMeta`], the [`Plan`] of the rules matched, and where it is
//! ([`PlanAt`]).

use std::time::Duration;

use smallvec::SmallVec;

use crate::phase::Phase;

/// A dense index into [`CompiledConfig::rules`](crate::CompiledConfig::rules),
/// valid for one config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u32);

/// Matched rules kept inline (no allocation) per request.
pub const INLINE_RULES: usize = 8;

/// The rules that matched one request.
pub type Matched = SmallVec<[RuleId; INLINE_RULES]>;

/// What a decision needs of one rule, known when the config is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RuleMeta {
    /// Where its step runs in a decision.
    pub(crate) phase: Phase,
    /// Whether its scope needs the consumer (read from a header only then).
    pub(crate) consumer: bool,
    /// Whether its scope depends on the request ([`crate::state::RuleSpec::keyed`]).
    pub(crate) keyed: bool,
    /// The deadline it enforces on a call (`None` in mode shadow: a shadow
    /// rule's deadline is counted, not enforced).
    pub(crate) timeout: Option<Duration>,
    /// When it expires, in nanoseconds since the clock's base
    /// ([`crate::clock`]); `u64::MAX`: never.
    pub(crate) expires_ns: u64,
}

/// The rules one request matched, ready to decide with: in the order their
/// steps run (phase, then rule id, so every request takes its rules' scopes
/// in the same order), whether a scope needs the consumer, and the rule
/// with the shortest deadline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) steps: SmallVec<[(Phase, RuleId); INLINE_RULES]>,
    pub(crate) consumer: bool,
    /// Whether any rule's scope depends on the request (else no keys are
    /// read: every step is counted in its rule's own scope).
    pub(crate) keyed: bool,
    /// The shortest deadline and its rule (the lowest id among equals).
    pub(crate) timeout: Option<(Duration, RuleId)>,
    /// The id of `timeout`'s rule: what a call keeps of it (issue 39: read
    /// whole, not taken apart from the deadline).
    pub(crate) deadline_rule: Option<u32>,
}

impl Plan {
    /// Adds rule `id` (not in the plan yet) in its place.
    pub(crate) fn add(&mut self, id: RuleId, meta: &RuleMeta) {
        let key = (meta.phase, id);
        let at = self
            .steps
            .iter()
            .rposition(|s| *s < key)
            .map_or(0, |i| i + 1);
        self.steps.insert(at, key);
        self.consumer |= meta.consumer;
        self.keyed |= meta.keyed;
        if let Some(t) = meta.timeout
            && self.timeout.is_none_or(|current| (t, id) < current)
        {
            self.timeout = Some((t, id));
            self.deadline_rule = Some(id.0);
        }
    }

    /// Leaves out the rules expired at `now_ns` (their steps, their
    /// deadlines, their need of the consumer).
    pub(crate) fn drop_expired(&mut self, metas: &[RuleMeta], now_ns: u64) {
        let live = |id: RuleId| metas[id.0 as usize].expires_ns > now_ns;
        if self.ids().all(live) {
            return;
        }
        let kept = std::mem::take(self);
        for id in kept.ids().filter(|&id| live(id)) {
            self.add(id, &metas[id.0 as usize]);
        }
    }

    /// Whether no rule matched.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The matched rules, in step order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = RuleId> + '_ {
        self.steps.iter().map(|&(_, id)| id)
    }
}

/// Where the plan of one request is: the compiled plan of one index entry
/// (a node of its router, by its number), or built for it in the caller's
/// scratch plan ([`PlanAt::SCRATCH`]). A number, not an enum (issue 39: the
/// bounds test of a node's number tells the scratch plan apart too, no tag
/// is kept or tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PlanAt(u32);

impl PlanAt {
    /// The caller's scratch plan: a number past every node's (a config has
    /// at most [`MAX_RULES`](crate::config::MAX_RULES) paths a direction).
    pub(crate) const SCRATCH: PlanAt = PlanAt(u32::MAX);

    /// The node numbered `i` (of both routers, as one list).
    #[inline]
    pub(super) fn node(i: u32) -> Self {
        debug_assert!(i != u32::MAX);
        PlanAt(i)
    }

    /// Its node's number (of both routers, as one list), `None` for the
    /// scratch plan.
    #[inline]
    pub(crate) fn node_number(self) -> Option<u32> {
        (self != PlanAt::SCRATCH).then_some(self.0)
    }

    /// Its number as an index: the node's, or one no list of nodes reaches.
    #[inline]
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}
