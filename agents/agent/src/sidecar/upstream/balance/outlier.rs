//! The outlier policy the balancer ejects endpoints by (passive health), as the
//! config declares it per callee (`outlier to SERVICE { ... }`, `TargetConfig.
//! outlier_targets`) or for every callee (`outlier { ... }`, `TargetConfig.
//! outlier`); without either, gov-proto's defaults (the fixed rule of agents
//! before: [`gov_proto::compiled::outlier_defaults`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as proto;

/// The whole share, in milli-percent.
const ALL: u32 = 100_000;

/// A config's outlier policy this agent cannot enforce: the agent refuses
/// (NACKs) the config.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("the outlier policy {of} is invalid: {problem}")]
#[diagnostic(
    code(gov_agent::invalid_outlier),
    help("compile the policy with `govc compile`: it writes every outlier value")
)]
pub struct InvalidOutlier {
    /// `for every callee` or `for calls to SERVICE`.
    pub of: String,
    /// Lowercase, no trailing period.
    pub problem: String,
}

/// How endpoints of one callee are ejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outlier {
    /// Failures in a row that eject an endpoint (>= 1).
    pub(crate) failures: u32,
    /// The first ejection (> 0).
    pub(crate) eject: Duration,
    /// What each ejection in a row multiplies the previous one by (>= 1).
    pub(crate) growth: u32,
    /// The longest ejection (>= `eject`).
    pub(crate) max_eject: Duration,
    /// The largest share ejected at once, in milli-percent (1..=100000); `None`:
    /// any number but the last endpoint that is not ejected.
    pub(crate) max_ejected: Option<u32>,
    /// Answers that count as failures (inclusive ranges).
    pub(crate) status: Box<[(u16, u16)]>,
}

impl Default for Outlier {
    fn default() -> Self {
        // INVARIANT: the defaults are valid.
        Self::from_wire(&gov_proto::compiled::outlier_defaults(), "")
            .unwrap_or_else(|_| unreachable!("gov-proto's outlier defaults are valid"))
    }
}

impl Outlier {
    /// Reads a wire policy, refusing what cannot be enforced; `of` names it in
    /// the error.
    pub(crate) fn from_wire(p: &proto::OutlierPolicy, of: &str) -> Result<Self, InvalidOutlier> {
        let err = |problem: String| InvalidOutlier {
            of: of.to_owned(),
            problem,
        };
        if p.consecutive_failures == 0 {
            return Err(err("`consecutive_failures` is 0".into()));
        }
        if p.eject_ms == 0 {
            return Err(err("`eject_ms` is 0".into()));
        }
        if p.growth == 0 {
            return Err(err("`growth` is 0".into()));
        }
        if p.max_eject_ms < p.eject_ms {
            return Err(err(format!(
                "`max_eject_ms` ({}) is below `eject_ms` ({})",
                p.max_eject_ms, p.eject_ms
            )));
        }
        if p.max_ejected_milli_percent > ALL {
            return Err(err(format!(
                "`max_ejected_milli_percent` ({}) is above 100%",
                p.max_ejected_milli_percent
            )));
        }
        let mut status = Vec::with_capacity(p.status.len());
        for r in &p.status {
            let to = if r.to == 0 { r.from } else { r.to };
            if !(100..=599).contains(&r.from) || !(r.from..=599).contains(&to) {
                return Err(err(format!(
                    "the status range {}..{} is not within 100..599",
                    r.from, r.to
                )));
            }
            // Within 100..=599: both fit.
            status.push((r.from as u16, to as u16));
        }
        Ok(Self {
            failures: p.consecutive_failures,
            eject: Duration::from_millis(p.eject_ms),
            growth: p.growth,
            max_eject: Duration::from_millis(p.max_eject_ms),
            max_ejected: (p.max_ejected_milli_percent > 0).then_some(p.max_ejected_milli_percent),
            status: status.into(),
        })
    }

    /// How long the ejection after `row` ejections in a row lasts: `eject` times
    /// `growth` to the `row`, at most `max_eject`.
    pub(crate) fn backoff(&self, row: u32) -> Duration {
        let factor = u64::from(self.growth)
            .checked_pow(row)
            .and_then(|f| u32::try_from(f).ok());
        match factor {
            Some(f) => self.eject.saturating_mul(f).min(self.max_eject),
            None => self.max_eject,
        }
    }

    /// Whether an answer with `status` counts as a failure.
    pub(crate) fn counts(&self, status: u16) -> bool {
        self.status
            .iter()
            .any(|&(from, to)| (from..=to).contains(&status))
    }

    /// Whether one more endpoint may be ejected when `ejected` of `total` are:
    /// the declared share bounds the ejected count; without one, one endpoint
    /// must stay available.
    pub(crate) fn may_eject(&self, ejected: usize, total: usize) -> bool {
        match self.max_ejected {
            // (ejected + 1) / total <= share, in integers.
            Some(share) => {
                (ejected as u128 + 1) * u128::from(ALL) <= total as u128 * u128::from(share)
            }
            None => ejected + 1 < total,
        }
    }
}

/// Every callee's outlier policy, as one config declares them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outliers {
    default: Arc<Outlier>,
    targets: HashMap<Box<str>, Arc<Outlier>>,
}

impl Outliers {
    /// The policies of `target`, refusing one this agent cannot enforce.
    pub fn from_target(target: &proto::TargetConfig) -> Result<Self, InvalidOutlier> {
        let default = match &target.outlier {
            Some(p) => Outlier::from_wire(p, "for every callee")?,
            None => Outlier::default(),
        };
        let mut targets = HashMap::new();
        for t in &target.outlier_targets {
            let of = format!("for calls to `{}`", t.service);
            let Some(p) = &t.policy else {
                return Err(InvalidOutlier {
                    of,
                    problem: "it has no `policy`".into(),
                });
            };
            targets.insert(
                Box::from(t.service.as_str()),
                Arc::new(Outlier::from_wire(p, &of)?),
            );
        }
        Ok(Self {
            default: Arc::new(default),
            targets,
        })
    }

    /// The policy for calls to `service`.
    pub(crate) fn of(&self, service: &str) -> Arc<Outlier> {
        self.targets.get(service).unwrap_or(&self.default).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> proto::OutlierPolicy {
        gov_proto::compiled::outlier_defaults()
    }

    #[test]
    fn the_defaults_are_the_fixed_rule_of_before() {
        let o = Outlier::default();
        assert_eq!(o.failures, 5);
        assert_eq!(o.backoff(0), Duration::from_secs(1));
        assert_eq!(o.backoff(1), Duration::from_secs(2));
        assert_eq!(o.backoff(40), Duration::from_secs(60));
        assert!(!o.counts(503));
        // Never the last available endpoint.
        assert!(!o.may_eject(0, 1));
        assert!(o.may_eject(0, 2));
        assert!(!o.may_eject(1, 2));
        assert!(o.may_eject(8, 10));
    }

    #[test]
    fn a_declared_share_bounds_the_ejected_count() {
        let o = Outlier::from_wire(
            &proto::OutlierPolicy {
                max_ejected_milli_percent: 50_000,
                ..policy()
            },
            "",
        )
        .unwrap();
        assert!(!o.may_eject(0, 1), "half of one instance is none");
        assert!(o.may_eject(0, 2));
        assert!(!o.may_eject(1, 2));
        assert!(o.may_eject(1, 5));
        assert!(!o.may_eject(2, 5));
        let all = Outlier::from_wire(
            &proto::OutlierPolicy {
                max_ejected_milli_percent: 100_000,
                ..policy()
            },
            "",
        )
        .unwrap();
        assert!(all.may_eject(0, 1), "declared: the only instance too");
    }

    #[test]
    fn what_cannot_be_enforced_is_refused_and_named() {
        let cases = [
            (
                proto::OutlierPolicy {
                    consecutive_failures: 0,
                    ..policy()
                },
                "`consecutive_failures` is 0",
            ),
            (
                proto::OutlierPolicy {
                    eject_ms: 0,
                    ..policy()
                },
                "`eject_ms` is 0",
            ),
            (
                proto::OutlierPolicy {
                    growth: 0,
                    ..policy()
                },
                "`growth` is 0",
            ),
            (
                proto::OutlierPolicy {
                    max_eject_ms: 10,
                    ..policy()
                },
                "below",
            ),
            (
                proto::OutlierPolicy {
                    max_ejected_milli_percent: 100_001,
                    ..policy()
                },
                "above 100%",
            ),
            (
                proto::OutlierPolicy {
                    status: vec![proto::StatusRange { from: 600, to: 0 }],
                    ..policy()
                },
                "not within",
            ),
        ];
        for (p, want) in cases {
            let error = Outlier::from_wire(&p, "for calls to `inventory`").unwrap_err();
            let text = error.to_string();
            assert!(text.contains(want) && text.contains("inventory"), "{text}");
        }
        let target = proto::TargetConfig {
            outlier_targets: vec![proto::OutlierTarget {
                service: "inventory".into(),
                policy: None,
            }],
            ..proto::TargetConfig::default()
        };
        assert!(Outliers::from_target(&target).is_err());
    }

    #[test]
    fn a_callee_without_its_own_policy_takes_the_services() {
        let target = proto::TargetConfig {
            outlier: Some(proto::OutlierPolicy {
                consecutive_failures: 2,
                ..policy()
            }),
            outlier_targets: vec![proto::OutlierTarget {
                service: "inventory".into(),
                policy: Some(proto::OutlierPolicy {
                    consecutive_failures: 7,
                    status: vec![proto::StatusRange { from: 500, to: 599 }],
                    ..policy()
                }),
            }],
            ..proto::TargetConfig::default()
        };
        let o = Outliers::from_target(&target).unwrap();
        assert_eq!(o.of("inventory").failures, 7);
        assert!(o.of("inventory").counts(502));
        assert_eq!(o.of("billing").failures, 2);
        assert_eq!(Outliers::default().of("billing").failures, 5);
    }
}
