//! A retry rule: which attempts of an outbound call may be sent again, and
//! its budget.
//!
//! The rule holds nothing of a call and refuses none: its step in a
//! decision (last, after the bulkheads) credits the budget with the call's
//! first attempt, and the proxy asks it, through the [`RetryPolicy`] of the
//! admission, whether an attempt's outcome is retried and whether the
//! budget pays for the retry. The retries happen inside the one admission:
//! the rules above the retry (bulkheads, limits, fuses) see one call, its
//! permit taken once and its final outcome recorded once.
//!
//! The budget is a token bucket in thousandths of a retry: every first
//! attempt credits it with the budget's share of a retry (20%: 200), time
//! credits it with `min` retries per period, it holds at most `min` retries
//! (at least one), and each retry takes one whole retry. Two atomics, no
//! allocation, no lock; time is `tokio::time`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::time::Instant;

use gov_proto::v1 as proto;

use crate::clock::{Now, ns};
use crate::config::invalid::{Ctx, InvalidConfig};
use crate::outcome::Outcome;
use crate::primitive::{Answer, Grant, Keys, Phase, Primitive};
use crate::rejection::RejectReason;
use crate::state::fuse::Classifier;
use crate::stats::{Counters, RuleStats};
use crate::stripe::Slot;

/// One retry in the budget's units.
const RETRY: i64 = 1000;

/// A retry rule's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetrySpec {
    /// The most attempts of one call, the first included (>= 1).
    pub attempts: u32,
    /// The outcomes of an attempt that are retried.
    pub on: Classifier,
    /// The wait before the first retry; each next one doubles it.
    pub backoff: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// Wait a uniform random time up to the backoff (full jitter).
    pub jitter: bool,
    /// The longest one attempt waits for its response head.
    pub per_try_timeout: Option<Duration>,
    pub budget: RetryBudgetSpec,
    /// The methods retried.
    pub methods: Vec<Method>,
}

/// `budget P% min N per D`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryBudgetSpec {
    /// The share of calls that may be retried, in thousandths of a percent.
    pub ratio_milli_percent: u32,
    /// Retries allowed per `per` whatever the calls.
    pub min_retries: u32,
    pub per: Duration,
}

/// The spec of a wire retry rule.
pub(crate) fn spec(ctx: &Ctx<'_>, r: &proto::Retry) -> Result<RetrySpec, InvalidConfig> {
    if r.attempts == 0 {
        return Err(ctx.err("`attempts` must be > 0"));
    }
    let Some(b) = &r.budget else {
        return Err(ctx.err("`budget` is missing: a retry rule always has one"));
    };
    if b.ratio_milli_percent > 100_000 {
        return Err(ctx.err("`budget.ratio_milli_percent` must be at most 100000 (100%)"));
    }
    let budget = RetryBudgetSpec {
        ratio_milli_percent: b.ratio_milli_percent,
        min_retries: b.min_retries,
        per: ctx.positive_ms("budget.per_ms", b.per_ms)?,
    };
    if r.methods.is_empty() {
        return Err(ctx.err("`methods` is missing: name the methods retried"));
    }
    let methods = r
        .methods
        .iter()
        .map(|m| {
            Method::from_bytes(m.as_bytes())
                .map_err(|_| ctx.err(format!("`methods`: `{m}` is not a method")))
        })
        .collect::<Result<_, _>>()?;
    Ok(RetrySpec {
        attempts: r.attempts,
        on: crate::state::fuse::classifier(ctx, "on", r.on.as_ref())?,
        backoff: ctx.positive_ms("backoff_ms", r.backoff_ms)?,
        backoff_max: ctx.positive_ms("backoff_max_ms", r.backoff_max_ms)?,
        jitter: r.jitter,
        per_try_timeout: (r.per_try_timeout_ms > 0)
            .then(|| Duration::from_millis(r.per_try_timeout_ms)),
        budget,
        methods,
    })
}

/// The token bucket of a retry rule.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Thousandths of a retry.
    tokens: AtomicI64,
    /// Up to when (`clock::ns`) time has credited the floor.
    credited_to: AtomicU64,
    /// What a first attempt credits.
    credit: i64,
    /// Nanoseconds per thousandth of a retry of the floor (0: no floor).
    floor_ns: u64,
    /// The most the bucket holds.
    cap: i64,
}

impl Budget {
    fn new(spec: &RetryBudgetSpec, now: Instant) -> Self {
        let cap = i64::from(spec.min_retries.max(1)) * RETRY;
        let per_ns = u64::try_from(spec.per.as_nanos()).unwrap_or(u64::MAX);
        let floor_ns = match u64::from(spec.min_retries) * 1000 {
            0 => 0,
            milli => (per_ns / milli).max(1),
        };
        Self {
            tokens: AtomicI64::new(cap),
            credited_to: AtomicU64::new(ns(now)),
            // 100% (100000 milli-percent) is one retry per call.
            credit: i64::from(spec.ratio_milli_percent) / 100,
            floor_ns,
            cap,
        }
    }

    fn add(&self, milli: i64) {
        let _ = self.tokens.fetch_update(Relaxed, Relaxed, |t| {
            Some(t.saturating_add(milli).min(self.cap))
        });
    }

    /// A call's first attempt.
    #[inline]
    fn deposit(&self) {
        if self.credit > 0 && self.tokens.load(Relaxed) < self.cap {
            self.add(self.credit);
        }
    }

    /// Credits the floor for the time since it was last credited.
    fn refill(&self, now: Instant) {
        if self.floor_ns == 0 {
            return;
        }
        let now = ns(now);
        let from = self.credited_to.load(Relaxed);
        let milli = now.saturating_sub(from) / self.floor_ns;
        if milli == 0 {
            return;
        }
        // Only the time that made whole thousandths is spent; the rest
        // counts toward the next.
        let to = from + milli * self.floor_ns;
        if self
            .credited_to
            .compare_exchange(from, to, Relaxed, Relaxed)
            .is_ok()
        {
            self.add(i64::try_from(milli).unwrap_or(i64::MAX));
        }
    }

    /// Pays for one retry; `false` when the bucket cannot.
    fn withdraw(&self, now: Instant) -> bool {
        self.refill(now);
        self.tokens
            .fetch_update(Relaxed, Relaxed, |t| (t >= RETRY).then_some(t - RETRY))
            .is_ok()
    }
}

/// The state of one retry rule.
#[derive(Debug)]
// `counters` first and one alignment for every primitive: at the same
// offset of each (`state::tests`, issue 39), so `State::counters` reads
// them without a match on the kind.
#[repr(C, align(64))]
pub(crate) struct Retry {
    pub(crate) counters: Counters,
    pub(crate) spec: RetrySpec,
    name: Arc<str>,
    budget: Budget,
    /// Retries sent.
    retries: AtomicU64,
    /// Retries the budget refused.
    refused: AtomicU64,
    /// The jitter's random sequence.
    seed: AtomicU64,
}

impl Retry {
    pub(crate) fn new(spec: RetrySpec, name: Arc<str>) -> Self {
        let now = Instant::now();
        Self {
            budget: Budget::new(&spec.budget, now),
            spec,
            name,
            counters: Counters::default(),
            retries: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            seed: AtomicU64::new(ns(now)),
        }
    }

    /// A random number (splitmix64 over a shared counter).
    fn random(&self) -> u64 {
        let mut z = self
            .seed
            .fetch_add(0x9E37_79B9_7F4A_7C15, Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// What the proxy asks of the retry rule that matched a call (the first
/// in the config's order when several did): an [`crate::Admission`] gives
/// it ([`crate::Admission::retry`]), and an admitted request on hyper's side
/// carries it as an extension.
#[derive(Clone, Debug)]
pub struct RetryPolicy(pub(crate) Arc<Retry>);

impl RetryPolicy {
    /// The rule, `service/name`.
    pub fn rule(&self) -> &Arc<str> {
        &self.0.name
    }

    /// The most attempts of one call, the first included.
    pub fn attempts(&self) -> u32 {
        self.0.spec.attempts
    }

    /// Whether a call with this method may be sent again.
    pub fn retries_method(&self, method: &Method) -> bool {
        self.0.spec.methods.contains(method)
    }

    /// Whether an attempt that ended so is retried.
    pub fn retries(&self, outcome: Outcome) -> bool {
        let on = &self.0.spec.on;
        match outcome {
            Outcome::Status(code) => on.has_status(code),
            Outcome::Grpc(code) => on.has_grpc(code),
            Outcome::ConnectFailure => on.connect_failure,
            Outcome::Timeout => on.timeout,
            Outcome::Reset => on.reset,
        }
    }

    /// The longest one attempt waits for its response head.
    pub fn per_try_timeout(&self) -> Option<Duration> {
        self.0.spec.per_try_timeout
    }

    /// The wait before retry `n` (1 for the first retry).
    pub fn backoff(&self, n: u32) -> Duration {
        let s = &self.0.spec;
        let doubled = s
            .backoff
            .saturating_mul(1u32 << n.saturating_sub(1).min(20))
            .min(s.backoff_max);
        if !s.jitter {
            return doubled;
        }
        let nanos = u64::try_from(doubled.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.0.random() % nanos.saturating_add(1))
    }

    /// Asks the budget for one retry: `true` when it pays (the retry is
    /// counted as sent), `false` when it cannot (counted as refused; the
    /// call ends with its attempt's outcome).
    pub fn try_retry(&self) -> bool {
        let paid = self.0.budget.withdraw(Instant::now());
        if paid {
            self.0.retries.fetch_add(1, Relaxed);
        } else {
            self.0.refused.fetch_add(1, Relaxed);
        }
        paid
    }
}

impl Primitive for Retry {
    const PHASE: Phase = Phase::Retries;

    type Scope = ();

    fn scope(&self, _keys: &Keys<'_>) {}

    /// Always granted: the call's first attempt credits the budget.
    #[inline]
    fn try_acquire(&self, _scope: Option<&()>, _now: Now, _start: Now) -> Answer {
        self.budget.deposit();
        Answer::Granted(Grant::default())
    }

    async fn acquire(
        &self,
        _scope: Option<&()>,
        _start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)> {
        Ok(Grant::default())
    }

    fn release(&self, _scope: Option<&()>, _grant: Grant) {}

    fn record(&self, _slot: Slot, _outcome: Outcome, _grant: Grant, _now: Now, _elapsed_ns: u64) {}

    /// Never used: a retry rule refuses nothing.
    fn reject_status(&self) -> StatusCode {
        StatusCode::SERVICE_UNAVAILABLE
    }

    fn reject_grpc(&self) -> gov_proto::v1::GrpcCode {
        gov_proto::v1::GrpcCode::Unavailable
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn stats(&self, stats: &mut RuleStats) {
        stats.retries = self.retries.load(Relaxed);
        stats.retries_refused = self.refused.load(Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(percent: u32, min: u32, per_ms: u64) -> RetryPolicy {
        let spec = RetrySpec {
            attempts: 3,
            on: Classifier::default(),
            backoff: Duration::from_millis(25),
            backoff_max: Duration::from_millis(250),
            jitter: false,
            per_try_timeout: None,
            budget: RetryBudgetSpec {
                ratio_milli_percent: percent * 1000,
                min_retries: min,
                per: Duration::from_millis(per_ms),
            },
            methods: vec![Method::GET],
        };
        RetryPolicy(Arc::new(Retry::new(spec, "s/r".into())))
    }

    fn first_attempts(p: &RetryPolicy, n: usize) {
        for _ in 0..n {
            let _ = p.0.try_acquire(None, Now::read(), Now::read());
        }
    }

    fn stats(p: &RetryPolicy) -> (u64, u64) {
        (p.0.retries.load(Relaxed), p.0.refused.load(Relaxed))
    }

    /// The floor: `min` retries at once, then `min` per period as time
    /// passes, never more than `min` held.
    #[tokio::test(start_paused = true)]
    async fn the_floor_refills_with_time_and_holds_at_most_min() {
        let p = policy(0, 2, 1000);
        assert!(p.try_retry());
        assert!(p.try_retry());
        assert!(!p.try_retry(), "two retries per second, both spent");
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(!p.try_retry(), "not yet a whole retry back");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(p.try_retry(), "half a period: one retry back");
        assert!(!p.try_retry());
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(p.try_retry());
        assert!(p.try_retry());
        assert!(!p.try_retry(), "an idle hour banks no more than `min`");
        assert_eq!(stats(&p), (5, 4));
    }

    /// The share: each first attempt credits a fifth of a retry at 20%.
    #[tokio::test(start_paused = true)]
    async fn calls_credit_their_share_and_retries_spend_it() {
        let p = policy(20, 1, 3_600_000);
        assert!(p.try_retry(), "the one retry the floor holds");
        assert!(!p.try_retry());
        first_attempts(&p, 4);
        assert!(!p.try_retry(), "four calls are 80% of a retry");
        first_attempts(&p, 1);
        assert!(p.try_retry(), "five calls at 20% pay one retry");
        assert!(!p.try_retry());
        // Over many calls, retries stay at the share.
        let mut paid = 0;
        for _ in 0..1000 {
            first_attempts(&p, 1);
            if p.try_retry() {
                paid += 1;
            }
        }
        assert_eq!(paid, 200);
    }

    /// Without a floor the bucket still holds one retry: a rule that
    /// retries 10% of calls can retry the first call that fails.
    #[tokio::test(start_paused = true)]
    async fn no_floor_still_starts_with_one_retry() {
        let p = policy(10, 0, 1000);
        assert!(p.try_retry());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!p.try_retry(), "no floor: time credits nothing");
        first_attempts(&p, 10);
        assert!(p.try_retry());
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_up_to_its_cap_and_jitter_stays_below() {
        let p = policy(20, 1, 1000);
        let ms = |n| p.backoff(n).as_millis();
        assert_eq!((ms(1), ms(2), ms(3), ms(4), ms(5)), (25, 50, 100, 200, 250));
        assert_eq!(ms(1000), 250);
        let mut spec = p.0.spec.clone();
        spec.jitter = true;
        let j = RetryPolicy(Arc::new(Retry::new(spec, "s/j".into())));
        let waits: Vec<Duration> = (0..50).map(|_| j.backoff(3)).collect();
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(100)));
        assert!(waits.iter().any(|w| *w != waits[0]), "jitter varies");
    }
}
