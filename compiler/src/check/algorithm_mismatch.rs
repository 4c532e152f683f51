//! `gov::algorithm-mismatch`: an algorithm, or a burst, on a limit that
//! cannot count that way.
//!
//! Why: bytes are counted in fixed windows (they are added as bodies
//! stream, after admission), and only a token bucket has a burst: any
//! other pairing would be ignored or refused by the agents, so it is
//! refused here. (Every algorithm works with `scope cluster`, `sync exact`
//! and `sync batch` alike.)
//!
//! Example: `limit l on api { bytes 10MiB per 1m  algorithm sliding window }`.
//!
//! Fix: `algorithm` on a limit with `calls N per D`; `burst` with
//! `algorithm token bucket` (or no `algorithm`: the token bucket is the
//! default).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Algorithm, Limit, LimitEff, LimitSetting};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}`: {problem}")]
#[diagnostic(code("gov::algorithm-mismatch"), help("{help}"))]
pub struct AlgorithmMismatch {
    pub name: String,
    pub problem: String,
    pub help: &'static str,
    #[source_code]
    pub src: Src,
    #[label(primary, "here")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<AlgorithmMismatch>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(l) = Limit::of(rule) else { continue };
            let e = LimitEff::of(&l);
            let mismatch = |problem: String, help: &'static str, span: gov_lang::ast::Span| {
                AlgorithmMismatch {
                    name: l.name.node.clone(),
                    problem,
                    help,
                    src: cx.src(svc.file),
                    span: span.into(),
                }
            };
            for s in &l.settings {
                match s {
                    LimitSetting::Calls {
                        burst: Some(burst), ..
                    } if e.algorithm != Algorithm::TokenBucket => {
                        out.push(
                            mismatch(
                                format!("a burst with `algorithm {}`", e.algorithm.words()),
                                "only a token bucket has a burst: remove `burst`, or say `algorithm token bucket`",
                                burst.span,
                            )
                            .into(),
                        );
                    }
                    LimitSetting::Algorithm { algorithm, span }
                        if e.calls.is_none() && *algorithm != Algorithm::FixedWindow =>
                    {
                        out.push(
                            mismatch(
                                format!("`algorithm {}` without `calls`", algorithm.words()),
                                "bytes are counted in fixed windows (added as bodies stream); an algorithm applies to `calls N per D`",
                                *span,
                            )
                            .into(),
                        );
                    }
                    _ => {}
                }
            }
        }
    }
}
