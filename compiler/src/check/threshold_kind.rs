//! `gov::threshold-kind`: a count threshold on a ratio metric
//! (`error_ratio > 10`) or a percentage on a count metric
//! (`system_errors >= 10%`).
//!
//! Why: `error_ratio > 10` could mean 10% or a ratio of 10 (never reached);
//! the compiler does not guess.
//!
//! Example: `trip when business_error_ratio > 50 over 1m`.
//!
//! Fix: `*_ratio` metrics take a percentage (`> 50%`); `*_errors`,
//! `errors` and `slow_calls` take a count (`>= 10`).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::fuse::{Fuse, Threshold, TripMetric};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{metric}` takes a {expected}, found a {found}")]
#[diagnostic(code("gov::threshold-kind"))]
pub struct ThresholdKind {
    pub metric: String,
    pub expected: String,
    pub found: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "a {found}")]
    pub span: SourceSpan,
    #[label("this metric is a {metric_kind}")]
    pub metric_span: SourceSpan,
    pub metric_kind: String,
    #[help]
    pub help: String,
}

pub(crate) fn metric_name(m: TripMetric) -> &'static str {
    match m {
        TripMetric::BusinessErrors => "business_errors",
        TripMetric::BusinessErrorRatio => "business_error_ratio",
        TripMetric::SystemErrors => "system_errors",
        TripMetric::SystemErrorRatio => "system_error_ratio",
        TripMetric::Errors => "errors",
        TripMetric::ErrorRatio => "error_ratio",
        TripMetric::SlowCalls => "slow_calls",
        TripMetric::SlowCallRatio => "slow_call_ratio",
    }
}

/// The ratio metric that goes with a count metric.
fn ratio_of(m: TripMetric) -> &'static str {
    match m {
        TripMetric::BusinessErrors | TripMetric::BusinessErrorRatio => "business_error_ratio",
        TripMetric::SystemErrors | TripMetric::SystemErrorRatio => "system_error_ratio",
        TripMetric::Errors | TripMetric::ErrorRatio => "error_ratio",
        TripMetric::SlowCalls | TripMetric::SlowCallRatio => "slow_call_ratio",
    }
}

pub(crate) fn check<D: From<ThresholdKind>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(f) = Fuse::of(rule) else { continue };
            for t in f.trips() {
                let ratio = t.metric.node.is_ratio();
                let (expected, found, metric_kind, help) = match (ratio, t.threshold.node) {
                    (true, Threshold::Count(n)) => (
                        "percentage",
                        "count",
                        "ratio",
                        format!("write the ratio as a percentage, e.g. `{n}%`"),
                    ),
                    (false, Threshold::Percent(_)) => (
                        "count",
                        "percentage",
                        "count",
                        format!(
                            "write a number of calls, or use `{}` for a ratio",
                            ratio_of(t.metric.node)
                        ),
                    ),
                    _ => continue,
                };
                out.push(
                    ThresholdKind {
                        metric: metric_name(t.metric.node).to_string(),
                        expected: expected.to_string(),
                        found: found.to_string(),
                        src: cx.src(svc.file),
                        span: t.threshold.span.into(),
                        metric_span: t.metric.span.into(),
                        metric_kind: metric_kind.to_string(),
                        help,
                    }
                    .into(),
                );
            }
        }
    }
}
