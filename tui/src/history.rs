//! Rates and rolling history derived from successive cumulative counters.
//!
//! Agents report counters cumulative since they started and the control plane
//! sums them per rule. The TUI turns two successive views into per-second
//! rates and keeps about five minutes of rejection rates per rule for the
//! sparklines, in memory only (as Sentinel's dashboard does).

use std::collections::{HashMap, VecDeque};

use gov_proto::v1::{ClusterView, Mode, RuleView};

/// How much rejection history is kept per rule.
pub const RATE_WINDOW_MS: u64 = 5 * 60 * 1000;

/// Upper bound on samples per rule, whatever the update rate.
const MAX_SAMPLES: usize = 600;

/// Rates are taken over at least this long. The control plane publishes a
/// view on every change (an agent joining, a fuse tripping) besides the
/// stats about once a second; a rate over a few milliseconds between two of
/// those would be noise.
const MIN_INTERVAL_MS: u64 = 900;

/// Per-second rates of one rule between the last two views.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RuleRates {
    /// Calls admitted per second.
    pub admitted: f64,
    /// Calls rejected per second, all reasons.
    pub rejected: f64,
    /// Calls rejected per second by reason: bulkhead full, bulkhead timeout,
    /// limit calls, limit bytes, fuse open, timeout (the order of `Rejections`).
    pub by_reason: [f64; N],
}

/// Cumulative counters of one rule as last seen.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    at_ms: u64,
    admitted: u64,
    rejected: [u64; N],
}

/// Rates and history for every rule seen recently.
#[derive(Debug, Default)]
pub(crate) struct History {
    last: HashMap<String, Counters>,
    rates: HashMap<String, RuleRates>,
    /// Rejections per second, oldest first, with the view time of each sample.
    samples: HashMap<String, VecDeque<(u64, f64)>>,
}

// === impl RuleRates ===

/// The reasons a call is rejected for (`Rejections`'s counts).
const N: usize = gov_proto::rejections::REASONS;

/// A rule's rejections; for a rule in mode shadow, the calls it would have
/// rejected (its rates and sparkline show what it would do).
fn rejections(rule: &RuleView) -> [u64; N] {
    let stats = rule.stats.as_ref();
    let counts = if rule.mode() == Mode::Shadow {
        stats.and_then(|s| s.shadow_rejected.as_ref())
    } else {
        stats.and_then(|s| s.rejected.as_ref())
    };
    counts
        .copied()
        .unwrap_or_default()
        .by_reason()
        .map(|(_, n)| n)
}

// === impl History ===

impl History {
    /// Folds in a new view taken at `at_ms`.
    ///
    /// A counter that went down (an agent restarted or left, so the sum over
    /// agents shrank) counts as no traffic for that interval rather than as a
    /// negative or invented rate. A view not newer than the last one for a rule
    /// leaves its rate unchanged, and so does one less than 900 ms newer: the
    /// next rate spans the whole interval instead.
    pub(crate) fn observe(&mut self, view: &ClusterView, at_ms: u64) {
        let cutoff = at_ms.saturating_sub(RATE_WINDOW_MS);
        for rule in &view.rules {
            let Some(stats) = &rule.stats else { continue };
            let now = Counters {
                at_ms,
                admitted: stats.admitted,
                rejected: rejections(rule),
            };
            let name = rule.rule.as_str();
            match self.last.get_mut(name) {
                Some(prev) if at_ms >= prev.at_ms.saturating_add(MIN_INTERVAL_MS) => {
                    let secs = (at_ms - prev.at_ms) as f64 / 1000.0;
                    let rate = |new: u64, old: u64| new.saturating_sub(old) as f64 / secs;
                    let mut by_reason = [0.0; N];
                    for (i, slot) in by_reason.iter_mut().enumerate() {
                        *slot = rate(now.rejected[i], prev.rejected[i]);
                    }
                    let rates = RuleRates {
                        admitted: rate(now.admitted, prev.admitted),
                        rejected: by_reason.iter().sum(),
                        by_reason,
                    };
                    *prev = now;
                    self.rates.insert(name.to_owned(), rates);
                    let samples = self.samples.entry(name.to_owned()).or_default();
                    samples.push_back((at_ms, rates.rejected));
                    while samples.len() > MAX_SAMPLES
                        || samples.front().is_some_and(|(t, _)| *t < cutoff)
                    {
                        samples.pop_front();
                    }
                }
                Some(_) => {}
                None => {
                    self.last.insert(name.to_owned(), now);
                }
            }
        }
        // Forget rules that left the view, so memory follows the policy.
        if self.last.len() > view.rules.len() {
            let live: std::collections::HashSet<&str> =
                view.rules.iter().map(|r| r.rule.as_str()).collect();
            self.last.retain(|k, _| live.contains(k.as_str()));
            self.rates.retain(|k, _| live.contains(k.as_str()));
            self.samples.retain(|k, _| live.contains(k.as_str()));
        }
    }

    /// The rates of `rule` between the last two views; `None` before the second view.
    pub(crate) fn rates(&self, rule: &str) -> Option<&RuleRates> {
        self.rates.get(rule)
    }

    /// Rejections per second of `rule`, oldest first, within the window.
    pub(crate) fn samples(&self, rule: &str) -> impl Iterator<Item = f64> + '_ {
        self.samples
            .get(rule)
            .into_iter()
            .flat_map(|s| s.iter().map(|(_, v)| *v))
    }
}
