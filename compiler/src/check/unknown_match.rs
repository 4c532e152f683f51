//! `gov::unknown-match`: a rule or a match refers to a match that the
//! service does not define.
//!
//! Why: a rule on a misspelt match would otherwise select nothing, and the
//! protection it was meant to give silently disappears (Sentinel and
//! ServiceComb drop such a rule with a log line).
//!
//! Example: `match supplier = ...` then `limit l on suplier { ... }`.
//!
//! Fix: use the name of a match defined in the same service (the help
//! suggests the closest one), or define the match.

use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src, refs};
use crate::suggest;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("unknown match `{name}` in service `{service}`")]
#[diagnostic(code("gov::unknown-match"))]
pub struct UnknownMatch {
    pub name: String,
    pub service: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no match of this name")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<UnknownMatch>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut names = Vec::new();
        for stmt in &svc.ast.body {
            if let gov_lang::ast::ServiceStmt::Match(m) = stmt {
                refs(&m.expr, &mut names);
            }
        }
        for rule in &svc.rules {
            refs(rule.on(), &mut names);
        }
        for name in names {
            if svc.matches.contains_key(name.node.as_str()) || cx.match_skipped(svc, &name.node) {
                continue;
            }
            out.push(
                UnknownMatch {
                    name: name.node.clone(),
                    service: svc.name().to_string(),
                    src: cx.src(svc.file),
                    span: name.span.into(),
                    help: suggest::help("match", &name.node, &svc.match_names()),
                }
                .into(),
            );
        }
    }
}
