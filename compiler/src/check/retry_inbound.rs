//! `gov::retry-on-inbound`: a retry rule whose match is not an outbound
//! `calls to` match.
//!
//! Why: a retry is the caller's to make: it knows whether the call may be
//! sent again and which other instance to send it to. An agent retrying
//! inbound calls to its own service would multiply the load on the one
//! instance it fronts, behind the caller's own retries.
//!
//! Example: `retry r on path prefix "/api" { budget 20% min 10 per 1s }`.
//!
//! Fix: put the retry rule in the calling service, on `calls to PROVIDER`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::retry::Retry;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("retry `{name}` retries inbound calls")]
#[diagnostic(
    code("gov::retry-on-inbound"),
    help("retry in the calling service: `retry NAME on calls to PROVIDER {{ ... }}`")
)]
pub struct RetryOnInbound {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "only outbound (`calls to`) calls are retried")]
    pub span: SourceSpan,
    #[label("this match selects inbound calls")]
    pub on: SourceSpan,
}

pub(crate) fn check<D: From<RetryOnInbound>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for (rule, norm) in svc.rules_with_norms() {
            let Some(r) = Retry::of(rule) else { continue };
            if !norm.is_valid() || norm.is_outbound() {
                continue;
            }
            out.push(
                RetryOnInbound {
                    name: r.name.node.clone(),
                    src: cx.src(svc.file),
                    span: r.name.span.into(),
                    on: r.on.span().into(),
                }
                .into(),
            );
        }
    }
}
