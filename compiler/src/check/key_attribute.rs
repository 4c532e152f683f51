//! `gov::key-attribute`: a limit keyed on an attribute its calls cannot
//! show: a path segment the rule's match does not capture (`per segment
//! "tenant"` without `path prefix "..." segment "tenant"`), gRPC metadata on
//! a match that is not only gRPC calls, a header name that is no header name,
//! an empty name or one over 128 bytes, more than 4 parts, or a claim
//! (`per claim "tenant"`) where no token is verified (a service without
//! `consumer from jwt`, an outbound rule).
//!
//! Why: every call would count under the key's `%absent` value, one
//! counter for everyone, which is `per all` under another name; an agent
//! refuses a key of more than 4 parts or a name it cannot read.
//!
//! Example: `match api = path prefix "/t/"` and `limit l on api { calls 10
//! per 1s  per segment "tenant" }`.
//!
//! Fix: capture the segment in the match (`path prefix "/t/" segment
//! "tenant"`), key a non-gRPC match on `header` rather than `metadata`
//! (gRPC metadata is an HTTP/2 header), and keep a key to 4 parts with names
//! of 1 to 128 bytes.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{KeyPart, Limit, LimitSetting, MAX_KEY_PARTS};
use crate::resolve::{Ctx, Src};

/// The longest name a key part reads (as the agents bound it).
const MAX_NAME: usize = 128;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{part}` on limit `{rule}`: {why}")]
#[diagnostic(code("gov::key-attribute"))]
pub struct KeyAttribute {
    pub part: String,
    pub rule: String,
    pub why: String,
    #[help]
    pub help: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no agent keys on this")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<KeyAttribute>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(l) = Limit::of(rule) else { continue };
            let jwt = matches!(
                svc.consumer.map(|c| &c.source),
                Some(gov_lang::ast::ConsumerSource::Jwt(_))
            );
            let outbound = svc.normalize(l.on).is_outbound();
            for s in &l.settings {
                let LimitSetting::Per { parts, span, .. } = s else {
                    continue;
                };
                let mut report = |part: String, why: String, help: &str, at| {
                    out.push(
                        KeyAttribute {
                            part,
                            rule: l.name.node.clone(),
                            why,
                            help: help.to_string(),
                            src: cx.src(svc.file),
                            span: at,
                        }
                        .into(),
                    );
                };
                if parts.len() > MAX_KEY_PARTS {
                    report(
                        "per".into(),
                        format!("{} parts, more than {MAX_KEY_PARTS}", parts.len()),
                        "key on at most 4 attributes",
                        (*span).into(),
                    );
                }
                for p in parts {
                    let at: SourceSpan = p.span.into();
                    let name = match &p.node {
                        KeyPart::Service | KeyPart::Consumer => continue,
                        KeyPart::Header(n)
                        | KeyPart::Metadata(n)
                        | KeyPart::Query(n)
                        | KeyPart::Segment(n)
                        | KeyPart::Claim(n) => n,
                    };
                    if name.is_empty() || name.len() > MAX_NAME {
                        report(
                            p.node.describe(),
                            "the name is empty or longer than 128 bytes".into(),
                            "name the attribute with 1 to 128 bytes",
                            at,
                        );
                        continue;
                    }
                    match &p.node {
                        KeyPart::Header(n) | KeyPart::Metadata(n) if !n.bytes().all(tchar) => {
                            report(
                                p.node.describe(),
                                format!("`{n}` is not a header name"),
                                "a header name is letters, digits and `-` (no `:` pseudo-header)",
                                at,
                            );
                        }
                        KeyPart::Metadata(_) if !svc.grpc_only(l.on) => report(
                            p.node.describe(),
                            "its match is not only gRPC calls".into(),
                            "key on `header` (gRPC metadata is an HTTP/2 header), or match `grpc service` / `grpc method`",
                            at,
                        ),
                        KeyPart::Segment(n) if !svc.captures(l.on).iter().any(|(c, _)| c == n) => {
                            report(
                                p.node.describe(),
                                format!("its match captures no segment `{n}`"),
                                &format!(
                                    "capture it in the match: `path prefix \"/...\" segment \"{n}\"`"
                                ),
                                at,
                            )
                        }
                        KeyPart::Claim(_) if !jwt || outbound => report(
                            p.node.describe(),
                            if jwt {
                                "a claim is verified on inbound calls only".into()
                            } else {
                                format!("service `{}` verifies no token", svc.name())
                            },
                            "key on a claim only where `consumer from jwt ...` verifies the caller's token, on inbound rules",
                            at,
                        ),
                        _ => {}
                    }
                }
            }
        }
    }
}

/// A byte of a header name (RFC 9110 section 5.6.2 `tchar`).
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
