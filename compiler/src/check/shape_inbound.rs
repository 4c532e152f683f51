//! `gov::shape-on-inbound`: `action shape` on a limit whose match is not an
//! outbound `calls to` match.
//!
//! Why: shaping delays calls toward a provider that cannot take more; it
//! makes sense for the caller. On inbound calls it holds the service's own
//! workers while the callers wait, the very queueing that limits prevent.
//!
//! Example: `limit l on path prefix "/api" { calls 10 per 1s  action shape max_delay 1s }`.
//!
//! Fix: use `action reject` (the default) on inbound limits, or put the
//! shaping limit on `calls to PROVIDER` in the calling service.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Limit, LimitAction, LimitSetting};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}` shapes inbound calls")]
#[diagnostic(
    code("gov::shape-on-inbound"),
    help(
        "shape outbound calls (`on calls to PROVIDER`) in the caller, or reject inbound calls with `action reject`"
    )
)]
pub struct ShapeOnInbound {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "`action shape` is only for outbound calls")]
    pub span: SourceSpan,
    #[label("this match selects inbound calls")]
    pub on: SourceSpan,
}

pub(crate) fn check<D: From<ShapeOnInbound>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for (rule, norm) in svc.rules_with_norms() {
            let Some(l) = Limit::of(rule) else { continue };
            if !norm.is_valid() || norm.is_outbound() {
                continue;
            }
            for s in &l.settings {
                if let LimitSetting::Action {
                    action: LimitAction::Shape { .. },
                    span,
                } = s
                {
                    out.push(
                        ShapeOnInbound {
                            name: l.name.node.clone(),
                            src: cx.src(svc.file),
                            span: (*span).into(),
                            on: l.on.span().into(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
