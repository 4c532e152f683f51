//! `gov::lint::bulkhead-over-workers` (warning): a server-side bulkhead
//! whose `max_concurrent` is above the service's declared
//! `capacity workers`.
//!
//! Why: the point of a server-side bulkhead is that one slow operation
//! cannot take every worker. With a cap above the pool size the slow calls
//! can still fill the pool before the bulkhead ever rejects, and every
//! other endpoint queues behind them.
//!
//! Example: `capacity workers 20` and `bulkhead slow_calls on slow { max_concurrent 50 }`.
//!
//! Fix: cap the operation well below the pool (for example half of it), so
//! that other operations always find a worker.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadEff};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "bulkhead `{name}` allows {max} calls at once but service `{service}` has {workers} workers"
)]
#[diagnostic(
    code("gov::lint::bulkhead-over-workers"),
    severity(Warning),
    help(
        "cap the operation below the worker pool (e.g. `max_concurrent {suggested}`) so other operations always find a worker"
    )
)]
pub struct BulkheadOverWorkers {
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

pub(crate) fn check<D: From<BulkheadOverWorkers>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
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
            let Some((max, span)) = BulkheadEff::of(&b).max_concurrent else {
                continue;
            };
            if max <= workers.node {
                continue;
            }
            out.push(
                BulkheadOverWorkers {
                    name: b.name.node.clone(),
                    service: svc.name().to_string(),
                    max,
                    workers: workers.node,
                    suggested: (workers.node / 2).max(1),
                    src: cx.src(svc.file),
                    span: span.into(),
                    workers_span: workers.span.into(),
                }
                .into(),
            );
        }
    }
}
