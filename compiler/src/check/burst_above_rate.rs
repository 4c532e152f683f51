//! `gov::burst-above-rate`: a token bucket's `burst` above its `calls`
//! amount.
//!
//! Why: a burst is how many calls a bucket admits at once; a burst above a
//! window's amount admits more in one instant than the limit allows in a
//! whole window, and the agents refuse such a limit.
//!
//! Example: `limit l on api { calls 100 per 1s burst 200 }`.
//!
//! Fix: a burst of at most the amount, or a larger amount over a longer
//! window (`calls 200 per 2s burst 200`).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Algorithm, Limit, LimitEff, LimitSetting};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}` has a burst of {burst} above its {amount} calls per window")]
#[diagnostic(
    code("gov::burst-above-rate"),
    help(
        "a burst is how many calls come in at once: keep it at most the amount ({amount}), or count a larger amount over a longer window"
    )
)]
pub struct BurstAboveRate {
    pub name: String,
    pub burst: i64,
    pub amount: i64,
    #[source_code]
    pub src: Src,
    #[label(primary, "at most {amount}")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<BurstAboveRate>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(l) = Limit::of(rule) else { continue };
            if LimitEff::of(&l).algorithm != Algorithm::TokenBucket {
                continue;
            }
            for s in &l.settings {
                if let LimitSetting::Calls {
                    amount,
                    burst: Some(burst),
                    ..
                } = s
                    && burst.node > amount.node
                    && amount.node > 0
                {
                    out.push(
                        BurstAboveRate {
                            name: l.name.node.clone(),
                            burst: burst.node,
                            amount: amount.node,
                            src: cx.src(svc.file),
                            span: burst.span.into(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
