//! `gov::per-instance-on-inbound`: `per instance` or `per instance path` on
//! a bulkhead whose match is not an outbound `calls to` match.
//!
//! Why: "instance" means an upstream instance the caller picks; inbound
//! calls have no upstream instance, so the keying would silently fall back
//! to one shared bulkhead.
//!
//! Example: `bulkhead b on path prefix "/api" { per instance  max_concurrent 10 }`.
//!
//! Fix: drop `per instance` for a server-side (per operation) bulkhead, or
//! put the bulkhead on `calls to PROVIDER`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadKey, BulkheadSetting};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("bulkhead `{name}` is keyed per upstream instance but guards inbound calls")]
#[diagnostic(
    code("gov::per-instance-on-inbound"),
    help(
        "remove `per instance` for a server-side bulkhead, or match `calls to SERVICE` for a client-side one"
    )
)]
pub struct PerInstanceOnInbound {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(
        primary,
        "only client-side (`calls to`) bulkheads have upstream instances"
    )]
    pub span: SourceSpan,
    #[label("this match selects inbound calls")]
    pub on: SourceSpan,
}

pub(crate) fn check<D: From<PerInstanceOnInbound>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for (rule, norm) in svc.rules_with_norms() {
            let Some(b) = Bulkhead::of(rule) else {
                continue;
            };
            if !norm.is_valid() || norm.is_outbound() {
                continue;
            }
            for s in &b.settings {
                if let BulkheadSetting::Per { key, span } = s
                    && matches!(key.node, BulkheadKey::Instance | BulkheadKey::InstancePath)
                {
                    out.push(
                        PerInstanceOnInbound {
                            name: b.name.node.clone(),
                            src: cx.src(svc.file),
                            span: (*span).into(),
                            on: b.on.span().into(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
