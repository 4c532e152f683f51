//! `gov::lint::unverified-consumer` (warning): a rule scoped to consumers (a
//! limit `per consumer`, a bulkhead's `share by consumer`, a match on
//! `consumer "..."`) in a service that does
//! not say where its consumers come from, so the agent reads the
//! `x-gov-consumer` header as any client sends it.
//!
//! Why: an unverified consumer proves nothing. A client rotating names
//! escapes a `per consumer` limit, and one naming itself `web` spends `web`'s
//! quota, escapes a fuse scoped to `crm` or takes `crm`'s share of a
//! bulkhead.
//!
//! Example: `limit l on api { calls 3 per 1h  per consumer }` in a service
//! without a `consumer from` statement.
//!
//! Fix: verify callers: `consumer from peer on invalid reject` (the calling
//! service, from mutual TLS between agents), `consumer from header
//! "x-gov-consumer" trusted from peer "gateway"` (the header only as a
//! verified gateway sets it) or `consumer from jwt header "authorization"
//! issuer "..." audience "..." keys "FILE" claim "client_id" on invalid
//! reject`; when a gateway in front that is not an agent sets the header
//! itself and drops the client's, say so with `consumer from header
//! "x-gov-consumer"`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadSetting};
use crate::kind::limit::{KeyPart, Limit, LimitKey, LimitSetting};
use crate::resolve::{Ctx, Norm, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "`{rule}` is scoped to consumers, but service `{service}` reads them unverified from `x-gov-consumer`"
)]
#[diagnostic(
    code("gov::lint::unverified-consumer"),
    severity(Warning),
    help(
        "any client can send any consumer: verify callers with `consumer from peer on invalid reject` (the calling service, over mutual TLS between agents), `consumer from header \"x-gov-consumer\" trusted from peer \"gateway\"` (only a verified gateway's header), or `consumer from jwt header \"authorization\" issuer \"...\" audience \"...\" keys \"FILE\" claim \"client_id\" on invalid reject`; if a gateway in front that is not an agent sets the header and drops the client's, declare `consumer from header \"x-gov-consumer\"`"
    )
)]
pub struct UnverifiedConsumer {
    pub rule: String,
    pub service: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "scoped to consumers here")]
    pub span: SourceSpan,
}

fn mentions_consumer(norm: &Norm<'_>) -> bool {
    match norm {
        Norm::Consumer(_) => true,
        Norm::And(items) | Norm::Or(items) => items.iter().any(mentions_consumer),
        _ => false,
    }
}

pub(crate) fn check<D: From<UnverifiedConsumer>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        if svc.consumer.is_some() {
            continue;
        }
        for (rule, norm) in svc.rules_with_norms() {
            let per_consumer = Limit::of(rule).and_then(|l| {
                l.settings.iter().rev().find_map(|s| match s {
                    LimitSetting::Per { key, span, .. } if key.node == LimitKey::Consumer => {
                        Some(*span)
                    }
                    LimitSetting::Per { parts, .. } => parts
                        .iter()
                        .find(|p| p.node == KeyPart::Consumer)
                        .map(|p| p.span),
                    _ => None,
                })
            });
            let shared = Bulkhead::of(rule).and_then(|b| {
                b.settings.iter().find_map(|s| match s {
                    BulkheadSetting::Share(share) => Some(share.span),
                    _ => None,
                })
            });
            let span = match per_consumer.or(shared) {
                Some(span) => span,
                None if mentions_consumer(norm) => rule.def.on.span(),
                None => continue,
            };
            out.push(
                UnverifiedConsumer {
                    rule: rule.def.name.node.clone(),
                    service: svc.name().to_string(),
                    src: cx.src(svc.file),
                    span: span.into(),
                }
                .into(),
            );
        }
    }
}
