//! `gov::share-without-consumer`: a `share by consumer` on a bulkhead or a
//! limit whose calls carry no consumer to share by: one on outbound calls
//! (`calls to`, the service's own calls), or one whose match admits a
//! single consumer.
//!
//! Why: the share divides the permits (or a limit's calls per window)
//! between the consumers of the calls the rule admits (the caller, as the
//! service reads it: `consumer from`). A service's outbound calls are its own, and a match on `consumer
//! "crm"` admits only `crm`'s: every call falls in one class, and the share
//! does nothing. The agent refuses a share on a bulkhead keyed `per
//! instance` (and, on a limit, see `gov::limit-share-scope`).
//!
//! Example: `bulkhead b on calls to inventory { max_concurrent 10  share by
//! consumer { crm 3  web 1 } }`.
//!
//! Fix: put the share on the bulkhead or limit of the inbound calls the
//! consumers make, on a match that admits every consumer, or drop it.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::shares;
use crate::resolve::{Ctx, Norm, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{kind} `{name}` shares by consumer, but {why}")]
#[diagnostic(
    code("gov::share-without-consumer"),
    help(
        "share the bulkhead or limit of inbound calls, on a match that admits every consumer, or remove `share`"
    )
)]
pub struct ShareWithoutConsumer {
    pub kind: &'static str,
    pub name: String,
    pub why: &'static str,
    #[source_code]
    pub src: Src,
    #[label(primary, "shared by consumer here")]
    pub span: SourceSpan,
    #[label("this match")]
    pub on: SourceSpan,
}

/// Why the calls of `norm` carry no consumer to share by, if they do not.
fn no_consumer(norm: &Norm<'_>) -> Option<&'static str> {
    if norm.is_outbound() {
        return Some("its calls are the service's own outbound calls");
    }
    let one = match norm {
        Norm::Consumer(_) => true,
        Norm::And(parts) => parts.iter().any(|p| matches!(p, Norm::Consumer(_))),
        _ => false,
    };
    one.then_some("its match admits the calls of one consumer only")
}

pub(crate) fn check<D: From<ShareWithoutConsumer>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for (rule, norm) in svc.rules_with_norms() {
            if !norm.is_valid() {
                continue;
            }
            let Some(why) = no_consumer(norm) else {
                continue;
            };
            for s in shares::of(rule) {
                out.push(
                    ShareWithoutConsumer {
                        kind: s.kind,
                        name: s.name.node.clone(),
                        why,
                        src: cx.src(svc.file),
                        span: s.share.span.into(),
                        on: s.on.span().into(),
                    }
                    .into(),
                );
            }
        }
    }
}
