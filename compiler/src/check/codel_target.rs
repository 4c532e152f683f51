//! `gov::codel-target`: a bulkhead's `queue codel` whose `target` is not
//! below its `interval`.
//!
//! Why: CoDel refuses a waiter that has waited `target` once the queue has
//! stood for `interval`; with `target` at or above `interval` the queue is
//! judged over a window shorter than the wait it allows, and the agent
//! refuses the config.
//!
//! Example: `queue codel target 200ms interval 100ms`.
//!
//! Fix: a `target` well below the `interval` (CoDel's are 5ms and 100ms).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadEff, Discipline};
use crate::resolve::{Ctx, Src};
use crate::units::millis;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("bulkhead `{name}`: `queue codel target {target}` is not below `interval {interval}`")]
#[diagnostic(
    code("gov::codel-target"),
    help("write a target well below the interval (e.g. `target 5ms interval 100ms`)")
)]
pub struct CodelTarget {
    pub name: String,
    pub target: String,
    pub interval: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "not below the interval")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<CodelTarget>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(b) = Bulkhead::of(rule) else {
                continue;
            };
            let Some(Discipline::Codel { target, interval }) = BulkheadEff::of(&b).discipline
            else {
                continue;
            };
            if millis(&target.node) < millis(&interval.node) {
                continue;
            }
            out.push(
                CodelTarget {
                    name: b.name.node.clone(),
                    target: cx.text(svc.file, target.span).to_string(),
                    interval: cx.text(svc.file, interval.span).to_string(),
                    src: cx.src(svc.file),
                    span: target.span.into(),
                }
                .into(),
            );
        }
    }
}
