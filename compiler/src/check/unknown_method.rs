//! `gov::unknown-method`: an HTTP method that does not exist, in a
//! `method X` match or an `http X "/path"` call.
//!
//! Why: `method GTE` matches no request, and a readiness probe with an
//! unknown method never succeeds, so the instance never becomes ready.
//!
//! Example: `match reads = method get`.
//!
//! Fix: write one of `GET HEAD POST PUT DELETE PATCH OPTIONS TRACE CONNECT`
//! in upper case (HTTP methods are case-sensitive).

use gov_lang::ast::{self, Action, MatchExpr, ServiceStmt, ShutdownStep, Spanned, WarmupStep};
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::retry::{Retry, RetrySetting};
use crate::resolve::{Ctx, Src};
use crate::suggest;

pub(crate) const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT",
];

#[derive(Debug, Error, miette::Diagnostic)]
#[error("unknown http method `{name}`")]
#[diagnostic(code("gov::unknown-method"))]
pub struct UnknownMethod {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "not an http method")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

fn in_expr<'a>(expr: &'a MatchExpr, out: &mut Vec<&'a ast::Ident>) {
    match expr {
        MatchExpr::Method { method, .. } => out.push(method),
        MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
            in_expr(lhs, out);
            in_expr(rhs, out);
        }
        MatchExpr::Group { inner, .. } => in_expr(inner, out),
        _ => {}
    }
}

pub(crate) fn check<D: From<UnknownMethod>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut methods = Vec::new();
        for stmt in &svc.ast.body {
            match stmt {
                ServiceStmt::Match(m) => in_expr(&m.expr, &mut methods),
                ServiceStmt::Warmup(w) => {
                    for step in &w.steps {
                        match step {
                            WarmupStep::Ready { probe, .. } => methods.push(&probe.method),
                            WarmupStep::Start {
                                action: Action::Http(call),
                                ..
                            } => {
                                methods.push(&call.method);
                            }
                            _ => {}
                        }
                    }
                }
                ServiceStmt::Shutdown(s) => {
                    for step in &s.steps {
                        if let ShutdownStep::Stop {
                            action: Action::Http(call),
                            ..
                        } = step
                        {
                            methods.push(&call.method);
                        }
                    }
                }
                _ => {}
            }
        }
        for rule in &svc.rules {
            in_expr(rule.on(), &mut methods);
        }
        let mut named: Vec<Spanned<String>> = methods.into_iter().cloned().collect();
        // A retry rule's `methods` (read in any case, retried upper case).
        for rule in &svc.rules {
            for setting in Retry::of(rule).map(|r| r.settings).unwrap_or_default() {
                if let RetrySetting::Methods { names } = setting {
                    named.extend(names.into_iter().filter(|n| {
                        let upper = n.node.to_ascii_uppercase();
                        !METHODS.contains(&upper.as_str())
                    }));
                }
            }
        }
        for m in named {
            if METHODS.contains(&m.node.as_str()) {
                continue;
            }
            let help = match suggest::closest(&m.node, METHODS.iter().copied()) {
                Some(name) => format!("did you mean `{name}`? http methods are upper case"),
                None => format!("use one of {}", METHODS.join(", ")),
            };
            out.push(
                UnknownMethod {
                    name: m.node.clone(),
                    src: cx.src(svc.file),
                    span: m.span.into(),
                    help,
                }
                .into(),
            );
        }
    }
}
