//! `gov::lint::warmup-without-ramp` (warning): a limit scales with the
//! warmup (`scale with warmup`) in a service whose warmup has no `ramp`.
//!
//! Why: `scale with warmup` multiplies the limit by the instance's
//! slow-start weight while the instance ramps (Sentinel's cold factor).
//! Without a `ramp` step the weight is 100% from the start, so the setting
//! does nothing: the limit admits its full amount from the instance's
//! first call.
//!
//! Example: `service s { limit l on any { calls 100 per 1s  scale with warmup } }`.
//!
//! Fix: add a ramp to the service's warmup (`warmup { ... ramp 60s from
//! 10% }`), or remove `scale with warmup`.

use gov_lang::ast::WarmupStep;
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Limit, LimitEff};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}` scales with a warmup ramp that `{service}` does not have")]
#[diagnostic(
    code("gov::lint::warmup-without-ramp"),
    severity(Warning),
    help("add `ramp D from P%` to the service's `warmup`, or remove `scale with warmup`")
)]
pub struct WarmupWithoutRamp {
    pub name: String,
    pub service: String,
    #[source_code]
    pub src: Src,
    #[label(
        primary,
        "nothing to scale with: the instance takes its full share at once"
    )]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<WarmupWithoutRamp>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let ramps = svc
            .warmup
            .is_some_and(|w| w.steps.iter().any(|s| matches!(s, WarmupStep::Ramp { .. })));
        if ramps {
            continue;
        }
        for rule in &svc.rules {
            let Some(l) = Limit::of(rule) else { continue };
            let Some(span) = LimitEff::of(&l).warmup_scale else {
                continue;
            };
            out.push(
                WarmupWithoutRamp {
                    name: rule.def.name.node.clone(),
                    service: svc.name().to_string(),
                    src: cx.src(svc.file),
                    span: span.into(),
                }
                .into(),
            );
        }
    }
}
