//! `gov::percent-out-of-range`: a percentage above 100% or below 0%: a fuse
//! ratio threshold (`business_error_ratio > 150%`), a ramp start
//! (`ramp 60s from 120%`) or a retry budget (`budget 150% min 10 per 1s`).
//!
//! Why: a ratio can never exceed 100%, so such a fuse can never trip; a
//! ramp cannot start above full weight.
//!
//! Example: `trip when error_ratio > 150% over 1m`.
//!
//! Fix: write a value between 0% and 100%.

use gov_lang::ast::{ServiceStmt, Span, WarmupStep};
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::fuse::{CompareOp, Fuse, Threshold};
use crate::kind::retry::Retry;
use crate::resolve::{Ctx, Src};
use crate::units::fmt_milli_percent;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{what} `{value}` is outside 0%..100%")]
#[diagnostic(code("gov::percent-out-of-range"))]
pub struct PercentOutOfRange {
    pub what: String,
    pub value: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{reason}")]
    pub span: SourceSpan,
    pub reason: String,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<PercentOutOfRange>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut push = |what: &str, milli: i64, span: Span, reason: &str, help: &str| {
            out.push(
                PercentOutOfRange {
                    what: what.to_string(),
                    value: fmt_milli_percent(milli),
                    src: cx.src(svc.file),
                    span: span.into(),
                    reason: reason.to_string(),
                    help: help.to_string(),
                }
                .into(),
            );
        };
        for rule in &svc.rules {
            let Some(f) = Fuse::of(rule) else { continue };
            for t in f.trips() {
                let Threshold::Percent(p) = t.threshold.node else {
                    continue;
                };
                let never = p.milli > 100_000 || (p.milli == 100_000 && t.op.node == CompareOp::Gt);
                if never {
                    push(
                        "ratio",
                        p.milli,
                        t.threshold.span,
                        "a ratio never exceeds 100%, so this fuse never trips",
                        "write a ratio between 0% and 100%, e.g. `> 50%`",
                    );
                } else if p.milli < 0 {
                    push(
                        "ratio",
                        p.milli,
                        t.threshold.span,
                        "a ratio is never negative",
                        "write a ratio between 0% and 100%, e.g. `> 50%`",
                    );
                }
            }
        }
        for rule in &svc.rules {
            let Some(b) = Retry::of(rule).and_then(|r| r.budget().cloned()) else {
                continue;
            };
            if !(0..=100_000).contains(&b.percent.node.milli) {
                push(
                    "retry budget",
                    b.percent.node.milli,
                    b.percent.span,
                    "the share of calls that may be retried",
                    "write a share between 0% and 100%, e.g. `budget 20% min 10 per 1s`",
                );
            }
        }
        for stmt in &svc.ast.body {
            let ServiceStmt::Warmup(w) = stmt else {
                continue;
            };
            for step in &w.steps {
                if let WarmupStep::Ramp { from, .. } = step
                    && !(0..=100_000).contains(&from.node.milli)
                {
                    push(
                        "ramp start",
                        from.node.milli,
                        from.span,
                        "the weight ramps from here up to 100%",
                        "start the ramp between 0% and 100%, e.g. `from 10%`",
                    );
                }
            }
        }
    }
}
