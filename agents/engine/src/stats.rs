//! Per-rule counters (thread-striped atomics, bumped on the request path
//! without a locked instruction) and the snapshot the agent reads about once
//! a second for `/metrics` and the control plane's `Stats` message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use gov_proto::v1::{self as proto, RuleKind};

use crate::rejection::RejectReason;
use crate::stripe::{self, Slot, Striped};

/// Upper bounds (inclusive, milliseconds) of the latency buckets; one more
/// bucket counts everything above the last bound.
/// The wire's table ([`gov_proto::LATENCY_BOUNDS_MS`]).
pub const LATENCY_BUCKETS_MS: [u64; 7] = gov_proto::LATENCY_BOUNDS_MS;

/// Number of latency buckets (`LATENCY_BUCKETS_MS` plus `+Inf`).
pub const LATENCY_BUCKETS: usize = LATENCY_BUCKETS_MS.len() + 1;

/// Counters of one rule. Cumulative since the rule's state was created
/// (state survives config swaps that keep the rule unchanged).
///
/// Everything bumped per request is thread-striped ([`crate::stripe`]):
/// the request path writes its own thread's stripe without a locked
/// instruction; [`Counters::snapshot`] sums the stripes.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    stripes: Striped<Stripe>,
    /// Calls waiting now (incremented and decremented, possibly on
    /// different threads: one shared atomic, off the fast path).
    pub waiting: AtomicU64,
}

/// One thread's share of a rule's counters, in whole cache lines (aligned
/// so that two threads never write the same line): its words are
/// `3 + 2 x RejectReason::COUNT + LATENCY_BUCKETS + GRPC_CODES`. With 6
/// reasons that is 40 words in five lines; a seventh reason makes it six
/// lines (a rule holds one stripe per CPU and one more).
#[derive(Debug, Default)]
#[repr(align(64))]
struct Stripe {
    admitted: AtomicU64,
    /// Admissions dropped without a recorded outcome. Every other admission
    /// ends in a latency bucket: `in_flight = admitted - buckets - unrecorded`.
    unrecorded: AtomicU64,
    rejected: [AtomicU64; RejectReason::COUNT],
    /// Shadow rules: calls that would have been rejected (and went on).
    shadow_rejected: [AtomicU64; RejectReason::COUNT],
    latency: [AtomicU64; LATENCY_BUCKETS],
    /// Sum of the latencies counted in `latency`, in microseconds (the
    /// histogram's `_sum`).
    latency_sum_us: AtomicU64,
    /// gRPC calls by the code they ended with.
    grpc: [AtomicU64; GRPC_CODES],
}

/// Number of gRPC status codes (`GrpcCode`, 0 to 16).
pub const GRPC_CODES: usize = gov_proto::grpc::CODES.len();

impl Counters {
    pub(crate) fn admit(&self, slot: Slot) {
        let (s, owned) = self.stripes.get(slot);
        stripe::add(&s.admitted, owned, 1);
    }

    pub(crate) fn reject(&self, slot: Slot, reason: RejectReason) {
        let (s, owned) = self.stripes.get(slot);
        stripe::add(&s.rejected[reason as usize], owned, 1);
    }

    /// A gRPC call ended with `code`.
    pub(crate) fn grpc(&self, slot: Slot, code: proto::GrpcCode) {
        let (s, owned) = self.stripes.get(slot);
        if let Some(c) = s.grpc.get(code as usize) {
            stripe::add(c, owned, 1);
        }
    }

    /// A shadow rule would have rejected a call for `reason`.
    pub(crate) fn shadow_reject(&self, slot: Slot, reason: RejectReason) {
        let (s, owned) = self.stripes.get(slot);
        stripe::add(&s.shadow_rejected[reason as usize], owned, 1);
    }

    /// An admission ended without a recorded outcome.
    pub(crate) fn end(&self, slot: Slot) {
        let (s, owned) = self.stripes.get(slot);
        stripe::add(&s.unrecorded, owned, 1);
    }

    /// An admission ended with `latency`.
    #[inline]
    pub(crate) fn latency(&self, slot: Slot, latency: Latency) {
        let (s, owned) = self.stripes.get(slot);
        if let Some(c) = s.latency.get(latency.bucket) {
            stripe::add(c, owned, 1);
        }
        stripe::add(&s.latency_sum_us, owned, latency.micros);
    }

    pub(crate) fn snapshot(&self, rule: &Arc<str>, kind: RuleKind) -> RuleStats {
        let mut admitted = 0u64;
        let mut unrecorded = 0u64;
        let mut rejected = [0u64; RejectReason::COUNT];
        let mut shadow_rejected = [0u64; RejectReason::COUNT];
        let mut latency = [0u64; LATENCY_BUCKETS];
        let mut latency_sum_us = 0u64;
        let mut grpc = [0u64; GRPC_CODES];
        let sum = |total: &mut u64, c: &AtomicU64| *total = total.wrapping_add(c.load(Relaxed));
        for s in self.stripes.all() {
            sum(&mut admitted, &s.admitted);
            sum(&mut unrecorded, &s.unrecorded);
            for (t, c) in rejected.iter_mut().zip(&s.rejected) {
                sum(t, c);
            }
            for (t, c) in shadow_rejected.iter_mut().zip(&s.shadow_rejected) {
                sum(t, c);
            }
            for (t, c) in latency.iter_mut().zip(&s.latency) {
                sum(t, c);
            }
            sum(&mut latency_sum_us, &s.latency_sum_us);
            for (t, c) in grpc.iter_mut().zip(&s.grpc) {
                sum(t, c);
            }
        }
        let ended = latency.iter().sum::<u64>() + unrecorded;
        RuleStats {
            rule: rule.clone(),
            kind,
            in_flight: admitted.saturating_sub(ended),
            waiting: self.waiting.load(Relaxed),
            admitted,
            rejected,
            shadow_rejected,
            shadow: false,
            latency,
            latency_sum: Duration::from_micros(latency_sum_us),
            grpc,
            fuse: None,
            limit_engaged: false,
            engaged_keys: Vec::new(),
            engaged_keys_truncated: false,
            capacity: 0,
            keys: 0,
            keys_overflowed: 0,
            retries: 0,
            retries_refused: 0,
        }
    }
}

/// One call's latency as the counters take it: its bucket and its
/// microseconds, worked out once for every rule that counts the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Latency {
    bucket: usize,
    micros: u64,
}

impl Latency {
    /// The latency of a call that took `nanos` nanoseconds (as
    /// [`bucket`] and `Duration::as_micros` take it, in integer arithmetic).
    #[inline]
    pub(crate) fn of_nanos(nanos: u64) -> Self {
        let ms = nanos / 1_000_000;
        Self {
            bucket: LATENCY_BUCKETS_MS
                .iter()
                .position(|&b| ms <= b)
                .unwrap_or(LATENCY_BUCKETS_MS.len()),
            micros: nanos / 1_000,
        }
    }
}

/// The latency bucket index of `d`.
pub fn bucket(d: Duration) -> usize {
    let ms = d.as_millis();
    LATENCY_BUCKETS_MS
        .iter()
        .position(|&b| ms <= u128::from(b))
        .unwrap_or(LATENCY_BUCKETS_MS.len())
}

/// Most latched keys one limit's stats list (the wire stays small with
/// thousands of latched consumers; the control plane is told the list is cut).
pub const MAX_ENGAGED_KEYS: usize = 64;

/// A fuse's state as stats and the TUI show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseState {
    Closed,
    Open,
    HalfOpen,
}

/// One rule's stats at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleStats {
    /// `service/rule`.
    pub rule: Arc<str>,
    pub kind: RuleKind,
    /// Bulkheads: permits held. Other rules: admitted calls whose outcome
    /// is not yet recorded.
    pub in_flight: u64,
    /// Waiting for a bulkhead permit or a shaped slot now.
    pub waiting: u64,
    /// Admitted, cumulative.
    pub admitted: u64,
    /// Rejected, cumulative, indexed by `RejectReason as usize`.
    pub rejected: [u64; RejectReason::COUNT],
    /// Rules in mode shadow: calls they would have rejected (which went
    /// on), cumulative, indexed like `rejected`. Counted across a switch
    /// between shadow and enforce, as the rule's state is.
    pub shadow_rejected: [u64; RejectReason::COUNT],
    /// The rule is in mode shadow in the config in force.
    pub shadow: bool,
    /// Ended admissions by latency bucket (see [`LATENCY_BUCKETS_MS`]);
    /// not cumulative across buckets.
    pub latency: [u64; LATENCY_BUCKETS],
    /// The sum of the latencies in `latency`.
    pub latency_sum: Duration,
    /// gRPC calls by the code they ended with (index: the code).
    pub grpc: [u64; GRPC_CODES],
    /// Fuses only.
    pub fuse: Option<FuseState>,
    /// Limits only: engaged (latched) for at least one key.
    pub limit_engaged: bool,
    /// Limits only: the keys latched now, sorted, at most
    /// [`MAX_ENGAGED_KEYS`] (`""`: the rule's own counter).
    pub engaged_keys: Vec<Arc<str>>,
    /// More keys are latched than `engaged_keys` lists.
    pub engaged_keys_truncated: bool,
    /// `max_concurrent` for bulkheads, calls per window for limits, else 0.
    pub capacity: u64,
    /// Keyed limits and bulkheads: the keys (scopes) tracked now.
    pub keys: u64,
    /// Keyed limits and bulkheads: calls of a new key that found every
    /// tracked key engaged and went to the overflow (shared or refused),
    /// cumulative.
    pub keys_overflowed: u64,
    /// Retry rules: retries sent, cumulative.
    pub retries: u64,
    /// Retry rules: retries the budget refused, cumulative.
    pub retries_refused: u64,
}

impl RuleStats {
    /// Rejections for one reason.
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.rejected[reason as usize]
    }

    /// The wire form (`gov.v1.RuleStats`).
    pub fn to_proto(&self) -> proto::RuleStats {
        proto::RuleStats {
            rule: self.rule.to_string(),
            kind: self.kind as i32,
            in_flight: self.in_flight,
            waiting: self.waiting,
            admitted: self.admitted,
            rejected: Some(proto::Rejections::from_counts(self.rejected)),
            latency_buckets: self.latency.to_vec(),
            fuse_state: match self.fuse {
                None | Some(FuseState::Closed) => proto::FuseState::Closed,
                Some(FuseState::Open) => proto::FuseState::Open,
                Some(FuseState::HalfOpen) => proto::FuseState::HalfOpen,
            } as i32,
            limit_engaged: self.limit_engaged,
            engaged_keys: self.engaged_keys.iter().map(|k| k.to_string()).collect(),
            engaged_keys_truncated: self.engaged_keys_truncated,
            capacity: self.capacity,
            grpc_outcomes: if self.grpc.iter().all(|&n| n == 0) {
                Vec::new()
            } else {
                self.grpc.to_vec()
            },
            shadow_rejected: self
                .shadow_rejected
                .iter()
                .any(|&n| n > 0)
                .then(|| proto::Rejections::from_counts(self.shadow_rejected)),
            retries: self.retries,
            retries_refused: self.retries_refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stripe is the words its doc counts, in whole cache lines.
    #[test]
    fn a_stripe_is_its_counters_in_whole_cache_lines() {
        let words = 3 + 2 * RejectReason::COUNT + LATENCY_BUCKETS + GRPC_CODES;
        let size = std::mem::size_of::<Stripe>();
        assert_eq!(size, (words * 8).next_multiple_of(64), "{words} words");
    }

    #[test]
    fn buckets_are_inclusive_upper_bounds() {
        for d in [
            0,
            999,
            10_000_000,
            10_500_000,
            11_000_000,
            1_000_000_000,
            1_000_000_001,
            u64::MAX,
        ] {
            let latency = Latency::of_nanos(d);
            let d = Duration::from_nanos(d);
            assert_eq!(latency.bucket, bucket(d));
            assert_eq!(latency.micros, d.as_micros() as u64);
        }
        assert_eq!(bucket(Duration::from_millis(0)), 0);
        assert_eq!(bucket(Duration::from_millis(10)), 0);
        assert_eq!(bucket(Duration::from_micros(10_500)), 0);
        assert_eq!(bucket(Duration::from_millis(11)), 1);
        assert_eq!(bucket(Duration::from_millis(1000)), 6);
        assert_eq!(bucket(Duration::from_millis(1001)), 7);
    }
}
