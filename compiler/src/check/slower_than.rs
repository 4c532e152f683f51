//! `gov::slower-than`: a slow metric (`slow_calls`, `slow_call_ratio`)
//! without `slower than D`, or an error metric with one.
//!
//! Why: a slow call is a call slower than a threshold the policy names; any
//! default would be a guess about the service. On an error metric the
//! clause would mean nothing (errors are what `classify` says, whatever
//! their latency), so the compiler refuses it rather than ignore it.
//!
//! Example: `trip when slow_call_ratio > 50% over 1m min_calls 20`, or
//! `trip when error_ratio > 50% over 1m slower than 2s`.
//!
//! Fix: say what a slow call is after the window of a slow metric
//! (`trip when slow_call_ratio > 50% over 1m slower than 2s min_calls 20`);
//! remove `slower than` from an error metric, or trip on `slow_calls` or
//! `slow_call_ratio` to count slow calls.

use miette::SourceSpan;
use thiserror::Error;

use super::threshold_kind::metric_name;
use crate::kind::fuse::Fuse;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{message}")]
#[diagnostic(code("gov::slower-than"))]
pub struct SlowerThan {
    pub message: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{label}")]
    pub span: SourceSpan,
    pub label: String,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<SlowerThan>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(f) = Fuse::of(rule) else { continue };
            for t in f.trips() {
                let metric = metric_name(t.metric.node);
                let d = match (t.metric.node.is_slow(), &t.slower_than) {
                    (true, None) => SlowerThan {
                        message: format!(
                            "`{metric}` needs `slower than D`: how slow a call must be to count"
                        ),
                        src: cx.src(svc.file),
                        span: t.metric.span.into(),
                        label: "slower than what?".into(),
                        help: format!(
                            "add it after the window: `... over {} slower than 2s`, with the latency above which a call is slow",
                            cx.text(svc.file, t.window.span)
                        ),
                    },
                    (false, Some((_, clause))) => SlowerThan {
                        message: format!(
                            "`slower than` on `{metric}`, which counts errors whatever their latency"
                        ),
                        src: cx.src(svc.file),
                        span: (*clause).into(),
                        label: "only for `slow_calls` and `slow_call_ratio`".into(),
                        help: format!(
                            "remove `{}`, or count slow calls in a trip of their own with `slow_calls` or `slow_call_ratio`",
                            cx.text(svc.file, *clause)
                        ),
                    },
                    _ => continue,
                };
                out.push(d.into());
            }
        }
    }
}
