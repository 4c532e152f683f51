//! What the outbound balancer knows of one endpoint: requests outstanding, the
//! peak-EWMA latency estimate and the plain mean beside it, passive-health
//! ejection and latency-outlier probes. The choice among endpoints is the
//! parent's (`balance.rs`); this holds the per-endpoint state a new endpoint set
//! keeps for an address it shares with the old one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use http::uri::Authority;

/// How fast a latency estimate forgets: a sample this old weighs 1/e (Linkerd's and
/// Finagle's default).
const DECAY_NANOS: f64 = 10e9;

/// How fast the mean latency outliers are judged on forgets: a sample this old
/// weighs 1/e.
const MEAN_NANOS: f64 = 1e9;

/// A slow endpoint gets one request when this long has passed since its last
/// probe (and nothing is outstanding on it): at 2,000 calls/s, 0.05% of them.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// One endpoint and what the balancer knows of it. Written with relaxed atomics: a
/// lost race skews an estimate or a count by one sample, never a decision's safety.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// Where it listens.
    pub(crate) authority: Authority,
    /// Its identity for client-side rules (per-instance bulkheads): `host:port`.
    pub(crate) id: Arc<str>,
    /// Requests picked for it whose response has not ended.
    pub(super) outstanding: AtomicU64,
    /// Requests sent to it (each attempt), since it joined.
    pub(super) requests: AtomicU64,
    /// Times it was ejected, since it joined.
    pub(super) ejections: AtomicU64,
    /// Ejections the outlier policy's share held back, since it joined.
    pub(super) withheld: AtomicU64,
    /// Connect failures and resets since its last response.
    pub(super) failures: AtomicU32,
    /// Ejections since its last response: the back-off doubles with each.
    pub(super) ejected_in_a_row: AtomicU32,
    /// Nanoseconds after the epoch until which it is ejected (0: never was).
    pub(super) ejected_until: AtomicU64,
    /// The peak-EWMA latency estimate in nanoseconds (`f64` bits; 0: none yet).
    rtt: AtomicU64,
    /// When `rtt` was last updated, nanoseconds after the epoch.
    rtt_at: AtomicU64,
    /// The plain moving average of the latency in nanoseconds (`f64` bits; 0:
    /// none yet), over about [`MEAN_NANOS`].
    mean: AtomicU64,
    /// A latency outlier at the last judgement: it gets probes only.
    pub(super) slow: AtomicBool,
    /// While slow, nanoseconds after the epoch from which its next probe may go.
    pub(super) probe_from: AtomicU64,
}

// === impl Endpoint ===

impl Endpoint {
    pub(super) fn new(authority: Authority) -> Self {
        Self {
            id: Arc::from(authority.as_str()),
            authority,
            outstanding: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            withheld: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            ejected_in_a_row: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            rtt: AtomicU64::new(0),
            rtt_at: AtomicU64::new(0),
            mean: AtomicU64::new(0),
            slow: AtomicBool::new(false),
            probe_from: AtomicU64::new(0),
        }
    }

    pub(super) fn ejected(&self, at: u64) -> bool {
        at < self.ejected_until.load(Ordering::Relaxed)
    }

    /// A slow endpoint may take a probe: its time has come and nothing is
    /// outstanding on it (a probe that hangs is not followed by more).
    pub(super) fn probe_due(&self, at: u64) -> bool {
        at >= self.probe_from.load(Ordering::Relaxed)
            && self.outstanding.load(Ordering::Relaxed) == 0
    }

    /// Takes the probe: the next one may go [`PROBE_EVERY`] from now. False when
    /// another request took it first.
    pub(super) fn claim_probe(&self, at: u64) -> bool {
        let from = self.probe_from.load(Ordering::Relaxed);
        let next = at.saturating_add(u64::try_from(PROBE_EVERY.as_nanos()).unwrap_or(u64::MAX));
        at >= from
            && self
                .probe_from
                .compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// The latency estimate at `at`, decayed since its last sample (0: none yet).
    pub(super) fn estimate(&self, at: u64) -> f64 {
        let rtt = f64::from_bits(self.rtt.load(Ordering::Relaxed));
        if rtt <= 0.0 {
            return 0.0;
        }
        let age = at.saturating_sub(self.rtt_at.load(Ordering::Relaxed)) as f64;
        rtt * (-age / DECAY_NANOS).exp()
    }

    /// Adds a latency sample: a sample above the estimate replaces it at once (the
    /// peak), one below moves it by how long the estimate went without a sample.
    pub(super) fn observe(&self, rtt: f64, at: u64) {
        let rtt = rtt.max(1.0);
        let previous = f64::from_bits(self.rtt.load(Ordering::Relaxed));
        let age = at.saturating_sub(self.rtt_at.load(Ordering::Relaxed)) as f64;
        let next = if rtt >= previous {
            rtt
        } else {
            let w = (-age / DECAY_NANOS).exp();
            previous * w + rtt * (1.0 - w)
        };
        let mean = f64::from_bits(self.mean.load(Ordering::Relaxed));
        let mean = if mean <= 0.0 {
            rtt
        } else {
            let w = (-age / MEAN_NANOS).exp();
            mean * w + rtt * (1.0 - w)
        };
        self.rtt.store(next.to_bits(), Ordering::Relaxed);
        self.mean.store(mean.to_bits(), Ordering::Relaxed);
        self.rtt_at.store(at, Ordering::Relaxed);
    }

    /// The mean latency over about the last second of samples (0: none yet): what
    /// outliers are judged on. Not the peak: one slow sample of a fast endpoint
    /// (a busy host's) would make it look as slow as the outlier for seconds.
    pub(super) fn mean(&self) -> f64 {
        f64::from_bits(self.mean.load(Ordering::Relaxed))
    }
}
