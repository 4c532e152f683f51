//! `gov::lint::slow-within-latency` (warning): a slow-call trip whose
//! `slower than D` is at or below the `latency` its calls are declared to
//! take.
//!
//! `match NAME = ... latency L` says how long the matched calls take. With
//! `slower than S` and `S <= L`, the calls that take what the policy
//! declares count as slow (at `S = L`, any call a little over its usual
//! time does), so the trip holds on ordinary traffic: the fuse opens for
//! every consumer while the service behaves as declared. The latency is
//! the one every call of the fuse's match is declared to take: a match
//! referred to directly or through `and` (the longest of those), or every
//! side of an `or` (the shortest); a fuse on calls with no declared
//! latency is not compared.
//!
//! Why: a slow-call breaker is for calls slower than usual; one whose
//! threshold is the usual latency is a breaker that trips on load.
//!
//! Example: `match report = path prefix "/report" latency 2s` and
//! `fuse f on report { trip when slow_call_ratio > 50% over 1m slower than 1s }`.
//!
//! Fix: set `slower than` above the declared latency, with a margin for
//! the calls' usual spread (`slower than 5s` for calls that take `2s`), or
//! correct the match's `latency`.

use gov_lang::ast::{Duration, MatchExpr, Spanned};
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::fuse::Fuse;
use crate::resolve::{Ctx, Src, Svc};
use crate::units::millis;

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "fuse `{fuse}` counts calls slower than {slower} as slow, but its calls are declared to take {latency}"
)]
#[diagnostic(
    code("gov::lint::slow-within-latency"),
    severity(Warning),
    help(
        "set `slower than` above {latency}, with a margin for the calls' usual spread, or correct the declared `latency`: as written the fuse trips on ordinary traffic"
    )
)]
pub struct SlowWithinLatency {
    pub fuse: String,
    pub slower: String,
    pub latency: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "calls that take their usual time are slow")]
    pub span: SourceSpan,
    #[label("declared latency")]
    pub latency_span: SourceSpan,
}

/// The latency every call of `expr` is declared to take, if any.
fn every_call<'a>(
    svc: &Svc<'a>,
    expr: &MatchExpr,
    seen: &mut Vec<&'a str>,
) -> Option<&'a Spanned<Duration>> {
    let longer = |a: Option<&'a Spanned<Duration>>, b: Option<&'a Spanned<Duration>>| match (a, b) {
        (Some(x), Some(y)) => Some(if millis(&y.node) > millis(&x.node) {
            y
        } else {
            x
        }),
        (x, y) => x.or(y),
    };
    match expr {
        MatchExpr::Ref { name } => {
            let def = svc.matches.get(name.node.as_str())?;
            if seen.contains(&def.name.node.as_str()) {
                return None;
            }
            seen.push(&def.name.node);
            let inner = every_call(svc, &def.expr, seen);
            seen.pop();
            longer(def.latency.as_ref(), inner)
        }
        MatchExpr::Group { inner, .. } => every_call(svc, inner, seen),
        MatchExpr::And { lhs, rhs, .. } => {
            let l = every_call(svc, lhs, seen);
            longer(l, every_call(svc, rhs, seen))
        }
        MatchExpr::Or { lhs, rhs, .. } => {
            let l = every_call(svc, lhs, seen)?;
            let r = every_call(svc, rhs, seen)?;
            Some(if millis(&r.node) < millis(&l.node) {
                r
            } else {
                l
            })
        }
        _ => None,
    }
}

pub(crate) fn check<D: From<SlowWithinLatency>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(f) = Fuse::of(rule) else { continue };
            let Some(latency) = every_call(svc, rule.on(), &mut Vec::new()) else {
                continue;
            };
            for t in f.trips().filter(|t| t.metric.node.is_slow()) {
                let Some((slower, clause)) = &t.slower_than else {
                    continue;
                };
                if millis(&slower.node) > millis(&latency.node) {
                    continue;
                }
                out.push(
                    SlowWithinLatency {
                        fuse: f.name.node.clone(),
                        slower: cx.text(svc.file, slower.span).to_string(),
                        latency: cx.text(svc.file, latency.span).to_string(),
                        src: cx.src(svc.file),
                        span: (*clause).into(),
                        latency_span: latency.span.into(),
                    }
                    .into(),
                );
            }
        }
    }
}
