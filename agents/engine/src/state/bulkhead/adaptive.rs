//! An adaptive bulkhead's limit (`max_concurrent adaptive min N max M`): a
//! gradient on the latency of the calls it admitted, against a long-term
//! baseline, in the manner of Netflix's Gradient2, with guards for the
//! failure modes of the known implementations.
//!
//! Each recorded call adds its latency to the current window: one atomic
//! add of a packed word (sum of microseconds, count), no lock and no
//! allocation. The first record that finds the window at least [`WINDOW`]
//! long with at least [`MIN_SAMPLES`] samples (or the limit's worth, if
//! fewer) takes the estimate's lock
//! (`try_lock`: a record never waits for it), closes the window and moves
//! the limit once:
//!
//! - the window's mean latency `avg`, and the mean calls in flight over it
//!   (Little's law: the latency summed over the window's length);
//! - the baseline is a decaying minimum of window means: a faster window
//!   sets it at once; a slower one raises it by 1/[`DRIFT`] of the gap, but
//!   only when measured at the lowest load the limit allows (the limit at
//!   `min`, or at most `min` calls in flight): a latency the limit's own
//!   queue caused never becomes the baseline (Gradient2's long-term average
//!   drifts up with it), while an upstream that got slower for good is
//!   learned once the limit has shed all it can.
//!   The baseline is never re-measured by dropping the limit (Envoy's
//!   adaptive concurrency does, and rejects while it does, envoy #18152),
//!   so a change of baseline makes no burst of rejections;
//! - the gradient `clamp(TOLERANCE * baseline / avg, 0.5, 1)`: below 1 the
//!   limit shrinks by half the gradient's shortfall (at most a quarter per
//!   window); at 1 it grows by `sqrt(limit)`, but only when the calls in
//!   flight reached half the limit (growth is measured under load, never
//!   assumed: Gradient2's limit grew without bound on an idle service,
//!   concurrency-limits #134 and #137) and `avg` is within [`HEADROOM`] of
//!   the baseline (near the knee it holds instead of overshooting it);
//! - the limit stays within `min..=max`, and `max` is at most the rule's
//!   `max_concurrent` (the compiler bounds it by `capacity workers`).
//!
//! A new adaptive bulkhead starts at `min`; one whose config changed goes
//! on from the limit it had.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::clock::Now;
use crate::config::invalid::{Ctx, InvalidConfig};
use gov_proto::v1 as proto;

/// An adaptive limit's bounds, from the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveSpec {
    /// The lowest limit, > 0.
    pub min: u32,
    /// The highest limit, `min..=max_concurrent`.
    pub max: u32,
}

/// The shortest window the limit moves once in.
pub(crate) const WINDOW: u64 = 100_000_000;
/// The fewest calls a window measures before the limit moves, or the limit
/// if it is lower: a limit of 2 over 100 ms calls would otherwise wait half
/// a second for each window, and take seconds to grow out of `min`.
pub(crate) const MIN_SAMPLES: u64 = 10;
/// How much slower than the baseline a window may be and count as healthy.
pub(crate) const TOLERANCE: f64 = 1.5;
/// How much slower than the baseline a window may be and still grow the
/// limit. Between HEADROOM and TOLERANCE the limit holds: a limit that grew
/// on every healthy window overshot the knee by its last step (sqrt(limit))
/// before the slower calls it admitted were measured, and cycled around it
/// (6 workers: 8 -> 14 -> 8, p99 three times the unloaded latency).
pub(crate) const HEADROOM: f64 = 1.25;
/// A slower window raises the baseline by 1/DRIFT of the gap.
pub(crate) const DRIFT: f64 = 32.0;
/// The lowest gradient (a window more than twice as slow as tolerated).
const MIN_GRADIENT: f64 = 0.5;
/// The share of the gradient's shortfall the limit loses in one window.
const SHRINK: f64 = 0.5;

/// The low bits of the packed window: samples.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// One sample counts at most this many microseconds (16.7 s), so the sum
/// (40 bits) holds 65,536 of the slowest in one window.
const MAX_SAMPLE_US: u64 = COUNT_MASK;

/// An adaptive bulkhead's spec from the wire: `min` > 0, `min <= max <=
/// max_concurrent`.
pub(crate) fn spec(
    ctx: &Ctx<'_>,
    a: &proto::AdaptiveLimit,
    max_concurrent: u32,
) -> Result<AdaptiveSpec, InvalidConfig> {
    if a.min == 0 {
        return Err(ctx.err("`adaptive.min` must be > 0"));
    }
    if a.min > a.max {
        return Err(ctx.err(format!(
            "`adaptive.min` ({}) is above `adaptive.max` ({})",
            a.min, a.max
        )));
    }
    if a.max > max_concurrent {
        return Err(ctx.err(format!(
            "`adaptive.max` ({}) is above `max_concurrent` ({max_concurrent}): write `max_concurrent` = `adaptive.max`",
            a.max
        )));
    }
    Ok(AdaptiveSpec {
        min: a.min,
        max: a.max,
    })
}

/// The state of one adaptive limit.
#[derive(Debug)]
pub(crate) struct Adaptive {
    spec: AdaptiveSpec,
    /// The window so far: high 40 bits the latency summed in microseconds,
    /// low 24 bits the samples.
    window: AtomicU64,
    /// When the window began (clock nanoseconds).
    since: AtomicU64,
    estimate: Mutex<Estimate>,
}

/// What the windows taught, changed only under the lock.
#[derive(Clone, Copy, Debug)]
struct Estimate {
    /// The limit, unrounded.
    limit: f64,
    /// The baseline latency in microseconds (0: none measured yet).
    baseline: f64,
}

impl Adaptive {
    /// A limit at `min`, or going on from `was` (a limit and a baseline,
    /// clamped into the new bounds).
    pub(crate) fn new(spec: AdaptiveSpec, was: Option<(u32, f64)>) -> Self {
        let (limit, baseline) = was.unwrap_or((spec.min, 0.0));
        Self {
            spec,
            window: AtomicU64::new(0),
            since: AtomicU64::new(Now::read().ns()),
            estimate: Mutex::new(Estimate {
                limit: f64::from(limit.clamp(spec.min, spec.max)),
                baseline,
            }),
        }
    }

    /// The limit now, rounded.
    pub(crate) fn limit(&self) -> u32 {
        self.estimate
            .lock()
            .map_or(self.spec.min, |e| e.rounded(self.spec))
    }

    /// The limit and the baseline, for the bulkhead a config change makes.
    pub(crate) fn carried(&self) -> (u32, f64) {
        self.estimate
            .lock()
            .map_or((self.spec.min, 0.0), |e| (e.rounded(self.spec), e.baseline))
    }

    /// The baseline latency in microseconds (0: none yet).
    #[cfg(test)]
    pub(crate) fn baseline_us(&self) -> f64 {
        self.estimate.lock().map_or(0.0, |e| e.baseline)
    }

    /// Adds a recorded call's latency to the window; closes the window
    /// and moves `limit` when it is due. Out of line: a fixed bulkhead's
    /// record is one test of `adaptive`.
    #[inline(never)]
    pub(crate) fn sample(&self, limit: &AtomicU32, latency_ns: u64, now: Now) {
        let us = (latency_ns / 1000).min(MAX_SAMPLE_US);
        let before = self.window.fetch_add((us << COUNT_BITS) | 1, Relaxed);
        if (before & COUNT_MASK) + 1 >= MIN_SAMPLES.min(u64::from(limit.load(Relaxed))) {
            self.close(limit, now);
        }
    }

    /// Closes the window if it is due and nobody else is closing it.
    #[cold]
    #[inline(never)]
    fn close(&self, limit: &AtomicU32, now: Now) {
        let since = self.since.load(Relaxed);
        if now.ns().saturating_sub(since) < WINDOW {
            return;
        }
        let Ok(mut estimate) = self.estimate.try_lock() else {
            return;
        };
        // Another record may have closed it since the look above.
        let since = self.since.load(Relaxed);
        let length = now.ns().saturating_sub(since);
        if length < WINDOW {
            return;
        }
        let window = self.window.swap(0, Relaxed);
        self.since.store(now.ns(), Relaxed);
        let (count, sum_us) = (window & COUNT_MASK, window >> COUNT_BITS);
        if count == 0 {
            return;
        }
        let avg = sum_us as f64 / count as f64;
        let in_flight = sum_us as f64 * 1000.0 / length as f64;
        estimate.update(avg.max(1.0), in_flight, self.spec);
        limit.store(estimate.rounded(self.spec), Relaxed);
    }
}

impl Estimate {
    /// One window's step: `avg` its mean latency (µs), `in_flight` its
    /// mean calls in flight.
    fn update(&mut self, avg: f64, in_flight: f64, spec: AdaptiveSpec) {
        let floor = f64::from(spec.min);
        if self.baseline <= 0.0 || avg < self.baseline {
            self.baseline = avg;
        } else if self.limit <= floor || in_flight <= floor {
            // Measured at the lowest load the limit allows: this latency is
            // the upstream's own, not the queue the limit let build.
            self.baseline += (avg - self.baseline) / DRIFT;
        }
        let gradient = (TOLERANCE * self.baseline / avg).clamp(MIN_GRADIENT, 1.0);
        let limit = self.limit;
        let next = if gradient < 1.0 {
            limit * (1.0 - SHRINK * (1.0 - gradient))
        } else if in_flight >= limit / 2.0 && avg <= HEADROOM * self.baseline {
            limit + limit.sqrt()
        } else {
            // Not loaded enough to tell whether more would be healthy, or
            // healthy but near the knee: hold.
            limit
        };
        self.limit = next.clamp(f64::from(spec.min), f64::from(spec.max));
    }

    fn rounded(&self, spec: AdaptiveSpec) -> u32 {
        // Within min..=max, both u32: the cast cannot truncate.
        (self.limit.round() as u32).clamp(spec.min, spec.max)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use http::StatusCode;
    use tokio::time::Instant;

    use super::*;
    use crate::outcome::Outcome;
    use crate::primitive::{Grant, Primitive};
    use crate::state::bulkhead::{Bulkhead, BulkheadKey, BulkheadSpec, CellRef};
    use crate::state::keys::KeyCap;

    fn adaptive(min: u32, max: u32) -> Arc<Bulkhead> {
        Arc::new(Bulkhead::new(BulkheadSpec {
            key: BulkheadKey::Operation,
            max_concurrent: max,
            max_wait: Duration::ZERO,
            max_queue: None,
            timeout: None,
            reject_status: StatusCode::REQUEST_TIMEOUT,
            reject_grpc: gov_proto::v1::GrpcCode::Unavailable,
            keys: KeyCap::default(),
            adaptive: Some(AdaptiveSpec { min, max }),
            share: None,
            queue: crate::state::bulkhead::QueueDiscipline::Fifo,
            by_class: false,
        }))
    }

    /// Closed-loop clients of one bulkhead under paused time: each takes a
    /// permit, holds it for the upstream's latency, records and gives it
    /// back, and tries again on the next tick after a refusal.
    struct Sim {
        b: Arc<Bulkhead>,
        /// Per client: the call in flight (started, ends).
        calls: Vec<Option<(Instant, Instant)>>,
        admitted: u64,
        rejected: u64,
    }

    const TICK: Duration = Duration::from_millis(1);

    impl Sim {
        fn new(b: Arc<Bulkhead>, clients: usize) -> Self {
            Self {
                b,
                calls: vec![None; clients],
                admitted: 0,
                rejected: 0,
            }
        }

        /// Runs for `length`; `latency(in_flight)` is the upstream's
        /// latency for a call admitted with that many in flight. Returns
        /// the limit at every tick.
        async fn run(&mut self, length: Duration, latency: impl Fn(u64) -> Duration) -> Vec<u32> {
            let cell = CellRef::Single;
            let end = Instant::now() + length;
            let mut limits = Vec::new();
            while Instant::now() < end {
                let now = Instant::now();
                for call in &mut self.calls {
                    if let Some((start, done)) = *call
                        && done <= now
                    {
                        let elapsed = u64::try_from((now - start).as_nanos()).unwrap_or(u64::MAX);
                        let slot = crate::stripe::current();
                        let (ok, grant) = (Outcome::Status(200), Grant::default());
                        self.b.record(slot, ok, grant, Now::from(now), elapsed);
                        self.b.give(self.b.cell(&cell));
                        *call = None;
                    }
                }
                for call in &mut self.calls {
                    if call.is_some() {
                        continue;
                    }
                    if self.b.try_take(self.b.cell(&cell)) {
                        self.admitted += 1;
                        *call = Some((now, now + latency(self.b.in_use())));
                    } else {
                        self.rejected += 1;
                    }
                }
                assert!(self.b.in_use() <= u64::from(self.b.spec.max_concurrent));
                limits.push(self.b.limit());
                tokio::time::advance(TICK).await;
            }
            limits
        }
    }

    fn flat(ms: u64) -> impl Fn(u64) -> Duration {
        move |_| Duration::from_millis(ms)
    }

    /// An upstream with `workers`: a call admitted with more in flight
    /// waits its share of their time.
    fn workers(n: u64, ms: u64) -> impl Fn(u64) -> Duration {
        move |in_flight| Duration::from_millis(ms * in_flight.max(n) / n)
    }

    fn baseline_ms(b: &Bulkhead) -> f64 {
        b.adaptive.as_ref().unwrap().baseline_us() / 1000.0
    }

    #[tokio::test(start_paused = true)]
    async fn healthy_latency_grows_the_limit_to_max_and_never_past_it() {
        let b = adaptive(4, 32);
        assert_eq!(b.limit(), 4, "a new adaptive bulkhead starts at min");
        let mut sim = Sim::new(b.clone(), 200);
        let limits = sim.run(Duration::from_secs(10), flat(10)).await;
        assert_eq!(limits.iter().max(), Some(&32), "grew to max, never past it");
        let at = limits.iter().position(|&l| l == 32).unwrap();
        assert!(
            limits[at..].iter().all(|&l| l == 32),
            "stays at max while healthy"
        );
        let mut stats = b
            .counters
            .snapshot(&"order/b".into(), gov_proto::v1::RuleKind::Bulkhead);
        b.stats(&mut stats);
        assert_eq!(stats.capacity, 32, "the stats show the limit");
    }

    /// Growth is measured: a service that never fills half its limit does
    /// not raise it (Gradient2's limit grew without bound on an idle one).
    #[tokio::test(start_paused = true)]
    async fn an_underused_limit_does_not_grow() {
        let b = adaptive(4, 64);
        let mut sim = Sim::new(b.clone(), 2);
        let limits = sim.run(Duration::from_secs(30), flat(10)).await;
        assert!(
            limits.iter().all(|&l| l <= 6),
            "2 calls in flight grew the limit to {:?}",
            limits.iter().max()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rising_latency_shrinks_the_limit_to_min() {
        let b = adaptive(4, 64);
        let mut sim = Sim::new(b.clone(), 64);
        sim.run(Duration::from_secs(5), flat(10)).await;
        assert_eq!(b.limit(), 64);
        // The endpoint turns slow: ten times the baseline.
        let limits = sim.run(Duration::from_secs(3), flat(100)).await;
        assert_eq!(limits.iter().min(), Some(&4), "shrank to min: {limits:?}");
        assert!(limits.windows(2).take(200).all(|w| w[1] <= w[0]));
    }

    /// The baseline follows a lasting change of latency without the limit
    /// dropping to re-measure it: a steady load below the limit is never
    /// refused, however long it runs, when the upstream gets slower within
    /// the tolerance, or faster.
    #[tokio::test(start_paused = true)]
    async fn a_baseline_change_makes_no_burst_of_rejections() {
        let b = adaptive(4, 64);
        let mut sim = Sim::new(b.clone(), 16);
        // From min up to the load: the refusals of the start.
        sim.run(Duration::from_secs(5), flat(10)).await;
        assert!(b.limit() >= 16);
        sim.rejected = 0;
        let mut limits = sim.run(Duration::from_secs(120), flat(10)).await;
        assert!((baseline_ms(&b) - 10.0).abs() < 0.5);
        // Slower by 40%, within the tolerance.
        limits.extend(sim.run(Duration::from_secs(120), flat(14)).await);
        // Faster: the baseline falls at once; then back up by 40%.
        limits.extend(sim.run(Duration::from_secs(60), flat(5)).await);
        assert!((baseline_ms(&b) - 5.0).abs() < 0.5);
        limits.extend(sim.run(Duration::from_secs(60), flat(7)).await);
        assert_eq!(sim.rejected, 0, "refused calls below the limit");
        assert!(
            limits.iter().all(|&l| l >= 16),
            "the limit dropped below the load"
        );
    }

    /// An upstream that loses workers and gets them back: the limit falls
    /// with the queueing latency and rises again once latency falls back,
    /// as measured.
    #[tokio::test(start_paused = true)]
    async fn the_limit_recovers_after_the_upstream_heals() {
        let b = adaptive(4, 64);
        let mut sim = Sim::new(b.clone(), 60);
        let mean = |l: &[u32]| l.iter().map(|&x| f64::from(x)).sum::<f64>() / l.len() as f64;
        let healthy = sim.run(Duration::from_secs(20), workers(20, 10)).await;
        let healthy = mean(&healthy[healthy.len() / 2..]);
        let degraded = sim.run(Duration::from_secs(20), workers(6, 10)).await;
        let degraded = mean(&degraded[degraded.len() / 2..]);
        let healed = sim.run(Duration::from_secs(20), workers(20, 10)).await;
        let healed = mean(&healed[healed.len() / 2..]);
        assert!(
            (20.0..=40.0).contains(&healthy),
            "healthy: {healthy} for 20 workers"
        );
        assert!(
            (4.0..=12.0).contains(&degraded),
            "degraded: {degraded} for 6 workers"
        );
        assert!(
            (20.0..=40.0).contains(&healed),
            "healed: {healed} for 20 workers"
        );
    }

    /// Near the knee the limit holds: over 6 workers it settles between
    /// the workers' number and 1.5 times it (calls at most 1.5 times the
    /// baseline latency) instead of cycling past it by a growth step before
    /// the slower calls are measured.
    #[tokio::test(start_paused = true)]
    async fn near_the_knee_the_limit_holds_instead_of_cycling() {
        let b = adaptive(2, 20);
        let mut sim = Sim::new(b.clone(), 60);
        sim.run(Duration::from_secs(10), workers(6, 100)).await;
        let limits = sim.run(Duration::from_secs(20), workers(6, 100)).await;
        let (lo, hi) = (limits.iter().min(), limits.iter().max());
        assert!(
            lo >= Some(&6) && hi <= Some(&10),
            "6 workers: the limit went {lo:?}..{hi:?}"
        );
    }

    /// A limit below [`MIN_SAMPLES`] closes a window on the limit's worth
    /// of calls: from `min` 2 over 100 ms calls it reaches `max` in about a
    /// second.
    #[tokio::test(start_paused = true)]
    async fn a_small_limit_moves_every_window() {
        let b = adaptive(2, 20);
        let mut sim = Sim::new(b.clone(), 60);
        let limits = sim.run(Duration::from_secs(3), flat(100)).await;
        let at = limits.iter().position(|&l| l == 20).map(|t| t as u64);
        assert!(at.is_some_and(|t| t <= 1500), "reached max after {at:?} ms");
    }

    /// A changed config goes on from the limit it had, within its bounds.
    #[tokio::test(start_paused = true)]
    async fn a_resized_bulkhead_keeps_its_limit() {
        let b = adaptive(4, 64);
        let mut sim = Sim::new(b.clone(), 64);
        sim.run(Duration::from_secs(5), flat(10)).await;
        assert_eq!(b.limit(), 64);
        let spec = BulkheadSpec {
            max_concurrent: 40,
            adaptive: Some(AdaptiveSpec { min: 2, max: 40 }),
            share: None,
            ..b.spec.clone()
        };
        let next = Bulkhead::resized(spec.clone(), &b);
        assert_eq!(next.limit(), 40);
        assert!((baseline_ms(&next) - 10.0).abs() < 0.5);
        // From a fixed bulkhead: its limit, within the bounds.
        let fixed = Bulkhead::new(BulkheadSpec {
            max_concurrent: 30,
            adaptive: None,
            share: None,
            ..spec.clone()
        });
        assert_eq!(Bulkhead::resized(spec, &fixed).limit(), 30);
    }

    #[test]
    fn the_wire_bounds_are_checked() {
        let ctx = Ctx::new("order/b");
        let a = |min, max| proto::AdaptiveLimit { min, max };
        assert!(spec(&ctx, &a(0, 8), 8).is_err());
        assert!(spec(&ctx, &a(9, 8), 9).is_err());
        assert!(spec(&ctx, &a(4, 16), 8).is_err(), "above max_concurrent");
        assert_eq!(
            spec(&ctx, &a(4, 8), 8).unwrap(),
            AdaptiveSpec { min: 4, max: 8 }
        );
    }
}
