//! `gov::invalid-grpc-name`: a `grpc service` or `grpc method` match whose
//! name cannot be a gRPC service or method.
//!
//! Why: a gRPC call's HTTP/2 path is `/{package.Service}/{Method}`; a name
//! with a space, a leading `/` or a missing method matches no call, so the
//! rule on it never applies.
//!
//! Example: `grpc method "shop.Order"` (no method), `grpc service
//! "/shop.Order"`.
//!
//! Fix: write the fully qualified service (`shop.v1.Order`) and, for a
//! method, `shop.v1.Order/Create`: letters, digits, `_` and `.`, with one
//! `/` before the method.

use gov_lang::ast::{GrpcKind, MatchExpr, ServiceStmt};
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{name}` is not a grpc {what} name")]
#[diagnostic(code("gov::invalid-grpc-name"))]
pub struct InvalidGrpcName {
    pub name: String,
    pub what: &'static str,
    #[source_code]
    pub src: Src,
    #[label(primary, "{label}")]
    pub span: SourceSpan,
    pub label: String,
    #[help]
    pub help: String,
}

/// A protobuf full name: dot-separated identifiers.
fn full_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|part| {
            part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// What is wrong with `name` as a `kind`, if anything.
fn problem(kind: GrpcKind, name: &str) -> Option<&'static str> {
    match kind {
        GrpcKind::Service if name.contains('/') => {
            Some("a service has no `/`; to match one method write `grpc method`")
        }
        GrpcKind::Service => (!full_name(name)).then_some("not a fully qualified service"),
        GrpcKind::Method => match name.split_once('/') {
            None => Some("a method is `package.Service/Method`"),
            Some((service, method)) => {
                (!full_name(service) || method.contains('.') || !full_name(method))
                    .then_some("not `package.Service/Method`")
            }
        },
    }
}

fn in_expr<'a>(expr: &'a MatchExpr, out: &mut Vec<&'a MatchExpr>) {
    match expr {
        MatchExpr::Grpc { .. } => out.push(expr),
        MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
            in_expr(lhs, out);
            in_expr(rhs, out);
        }
        MatchExpr::Group { inner, .. } => in_expr(inner, out),
        _ => {}
    }
}

pub(crate) fn check<D: From<InvalidGrpcName>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut found = Vec::new();
        for stmt in &svc.ast.body {
            if let ServiceStmt::Match(m) = stmt {
                in_expr(&m.expr, &mut found);
            }
        }
        for rule in &svc.rules {
            in_expr(rule.on(), &mut found);
        }
        for e in found {
            let MatchExpr::Grpc { kind, name, .. } = e else {
                continue;
            };
            let Some(label) = problem(*kind, &name.node) else {
                continue;
            };
            out.push(
                InvalidGrpcName {
                    name: name.node.clone(),
                    what: match kind {
                        GrpcKind::Service => "service",
                        GrpcKind::Method => "method",
                    },
                    src: cx.src(svc.file),
                    span: name.span.into(),
                    label: label.to_string(),
                    help: "write `grpc service \"pkg.v1.Svc\"` or `grpc method \"pkg.v1.Svc/Method\"`, as in the .proto file".to_string(),
                }
                .into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(problem(GrpcKind::Service, "shop.v1.Order"), None);
        assert_eq!(problem(GrpcKind::Method, "shop.v1.Order/Create"), None);
        assert!(problem(GrpcKind::Service, "").is_some());
        assert!(problem(GrpcKind::Service, "shop..Order").is_some());
        assert!(problem(GrpcKind::Service, "/shop.Order").is_some());
        assert!(problem(GrpcKind::Method, "shop.Order").is_some());
        assert!(problem(GrpcKind::Method, "shop.Order/").is_some());
        assert!(problem(GrpcKind::Method, "shop.Order/A/B").is_some());
        assert!(problem(GrpcKind::Method, "shop Order/A").is_some());
    }
}
