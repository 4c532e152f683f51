//! `gov::lint::slow-above-timeout` (warning): a slow-call trip whose
//! `slower than D` is at or above the `timeout` of a bulkhead on the same
//! calls.
//!
//! The bulkhead cuts every call it admits off at its timeout `T`, and a
//! call cut off counts as slow (and, by default, as a system error). With
//! `slower than S` and `S >= T` no call can finish slower than `S`, so the
//! trip counts only the timeouts: its threshold decides nothing, and calls
//! that are slow but finish before `T` are never counted. "The same calls"
//! is as for `gov::conflicting-rules` (the `on` expressions are equal once
//! match references are expanded); a bulkhead in `mode shadow` sets no
//! deadline and is left out. A bulkhead over only some of the fuse's calls
//! is not compared: the others can still be slow.
//!
//! Why: Resilience4j users meet the same trap (`slowCallDurationThreshold`
//! above the time limiter's timeout): the breaker they configured for slow
//! calls only ever sees timeouts.
//!
//! Example: `bulkhead b on report { max_concurrent 10  timeout 2s }` and
//! `fuse f on report { trip when slow_call_ratio > 50% over 1m slower than 5s }`.
//!
//! Fix: lower `slower than` below the timeout (`slower than 1s`), or, to
//! trip on timeouts, count them as errors (`trip when system_errors >= 10
//! over 1m`; a timeout is a system error by default).

use gov_lang::ast::Span;
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::RuleMode;
use crate::kind::bulkhead::{Bulkhead, BulkheadSetting};
use crate::kind::fuse::Fuse;
use crate::resolve::{Ctx, Src};
use crate::units::millis;

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "fuse `{fuse}` counts calls slower than {slower}, but bulkhead `{bulkhead}` cuts every call off at {timeout}"
)]
#[diagnostic(
    code("gov::lint::slow-above-timeout"),
    severity(Warning),
    help(
        "lower `slower than` below {timeout} so that slow calls that still finish count; to trip on timeouts, trip on `system_errors` (a timeout is a system error by default)"
    )
)]
pub struct SlowAboveTimeout {
    pub fuse: String,
    pub bulkhead: String,
    pub slower: String,
    pub timeout: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no call finishes this slow: only timeouts count")]
    pub span: SourceSpan,
    #[label("the calls' timeout")]
    pub timeout_span: SourceSpan,
}

pub(crate) fn check<D: From<SlowAboveTimeout>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        // The enforced bulkhead timeouts, with the index of their rule.
        let timeouts: Vec<(usize, &str, Span, i64)> = svc
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| !RuleMode::of(r.def).shadow)
            .filter_map(|(i, r)| {
                let b = Bulkhead::of(r)?;
                b.settings.iter().find_map(|s| match s {
                    BulkheadSetting::Timeout { value } => {
                        Some((i, b.name.node.as_str(), value.span, millis(&value.node)))
                    }
                    _ => None,
                })
            })
            .collect();
        if timeouts.is_empty() {
            continue;
        }
        for (j, rule) in svc.rules.iter().enumerate() {
            let Some(f) = Fuse::of(rule) else { continue };
            if !svc.norms[j].is_valid() {
                continue;
            }
            for t in f.trips().filter(|t| t.metric.node.is_slow()) {
                let Some((slower, clause)) = &t.slower_than else {
                    continue;
                };
                let s = millis(&slower.node);
                // The shortest timeout over the same calls decides.
                let shortest = timeouts
                    .iter()
                    .filter(|(i, ..)| svc.norms[*i] == svc.norms[j])
                    .min_by_key(|(.., ms)| *ms);
                let Some(&(_, bulkhead, span, ms)) = shortest else {
                    continue;
                };
                if s < ms {
                    continue;
                }
                out.push(
                    SlowAboveTimeout {
                        fuse: f.name.node.clone(),
                        bulkhead: bulkhead.to_string(),
                        slower: cx.text(svc.file, slower.span).to_string(),
                        timeout: cx.text(svc.file, span).to_string(),
                        src: cx.src(svc.file),
                        span: (*clause).into(),
                        timeout_span: span.into(),
                    }
                    .into(),
                );
            }
        }
    }
}
