//! `gov::adaptive-range`: an adaptive bulkhead whose `min` is above its
//! `max`.
//!
//! Why: the limit moves between `min` and `max`; with `min` above `max`
//! there is no limit it could take.
//!
//! Example: `bulkhead b on slow { max_concurrent adaptive min 64 max 4 }`.
//!
//! Fix: swap them, or write the lowest limit the calls may be cut to as
//! `min` and the highest as `max`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadEff};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("bulkhead `{name}`: adaptive `min {min}` is above `max {max}`")]
#[diagnostic(
    code("gov::adaptive-range"),
    help("the limit moves between min and max: write `min` <= `max` (e.g. `min {max} max {min}`)")
)]
pub struct AdaptiveRange {
    pub name: String,
    pub min: i64,
    pub max: i64,
    #[source_code]
    pub src: Src,
    #[label(primary, "above max")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<AdaptiveRange>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(b) = Bulkhead::of(rule) else {
                continue;
            };
            let Some(a) = BulkheadEff::of(&b).adaptive else {
                continue;
            };
            if a.min.node <= a.max.node {
                continue;
            }
            out.push(
                AdaptiveRange {
                    name: b.name.node.clone(),
                    min: a.min.node,
                    max: a.max.node,
                    src: cx.src(svc.file),
                    span: a.min.span.into(),
                }
                .into(),
            );
        }
    }
}
