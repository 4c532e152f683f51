//! `gov::lint::queueing-bulkhead` (warning): a bulkhead over slow calls
//! that lets calls wait a long time for a permit, so it queues instead of
//! failing fast.
//!
//! The calls are "slow" when the bulkhead's match (or a match it refers to)
//! declares `latency L`. The lint fires when the bulkhead's `max_wait W`
//!
//! - is at least `L`: a waiting call waits as long as a whole slow call, or
//! - is above 100ms while `L` is 100ms or more: on a slow route any wait
//!   longer than that only moves the queue.
//!
//! Why: measured on a slow IO endpoint, a bulkhead with a long wait only
//! moved the queue and raised latency for everyone; with a short wait the
//! fast endpoint kept its latency and the slow one shed load (docs/architecture.md,
//! problem 1).
//!
//! Example: `match slow = path prefix "/report" latency 2s` and
//! `bulkhead b on slow { max_concurrent 10  max_wait 5s }`.
//!
//! The wait it judges is the one a call sees under overload, which the
//! bulkhead's queue discipline sets: `max_wait` for `queue fifo` (the
//! default) and `queue lifo` (adaptive LIFO serves the newest calls of a
//! standing queue, but the oldest still wait `max_wait` before their
//! refusal), and the smaller of `target` and `max_wait` for `queue codel`
//! (a standing queue refuses a call once it has waited `target`).
//!
//! Fix: a short wait such as `max_wait 10ms` (or none: the default is 0),
//! or `queue codel target 5ms interval 100ms`: a burst still waits up to
//! `max_wait`, a standing queue only `target`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadEff, Discipline};
use crate::resolve::{Ctx, Src};
use crate::units::millis;

/// A route whose declared latency is at least this is slow.
pub(crate) const SLOW_ROUTE_MS: i64 = 100;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("bulkhead `{name}` queues calls for up to {wait} on calls that take {latency}")]
#[diagnostic(
    code("gov::lint::queueing-bulkhead"),
    severity(Warning),
    help(
        "fail fast: a short `max_wait` (e.g. `10ms`) sheds load from the slow calls instead of making every caller queue behind them; or `queue codel target 5ms interval 100ms`, which lets a burst wait but not a standing queue"
    )
)]
pub struct QueueingBulkhead {
    pub name: String,
    pub wait: String,
    pub latency: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "waits this long for a permit")]
    pub span: SourceSpan,
    #[label("declared latency")]
    pub latency_span: SourceSpan,
}

pub(crate) fn check<D: From<QueueingBulkhead>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(b) = Bulkhead::of(rule) else {
                continue;
            };
            let Some(latency) = svc.latency(b.on) else {
                continue;
            };
            let eff = BulkheadEff::of(&b);
            let Some(mut wait_span) = eff.max_wait_span else {
                continue;
            };
            let (mut wait, lat) = (eff.max_wait_ms, millis(&latency.node));
            // Under a standing queue, CoDel refuses a call after `target`.
            if let Some(Discipline::Codel { target, .. }) = &eff.discipline
                && millis(&target.node) < wait
            {
                (wait, wait_span) = (millis(&target.node), target.span);
            }
            let queueing =
                (wait >= lat && wait > 0) || (lat >= SLOW_ROUTE_MS && wait > SLOW_ROUTE_MS);
            if !queueing {
                continue;
            }
            out.push(
                QueueingBulkhead {
                    name: b.name.node.clone(),
                    wait: cx.text(svc.file, wait_span).to_string(),
                    latency: cx.text(svc.file, latency.span).to_string(),
                    src: cx.src(svc.file),
                    span: wait_span.into(),
                    latency_span: latency.span.into(),
                }
                .into(),
            );
        }
    }
}
