//! `gov::invalid-peer`: a name in `trusted from peer "..."` is not a
//! service name, so no agent's certificate can ever name it.
//!
//! Why: `consumer from header "H" trusted from peer "gateway"` believes the
//! header only from agents whose certificate names one of the listed
//! services. A certificate names a service (`spiffe://DOMAIN/.../service/NAME`
//! or its CN) made of letters, digits, `-` and `_`; a name with anything
//! else, or an empty one, would match no caller, so every caller's header
//! would be removed without a word. The agent refuses such a config.
//!
//! Example: `consumer from header "x-consumer" trusted from peer "api gateway"`.
//!
//! Fix: name the calling service as its agents' `--service` names it (the
//! name in their certificate), for example `trusted from peer "gateway"`.

use gov_lang::ast::{ConsumerSource, ServiceStmt};
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{name}` is not a service name")]
#[diagnostic(
    code("gov::invalid-peer"),
    help(
        "name the calling service as its agents' --service names it (letters, digits, `-` and `_`), for example `trusted from peer \"gateway\"`"
    )
)]
pub struct InvalidPeer {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no agent certificate can name this")]
    pub span: SourceSpan,
}

/// Whether `name` is a service name a certificate can carry.
pub(crate) fn is_service_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub(crate) fn check<D: From<InvalidPeer>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for stmt in &svc.ast.body {
            let ServiceStmt::Consumer(c) = stmt else {
                continue;
            };
            let ConsumerSource::Header { trusted, .. } = &c.source else {
                continue;
            };
            for peer in trusted.iter().filter(|p| !is_service_name(&p.node)) {
                out.push(
                    InvalidPeer {
                        name: peer.node.clone(),
                        src: cx.src(svc.file),
                        span: peer.span.into(),
                    }
                    .into(),
                );
            }
        }
    }
}
