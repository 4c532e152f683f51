//! `gov::invalid-outlier`: an outlier block's value the balancer cannot use:
//! `consecutive_failures` below 1, an ejection time (`eject`, `max`) of zero
//! or less, a `growth` below `1x`, a `max` below the `eject` it bounds,
//! `max_ejected` of 0% or above 100%, or an `on status` code outside
//! 100..599 (or a range whose end is below its start).
//!
//! Why: zero failures would eject an instance before it ever failed, a zero
//! ejection ejects nothing, a share of 0% forbids every ejection (remove the
//! block instead) and one above 100% means nothing; the agent refuses such a
//! config.
//!
//! Example: `outlier to checkout { eject 0s  max_ejected 0% }`.
//!
//! Fix: `consecutive_failures` of at least 1, positive times with `max` at
//! least `eject`, a growth of at least `1x` (`1x`: every ejection lasts
//! `eject`), a share within 1%..100%, status codes within 100..599.

use gov_lang::ast::Span;
use miette::SourceSpan;
use thiserror::Error;

use crate::outlier::Decl;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("outlier `{setting}` {problem}")]
#[diagnostic(code("gov::invalid-outlier"))]
pub struct InvalidOutlier {
    pub setting: String,
    pub problem: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{problem}")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<InvalidOutlier>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut push = |setting: &str, problem: String, span: Span, help: &str| {
            out.push(
                InvalidOutlier {
                    setting: setting.to_string(),
                    problem,
                    src: cx.src(svc.file),
                    span: span.into(),
                    help: help.to_string(),
                }
                .into(),
            );
        };
        for block in &svc.outliers {
            let d = Decl::of(block);
            if let Some((n, span)) = d.failures
                && n < 1
            {
                push(
                    "consecutive_failures",
                    format!("is {n}: it must be at least 1"),
                    span,
                    "count at least one failure before an ejection (the default is 5)",
                );
            }
            for (setting, value) in [("eject", d.eject), ("max", d.max)] {
                if let Some((ms, span)) = value
                    && ms <= 0
                {
                    push(
                        setting,
                        "is zero: an ejection must last".into(),
                        span,
                        "write a positive time such as `30s`, or remove the outlier block to keep the defaults",
                    );
                }
            }
            // What the block leaves out is the service-wide block's, then
            // the defaults: `max 500ms` alone is below the default `eject 1s`.
            let base = match &block.to {
                Some(_) => crate::outlier::lower(&svc.outliers)
                    .0
                    .unwrap_or_else(gov_proto::compiled::outlier_defaults),
                None => gov_proto::compiled::outlier_defaults(),
            };
            let eff = d.over(&base);
            if let Some((max, span)) = d.max
                && max > 0
                && eff.max_eject_ms < eff.eject_ms
            {
                push(
                    "max",
                    "is below `eject`: the ceiling bounds every ejection".into(),
                    span,
                    "make `max` at least the first ejection time",
                );
            }
            if let Some((n, span)) = d.growth
                && n < 1
            {
                push(
                    "growth",
                    format!("is {n}x: ejections cannot shrink to nothing"),
                    span,
                    "write `1x` for ejections that do not grow, `2x` to double each",
                );
            }
            if let Some((milli, span)) = d.share
                && !(1..=100_000).contains(&milli)
            {
                let problem = if milli <= 0 {
                    "is 0%: no instance could ever be ejected"
                } else {
                    "is above 100%: a share of the instances cannot pass all of them"
                };
                push(
                    "max_ejected",
                    problem.into(),
                    span,
                    "write a share within 1%..100% (without `max_ejected`, any number but the last instance that is not ejected)",
                );
            }
            for &(from, to, span) in &d.status {
                if !(100..=599).contains(&from) || !(from..=599).contains(&to) {
                    push(
                        "on status",
                        "is not a status within 100..599".into(),
                        span,
                        "name codes within 100..599, a range low..high such as `500..599`",
                    );
                }
            }
        }
    }
}
