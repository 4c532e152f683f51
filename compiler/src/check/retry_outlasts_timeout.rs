//! `gov::lint::retry-outlasts-timeout` (warning): the attempts of a retry
//! rule can take longer than a timeout that covers them, so its last
//! attempts are cut off before they can answer.
//!
//! A retry rule's worst case is every attempt taking its whole
//! `per_try_timeout` and every wait before a retry its longest `backoff`
//! (`attempts x per_try_timeout + backoffs`). The lint compares it with the
//! timeouts that cover the same call: a bulkhead `timeout` on the same calls
//! in the same service (a retried call is one call to the other rules, its
//! timeout covers every attempt); a bulkhead `timeout` on every call the
//! service itself serves (`on any`); and a bulkhead `timeout` the service's
//! callers set on their calls to it (the caller gives up while this service
//! is still retrying on its behalf). A rule without `per_try_timeout` has no
//! worst case of its own and is not checked.
//!
//! Why: retries, timeouts and deadlines set each on its own are how a
//! gateway ends up rejecting most of its calls at peak; an attempt that no
//! one will wait for is load on a failing service for nothing.
//!
//! Example: `retry r on calls to pay { attempts 3  per_try_timeout 400ms
//! budget 10% min 5 per 1s }` beside `bulkhead b on calls to pay {
//! max_concurrent 20  timeout 1s }`.
//!
//! Fix: make `attempts x per_try_timeout` (plus the backoffs) fit in the
//! timeout, by a shorter `per_try_timeout`, fewer `attempts`, or a longer
//! timeout.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadEff};
use crate::paths::{self, norm_callees};
use crate::resolve::{Ctx, Norm, Src, Svc};
use crate::units::fmt_ms;

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "retry `{name}` can take {worst} ({attempts} attempts of {per_try} and {backoff} of backoff), longer than {covering}"
)]
#[diagnostic(
    code("gov::lint::retry-outlasts-timeout"),
    severity(Warning),
    help(
        "make the attempts fit in {timeout}: a shorter `per_try_timeout`, fewer `attempts`, or a longer timeout"
    )
)]
pub struct RetryOutlastsTimeout {
    pub name: String,
    pub worst: String,
    pub attempts: u32,
    pub per_try: String,
    pub backoff: String,
    pub covering: String,
    pub timeout: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "its last attempts are cut off")]
    pub span: SourceSpan,
}

/// The shortest bulkhead timeout of `svc` on calls `covers` accepts, with
/// the bulkhead's name.
fn shortest(svc: &Svc<'_>, covers: impl Fn(&Norm<'_>) -> bool) -> Option<(u64, String)> {
    svc.rules_with_norms()
        .filter(|(_, norm)| covers(norm))
        .filter_map(|(rule, _)| {
            let b = Bulkhead::of(rule)?;
            let ms = BulkheadEff::of(&b).timeout_ms?;
            Some((u64::try_from(ms).ok()?, b.name.node.clone()))
        })
        .min()
}

fn calls(norm: &Norm<'_>, to: &str) -> bool {
    let mut callees = Vec::new();
    norm_callees(norm, &mut callees);
    callees.contains(&to)
}

pub(crate) fn check<D: From<RetryOutlastsTimeout>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for r in paths::retries(cx) {
        let Some(worst) = paths::retry_worst_ms(&r.spec) else {
            continue;
        };
        let me = r.svc.name();
        let mut covering = Vec::new();
        for &to in &r.to {
            if let Some((t, b)) = shortest(r.svc, |n| calls(n, to)) {
                covering.push((
                    t,
                    format!("bulkhead `{b}`'s timeout {} on the same calls", fmt_ms(t)),
                ));
            }
        }
        if let Some((t, b)) = shortest(r.svc, |n| *n == Norm::Any) {
            covering.push((
                t,
                format!(
                    "bulkhead `{b}`'s timeout {} on every call `{me}` serves",
                    fmt_ms(t)
                ),
            ));
        }
        for caller in cx.unique_services().filter(|s| s.name() != me) {
            if let Some((t, b)) = shortest(caller, |n| calls(n, me)) {
                covering.push((
                    t,
                    format!(
                        "`{}`'s timeout {} on its calls to `{me}` (bulkhead `{b}`)",
                        caller.name(),
                        fmt_ms(t)
                    ),
                ));
            }
        }
        let Some((timeout, text)) = covering.into_iter().filter(|(t, _)| *t < worst).min() else {
            continue;
        };
        let backoff = worst - u64::from(r.spec.attempts) * r.spec.per_try_timeout_ms;
        out.push(
            RetryOutlastsTimeout {
                name: r.rule.def.name.node.clone(),
                worst: fmt_ms(worst),
                attempts: r.spec.attempts,
                per_try: fmt_ms(r.spec.per_try_timeout_ms),
                backoff: fmt_ms(backoff),
                covering: text,
                timeout: fmt_ms(timeout),
                src: cx.src(r.svc.file),
                span: r.rule.def.name.span.into(),
            }
            .into(),
        );
    }
}
