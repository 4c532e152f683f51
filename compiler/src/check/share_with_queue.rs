//! `gov::share-with-queue`: a bulkhead with both `share` and a `queue`
//! discipline other than `fifo`.
//!
//! Why: a share serves its waiters in its own order (a consumer within its
//! share before any borrower), so a `queue lifo` or `queue codel` beside it
//! would have no order left to decide; the agent refuses the config, and
//! every agent of the service would NACK the apply.
//!
//! Example: `share by consumer { crm 3 web 1 }` with `queue codel target 5ms
//! interval 100ms` in one bulkhead.
//!
//! Fix: keep one of the two: the share to protect consumers from each other,
//! or the discipline (and `critical`/`sheddable` classes) to keep the queue
//! short.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadEff, Discipline};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("bulkhead `{name}`: `share` and `queue {discipline}` cannot be declared together")]
#[diagnostic(
    code("gov::share-with-queue"),
    help(
        "a share serves its waiters in its own order (each consumer within its share first); remove the `queue {discipline}` line or the `share`"
    )
)]
pub struct ShareWithQueue {
    pub name: String,
    pub discipline: &'static str,
    #[source_code]
    pub src: Src,
    #[label(primary, "the share orders this bulkhead's waiters")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<ShareWithQueue>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(b) = Bulkhead::of(rule) else {
                continue;
            };
            let eff = BulkheadEff::of(&b);
            let (Some(share), Some(discipline)) = (&eff.share, &eff.discipline) else {
                continue;
            };
            let discipline = match discipline {
                Discipline::Fifo => continue,
                Discipline::Lifo { .. } => "lifo",
                Discipline::Codel { .. } => "codel",
            };
            out.push(
                ShareWithQueue {
                    name: b.name.node.clone(),
                    discipline,
                    src: cx.src(svc.file),
                    span: share.span.into(),
                }
                .into(),
            );
        }
    }
}
