//! `gov::limit-share-scope`: a limit's `share by consumer` that has no one
//! counter of calls to share: the limit counts in the cluster (`scope
//! cluster`), has a key (`per consumer`, `per service`, `per header ...`),
//! or counts bytes only.
//!
//! Why: the share divides the calls of each window of one local counter
//! between the consumers, by weight, in the agent. A cluster limit's counts
//! are every instance's (the share's would be one agent's); a keyed limit
//! already gives every key a counter of its own (a `per consumer` limit is
//! one counter per consumer); bytes are counted after admission, so they
//! cannot be shared out before it. The agents refuse such a config.
//!
//! Example: `limit l on any { calls 100 per 1s  per consumer  share by
//! consumer { crm 3  web 1 } }`.
//!
//! Fix: share a local limit of `calls` without a key (`per all`, the
//! default), or drop the `share`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Limit, LimitEff, LimitKey};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}` shares by consumer, but {why}")]
#[diagnostic(
    code("gov::limit-share-scope"),
    help(
        "a share divides the calls of one local counter: share a `scope local` limit of `calls` without a key, or remove `share`"
    )
)]
pub struct LimitShareScope {
    pub name: String,
    pub why: &'static str,
    #[source_code]
    pub src: Src,
    #[label(primary, "shared by consumer here")]
    pub span: SourceSpan,
}

/// Why the limit `e` has no one local counter of calls to share, if so.
fn why(e: &LimitEff) -> Option<&'static str> {
    if e.calls.is_none() {
        Some("it counts bytes only (a share divides calls)")
    } else if e.scope.is_cluster() {
        Some("it counts in the cluster (a share's counts are one agent's)")
    } else if !matches!(e.per, LimitKey::All | LimitKey::Domain) {
        Some("it has a key (every key has a counter of its own)")
    } else {
        None
    }
}

pub(crate) fn check<D: From<LimitShareScope>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(l) = Limit::of(rule) else { continue };
            let e = LimitEff::of(&l);
            let Some(share) = &e.share else { continue };
            let Some(why) = why(&e) else { continue };
            out.push(
                LimitShareScope {
                    name: rule.def.name.node.clone(),
                    why,
                    src: cx.src(svc.file),
                    span: share.span.into(),
                }
                .into(),
            );
        }
    }
}
