//! `gov::cluster-sync-undeclared`: `scope cluster` without `sync exact` or
//! `sync batch D`.
//!
//! Why: a cluster-wide limit shares its counters through a store. Exact
//! sync costs a round trip per call; batched sync leases calls from the
//! store ahead of time, so most calls cost nothing, but a few leased calls
//! may go unused at the end of a window. Which trade-off a limit makes must
//! be a declared choice, not an accident of a default.
//!
//! Example: `limit l on api { calls 100 per 1s  scope cluster }`.
//!
//! Fix: `scope cluster sync exact` (precise, one store call per request) or
//! `scope cluster sync batch 100ms` (cheap, leased ahead, topped up every 100ms).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Limit, LimitScope, LimitSetting};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("cluster limit `{name}` does not declare how its counters are shared")]
#[diagnostic(
    code("gov::cluster-sync-undeclared"),
    help(
        "add `sync exact` (one store call per request, precise) or `sync batch 100ms` (calls leased from the store ahead, topped up every 100ms; a few may go unused)"
    )
)]
pub struct ClusterSyncUndeclared {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "`scope cluster` needs `sync exact` or `sync batch D`")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<ClusterSyncUndeclared>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(l) = Limit::of(rule) else { continue };
            for s in &l.settings {
                if let LimitSetting::Scope {
                    scope: LimitScope::Cluster { sync: None },
                    span,
                } = s
                {
                    out.push(
                        ClusterSyncUndeclared {
                            name: l.name.node.clone(),
                            src: cx.src(svc.file),
                            span: (*span).into(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
