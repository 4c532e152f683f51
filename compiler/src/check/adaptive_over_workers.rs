//! `gov::adaptive-over-workers`: a server-side adaptive bulkhead whose
//! `max` is above the service's declared `capacity workers`.
//!
//! Why: an adaptive limit grows while the latency of the calls it admits
//! stays healthy, and that can last until the slow calls hold every
//! worker; the service's other operations then queue behind them. The
//! limit must be bounded by the pool it protects (Netflix's Gradient2 let
//! its limit grow without bound). A fixed `max_concurrent` above the pool
//! is a warning (`gov::lint::bulkhead-over-workers`); an adaptive one
//! would grow into it unattended, so it is an error.
//!
//! Example: `capacity workers 20` and
//! `bulkhead b on slow { max_concurrent adaptive min 4 max 64 }`.
//!
//! Fix: a `max` at most the worker pool, better below it (for example
//! half), so that other operations always find a worker.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadEff};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "bulkhead `{name}` may grow to {max} calls at once but service `{service}` has {workers} workers"
)]
#[diagnostic(
    code("gov::adaptive-over-workers"),
    help(
        "bound the adaptive limit by the worker pool (e.g. `max {suggested}`) so other operations always find a worker"
    )
)]
pub struct AdaptiveOverWorkers {
    pub name: String,
    pub service: String,
    pub max: i64,
    pub workers: i64,
    pub suggested: i64,
    #[source_code]
    pub src: Src,
    #[label(primary, "more than the worker pool")]
    pub span: SourceSpan,
    #[label("declared here")]
    pub workers_span: SourceSpan,
}

pub(crate) fn check<D: From<AdaptiveOverWorkers>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let Some(workers) = svc.workers else { continue };
        if workers.node <= 0 {
            continue;
        }
        for (rule, norm) in svc.rules_with_norms() {
            let Some(b) = Bulkhead::of(rule) else {
                continue;
            };
            if !norm.is_valid() || norm.is_outbound() {
                continue;
            }
            let Some(a) = BulkheadEff::of(&b).adaptive else {
                continue;
            };
            if a.max.node <= workers.node {
                continue;
            }
            out.push(
                AdaptiveOverWorkers {
                    name: b.name.node.clone(),
                    service: svc.name().to_string(),
                    max: a.max.node,
                    workers: workers.node,
                    suggested: (workers.node / 2).max(1),
                    src: cx.src(svc.file),
                    span: a.max.span.into(),
                    workers_span: workers.span.into(),
                }
                .into(),
            );
        }
    }
}
