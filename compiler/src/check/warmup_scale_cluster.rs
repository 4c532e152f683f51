//! `gov::warmup-scale-cluster`: a limit with `scale with warmup` counts in
//! the cluster (`scope cluster`).
//!
//! Why: `scale with warmup` scales what one instance admits by that
//! instance's slow-start weight; a cluster limit's amount is shared by
//! every instance through Redis, so no one instance's weight can scale it.
//! The agents refuse such a config.
//!
//! Example: `limit l on any { calls 100 per 1s  scope cluster  scale with warmup }`.
//!
//! Fix: count the ramping limit locally (`scope local`, the default), or
//! remove `scale with warmup`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Limit, LimitEff, Scope};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}` scales with one instance's warmup but counts in the cluster")]
#[diagnostic(
    code("gov::warmup-scale-cluster"),
    help("count it locally (`scope local`, the default), or remove `scale with warmup`")
)]
pub struct WarmupScaleCluster {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "scales by this instance's weight")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<WarmupScaleCluster>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(l) = Limit::of(rule) else { continue };
            let e = LimitEff::of(&l);
            let Some(span) = e.warmup_scale else { continue };
            if e.scope == Scope::Local {
                continue;
            }
            out.push(
                WarmupScaleCluster {
                    name: rule.def.name.node.clone(),
                    src: cx.src(svc.file),
                    span: span.into(),
                }
                .into(),
            );
        }
    }
}
