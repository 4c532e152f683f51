//! `gov::lint::unreachable-min-calls` (warning): a fuse condition whose
//! `min_calls` cannot be reached within its window at the service's
//! declared `capacity rate`.
//!
//! At `capacity rate R per W`, a window of `T` sees at most `R * T / W`
//! calls (the whole service's traffic; a narrower match sees fewer). When
//! `min_calls` is above that, the condition never has enough calls to be
//! evaluated, so the fuse never trips.
//!
//! Why: Resilience4j's `minimumNumberOfCalls` defaults to 100; on a quiet
//! route such a breaker silently never opens.
//!
//! Example: `capacity rate 10 per 1s` and
//! `trip when error_ratio > 50% over 5s min_calls 100` (at most 50 calls).
//!
//! Fix: lower `min_calls`, or widen the window (`over`). Only checked when
//! the service declares `capacity rate`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::fuse::Fuse;
use crate::resolve::{Ctx, Src};
use crate::units::millis;

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "fuse `{name}` needs {min_calls} calls in {window} but service `{service}` sees at most {expected}"
)]
#[diagnostic(
    code("gov::lint::unreachable-min-calls"),
    severity(Warning),
    help("lower `min_calls` to at most {expected}, or widen the window so that it can fill")
)]
pub struct UnreachableMinCalls {
    pub name: String,
    pub service: String,
    pub min_calls: i64,
    pub window: String,
    pub expected: i64,
    #[source_code]
    pub src: Src,
    #[label(primary, "never reached")]
    pub span: SourceSpan,
    #[label("declared rate")]
    pub rate_span: SourceSpan,
}

pub(crate) fn check<D: From<UnreachableMinCalls>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let Some(rate) = svc.rate else { continue };
        let (amount, per) = (
            i128::from(rate.amount.node),
            i128::from(millis(&rate.window.node)),
        );
        if amount <= 0 || per <= 0 {
            continue;
        }
        for rule in &svc.rules {
            let Some(f) = Fuse::of(rule) else { continue };
            for t in f.trips() {
                let Some(min) = &t.min_calls else { continue };
                let window = i128::from(millis(&t.window.node));
                let expected = amount * window / per;
                if i128::from(min.node) <= expected {
                    continue;
                }
                out.push(
                    UnreachableMinCalls {
                        name: f.name.node.clone(),
                        service: svc.name().to_string(),
                        min_calls: min.node,
                        window: cx.text(svc.file, t.window.span).to_string(),
                        expected: i64::try_from(expected).unwrap_or(i64::MAX),
                        src: cx.src(svc.file),
                        span: min.span.into(),
                        rate_span: rate.amount.span.join(rate.window.span).into(),
                    }
                    .into(),
                );
            }
        }
    }
}
