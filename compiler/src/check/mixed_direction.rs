//! `gov::mixed-direction`: a match that combines outbound calls
//! (`calls to X`) and inbound calls with `or`.
//!
//! Why: a rule is enforced either where the service receives calls (server
//! side) or where it makes them (client side). `calls to inventory or path
//! prefix "/api"` asks for both at once, so one rule would count two
//! unrelated flows in one counter.
//!
//! Example: `match m = calls to inventory or path prefix "/stock"`.
//!
//! Fix: split it into two matches and two rules, one per direction.
//! (`and` is fine: `calls to inventory and path prefix "/stock"` selects
//! outbound calls to that path.)

use gov_lang::ast::{MatchExpr, ServiceStmt};
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Norm, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("this match mixes outbound `calls to` and inbound calls")]
#[diagnostic(
    code("gov::mixed-direction"),
    help(
        "split it into one match for outbound calls and one for inbound calls, each with its own rule"
    )
)]
pub struct MixedDirection {
    #[source_code]
    pub src: Src,
    #[label(primary, "selects both calls this service makes and calls it receives")]
    pub span: SourceSpan,
}

fn mixed(n: &Norm<'_>) -> bool {
    match n {
        Norm::Or(parts) => {
            let out = parts.iter().filter(|p| p.is_outbound()).count();
            (out != 0 && out != parts.len()) || parts.iter().any(mixed)
        }
        Norm::And(parts) => parts.iter().any(mixed),
        _ => false,
    }
}

pub(crate) fn check<D: From<MixedDirection>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut exprs: Vec<&MatchExpr> = Vec::new();
        for stmt in &svc.ast.body {
            if let ServiceStmt::Match(m) = stmt {
                exprs.push(&m.expr);
            }
        }
        for rule in &svc.rules {
            // A plain reference is reported at the match it names.
            if !matches!(rule.on(), MatchExpr::Ref { .. }) {
                exprs.push(rule.on());
            }
        }
        for expr in exprs {
            if mixed(&svc.normalize(expr)) {
                out.push(
                    MixedDirection {
                        src: cx.src(svc.file),
                        span: expr.span().into(),
                    }
                    .into(),
                );
            }
        }
    }
}
