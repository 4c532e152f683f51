//! Canary applies, the pure half: a canary's spec as govd takes it from the
//! wire, the outcomes counted from the agents' stats, and the decision to
//! carry on, promote or roll back. No state, no clock: the caller passes
//! the time (`rollout.rs` runs the decision on `tokio::time`; the running
//! canary lives in `state/canary.rs`).
//!
//! A rule's outcomes are compared between the instances on trial and the
//! other instances of its service, over the calls counted since the canary
//! started: the share of calls rejected (every reason but `timeout`) and
//! the share that ended in error (timed out under the rule, or a gRPC code
//! other than OK). A rule the other instances do not have compares with 0,
//! and so does every rule of a service with one instance (the canary is that
//! instance: nothing to compare with but the thresholds themselves).

use std::collections::BTreeMap;

use gov_proto::v1 as pb;

use crate::store::CanarySpec;

/// The shortest and longest canary window.
pub const MIN_WINDOW_MS: u64 = 1_000;
pub const MAX_WINDOW_MS: u64 = 24 * 3_600_000;

/// Why a canary apply was refused. Nothing was applied in every case.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CanaryError {
    #[error("the canary share is {0}%; it must be 1% to 100%")]
    #[diagnostic(
        code(gov::govd::canary_share),
        help("name the share of each changed service's instances, e.g. `--canary 10%`")
    )]
    Share(u32),

    #[error("the canary window is {0} ms; it must be 1s to 24h")]
    #[diagnostic(code(gov::govd::canary_window), help("e.g. `--for 5m`"))]
    Window(u64),

    #[error(
        "the canary threshold `{name}` is {value}; it must be a ratio from 0 to 1 (0: not checked)"
    )]
    #[diagnostic(code(gov::govd::canary_threshold), help("e.g. `--{name} 5%`"))]
    Threshold { name: &'static str, value: f64 },

    #[error("no canary is running")]
    #[diagnostic(
        code(gov::govd::no_canary),
        help("`govc status` shows the canary when one runs")
    )]
    NotRunning,

    #[error("cannot record the canary's end in the audit log; the canary goes on")]
    #[diagnostic(
        code(gov::govd::audit),
        help(
            "make --state-dir writable (or free disk space), or bring the etcd members of --store back, then try again"
        )
    )]
    Audit(#[source] crate::error::Error),

    #[error("cannot store the canary's end; the canary goes on")]
    #[diagnostic(
        code(gov::govd::store),
        help(
            "make --state-dir writable (or free disk space), or bring the etcd members of --store back, then try again"
        )
    )]
    Store(#[source] crate::error::Error),
}

/// Checks a canary spec from the wire.
pub fn spec(wire: &pb::CanarySpec) -> Result<CanarySpec, CanaryError> {
    if !(1..=100).contains(&wire.share_percent) {
        return Err(CanaryError::Share(wire.share_percent));
    }
    if !(MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(&wire.window_ms) {
        return Err(CanaryError::Window(wire.window_ms));
    }
    for (name, value) in [
        ("max-reject-ratio", wire.max_reject_ratio),
        ("max-error-ratio", wire.max_error_ratio),
    ] {
        if !(0.0..=1.0).contains(&value) {
            return Err(CanaryError::Threshold { name, value });
        }
    }
    Ok(CanarySpec {
        share_percent: wire.share_percent,
        window_ms: wire.window_ms,
        max_reject_ratio: wire.max_reject_ratio,
        max_error_ratio: wire.max_error_ratio,
        min_calls: wire.min_calls,
    })
}

/// The wire form of `spec`.
pub fn wire_spec(spec: &CanarySpec) -> pb::CanarySpec {
    pb::CanarySpec {
        share_percent: spec.share_percent,
        window_ms: spec.window_ms,
        max_reject_ratio: spec.max_reject_ratio,
        max_error_ratio: spec.max_error_ratio,
        min_calls: spec.min_calls,
    }
}

/// How many of `n` instances are on trial: `share` percent, rounded up, at
/// least one (none of none).
pub fn on_trial(n: usize, share_percent: u32) -> usize {
    let share = usize::try_from(share_percent.min(100)).unwrap_or(100);
    (n * share).div_ceil(100).clamp(n.min(1), n)
}

/// One rule's outcomes on one instance: cumulative as an agent reports
/// them, or a difference of two reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub admitted: u64,
    pub rejected: u64,
    pub errors: u64,
    pub would_reject: u64,
    pub latency: [u64; 8],
}

impl Counts {
    /// What `r` reports (cumulative since the agent started).
    pub fn of(r: &pb::RuleStats) -> Self {
        // A timeout ends an admitted call: an error, not a rejection.
        let total = |x: &pb::Rejections| x.total() - x.timeout;
        let rejected = r.rejected.as_ref();
        let mut latency = [0; 8];
        for (l, n) in latency.iter_mut().zip(&r.latency_buckets) {
            *l = *n;
        }
        Counts {
            admitted: r.admitted,
            rejected: rejected.map_or(0, total),
            errors: rejected.map_or(0, |x| x.timeout) + r.grpc_outcomes.iter().skip(1).sum::<u64>(),
            would_reject: r.shadow_rejected.as_ref().map_or(0, pb::Rejections::total),
            latency,
        }
    }

    /// What happened between `before` and `self`. A counter that went down
    /// means the agent restarted in between: everything since is `self`.
    pub fn since(&self, before: &Counts) -> Counts {
        let went_down = self.admitted < before.admitted
            || self.rejected < before.rejected
            || self.errors < before.errors
            || self.would_reject < before.would_reject
            || self.latency.iter().zip(&before.latency).any(|(a, b)| a < b);
        if went_down {
            return *self;
        }
        let mut latency = [0; 8];
        for (i, l) in latency.iter_mut().enumerate() {
            *l = self.latency[i] - before.latency[i];
        }
        Counts {
            admitted: self.admitted - before.admitted,
            rejected: self.rejected - before.rejected,
            errors: self.errors - before.errors,
            would_reject: self.would_reject - before.would_reject,
            latency,
        }
    }

    pub fn add(&mut self, other: &Counts) {
        self.admitted += other.admitted;
        self.rejected += other.rejected;
        self.errors += other.errors;
        self.would_reject += other.would_reject;
        for (a, b) in self.latency.iter_mut().zip(&other.latency) {
            *a += b;
        }
    }

    /// Calls the rule decided.
    pub fn calls(&self) -> u64 {
        self.admitted + self.rejected
    }

    pub fn to_proto(&self, instances: u32) -> pb::CanaryCounts {
        pb::CanaryCounts {
            calls: self.calls(),
            rejected: self.rejected,
            errors: self.errors,
            would_reject: self.would_reject,
            p99_ms: p99_ms(&self.latency),
            instances,
        }
    }
}

/// Each rule's cumulative counts in one stats report.
pub fn rule_counts(stats: &pb::Stats) -> BTreeMap<&str, Counts> {
    stats
        .rules
        .iter()
        .map(|r| (r.rule.as_str(), Counts::of(r)))
        .collect()
}

/// The upper bound (ms) of the bucket the 99th percentile falls in; 0 with
/// no call, `u64::MAX` above the last bound.
fn p99_ms(buckets: &[u64; 8]) -> u64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = (total * 99).div_ceil(100).max(1);
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return gov_proto::LATENCY_BOUNDS_MS
                .get(i)
                .copied()
                .unwrap_or(u64::MAX);
        }
    }
    u64::MAX
}

/// What to do with a running canary.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Keep comparing.
    Continue,
    /// The window ended with no threshold crossed.
    Promote(String),
    /// A threshold was crossed (why).
    Rollback(String),
}

/// The decision for a canary of `spec` from the comparison `rules`, its
/// window `over` or not: a crossed threshold rolls back at once, else the
/// end of the window promotes.
pub fn decide(spec: &CanarySpec, rules: &[pb::CanaryRule], over: bool) -> Decision {
    for r in rules {
        let empty = pb::CanaryCounts::default();
        let canary = r.canary.as_ref().unwrap_or(&empty);
        let baseline = r.baseline.as_ref().unwrap_or(&empty);
        if canary.calls == 0 || canary.calls < spec.min_calls {
            continue;
        }
        for (what, max, c, b) in [
            (
                "rejected",
                spec.max_reject_ratio,
                canary.rejected,
                baseline.rejected,
            ),
            (
                "ended in error",
                spec.max_error_ratio,
                canary.errors,
                baseline.errors,
            ),
        ] {
            let ratio = |n: u64, calls: u64| {
                if calls == 0 {
                    0.0
                } else {
                    n as f64 / calls as f64
                }
            };
            let (cr, br) = (ratio(c, canary.calls), ratio(b, baseline.calls));
            if max > 0.0 && cr - br > max {
                let others = if baseline.instances == 0 {
                    "no other instance has counts of the rule (compared with 0)".to_owned()
                } else {
                    format!("the other instances {} of {}", percent(br), baseline.calls)
                };
                return Decision::Rollback(format!(
                    "`{}`: the canary {what} {} of {} calls, {others} ({} more, over the {} allowed)",
                    r.rule,
                    percent(cr),
                    canary.calls,
                    percent(cr - br),
                    percent(max),
                ));
            }
        }
    }
    if over {
        let calls: u64 = rules
            .iter()
            .filter_map(|r| r.canary.as_ref())
            .map(|c| c.calls)
            .max()
            .unwrap_or(0);
        return Decision::Promote(format!(
            "the window ended with no threshold crossed (the busiest rule saw {calls} calls on the canary)"
        ));
    }
    Decision::Continue
}

/// `0.05` as `5%`, `0.125` as `12.5%`.
pub fn percent(ratio: f64) -> String {
    let p = (ratio * 1000.0).round() / 10.0;
    if p.fract() == 0.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CanarySpec {
        CanarySpec {
            share_percent: 25,
            window_ms: 60_000,
            max_reject_ratio: 0.05,
            max_error_ratio: 0.10,
            min_calls: 20,
        }
    }

    fn rule(name: &str, canary: (u64, u64, u64), baseline: (u64, u64, u64)) -> pb::CanaryRule {
        let counts = |(calls, rejected, errors)| pb::CanaryCounts {
            calls,
            rejected,
            errors,
            instances: u32::from(calls > 0),
            ..Default::default()
        };
        pb::CanaryRule {
            rule: name.into(),
            canary: Some(counts(canary)),
            baseline: Some(counts(baseline)),
        }
    }

    #[test]
    fn the_share_is_rounded_up_to_at_least_one_instance() {
        assert_eq!(on_trial(0, 10), 0);
        assert_eq!(on_trial(1, 10), 1, "a single instance is the canary");
        assert_eq!(on_trial(4, 25), 1);
        assert_eq!(on_trial(4, 26), 2);
        assert_eq!(on_trial(10, 10), 1);
        assert_eq!(on_trial(3, 100), 3);
    }

    #[test]
    fn a_threshold_crossed_rolls_back_before_the_window_ends() {
        let s = spec();
        // 10% rejected on the canary, 2% elsewhere: 8 points over, more than 5.
        let bad = [rule("order/a", (100, 10, 0), (300, 6, 0))];
        match decide(&s, &bad, false) {
            Decision::Rollback(why) => assert!(
                why.contains(
                    "`order/a`: the canary rejected 10% of 100 calls, the other instances 2% of 300"
                ),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        // 6% against 2% is within 5 points: on to the end of the window.
        let fine = [rule("order/a", (100, 6, 0), (300, 6, 0))];
        assert_eq!(decide(&s, &fine, false), Decision::Continue);
        assert!(matches!(decide(&s, &fine, true), Decision::Promote(_)));
        // Errors have their own threshold.
        let errors = [rule("order/a", (100, 0, 20), (300, 0, 3))];
        assert!(matches!(
            decide(&s, &errors, false),
            Decision::Rollback(why) if why.contains("ended in error 20%")
        ));
    }

    #[test]
    fn too_few_calls_or_an_unchecked_threshold_decide_nothing() {
        let mut s = spec();
        let few = [rule("order/a", (19, 19, 19), (0, 0, 0))];
        assert_eq!(decide(&s, &few, false), Decision::Continue);
        // A rule new in the canary compares with 0 once it has the calls.
        let new = [rule("order/new", (20, 2, 0), (0, 0, 0))];
        assert!(matches!(decide(&s, &new, false), Decision::Rollback(_)));
        s.max_reject_ratio = 0.0;
        assert_eq!(decide(&s, &new, false), Decision::Continue);
    }

    #[test]
    fn counts_between_two_reports_survive_an_agent_restart() {
        let before = Counts {
            admitted: 10,
            rejected: 2,
            ..Counts::default()
        };
        let after = Counts {
            admitted: 15,
            rejected: 3,
            ..Counts::default()
        };
        assert_eq!(after.since(&before).calls(), 6);
        let restarted = Counts {
            admitted: 4,
            ..Counts::default()
        };
        assert_eq!(restarted.since(&before), restarted);
    }

    #[test]
    fn a_report_counts_rejections_errors_and_the_p99_bucket() {
        let r = pb::RuleStats {
            admitted: 100,
            rejected: Some(pb::Rejections {
                limit_calls: 7,
                timeout: 2,
                ..Default::default()
            }),
            grpc_outcomes: vec![90, 0, 0, 0, 3],
            latency_buckets: vec![98, 1, 0, 0, 0, 1, 0, 0],
            ..Default::default()
        };
        let c = Counts::of(&r);
        assert_eq!((c.calls(), c.rejected, c.errors), (107, 7, 5));
        assert_eq!(c.to_proto(1).p99_ms, 20);
        assert_eq!(percent(0.125), "12.5%");
    }

    #[test]
    fn a_spec_out_of_range_is_refused() {
        let ok = pb::CanarySpec {
            share_percent: 10,
            window_ms: 5_000,
            max_reject_ratio: 0.05,
            ..Default::default()
        };
        assert!(super::spec(&ok).is_ok());
        for bad in [
            pb::CanarySpec {
                share_percent: 0,
                ..ok
            },
            pb::CanarySpec {
                share_percent: 101,
                ..ok
            },
            pb::CanarySpec {
                window_ms: 999,
                ..ok
            },
            pb::CanarySpec {
                max_error_ratio: 1.5,
                ..ok
            },
            pb::CanarySpec {
                max_reject_ratio: f64::NAN,
                ..ok
            },
        ] {
            assert!(super::spec(&bad).is_err(), "{bad:?}");
        }
    }
}
