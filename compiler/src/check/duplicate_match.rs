//! `gov::duplicate-match`: two `match NAME = ...` with the same name in one
//! service.
//!
//! Why: rules refer to matches by name; with two definitions a rule could
//! protect other calls than its author meant.
//!
//! Example: `match slow = path prefix "/a"` and `match slow = path prefix "/b"`.
//!
//! Fix: rename one, or combine them: `match slow = path prefix "/a" or path prefix "/b"`.

use gov_lang::ast::ServiceStmt;
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("match `{name}` is defined twice in service `{service}`")]
#[diagnostic(
    code("gov::duplicate-match"),
    help("rename one, or combine both expressions with `or` in one match")
)]
pub struct DuplicateMatch {
    pub name: String,
    pub service: String,
    #[source_code]
    pub src: Src,
    #[label("first defined here")]
    pub first: SourceSpan,
    #[label(primary, "defined again here")]
    pub again: SourceSpan,
}

pub(crate) fn check<D: From<DuplicateMatch>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for stmt in &svc.ast.body {
            let ServiceStmt::Match(m) = stmt else {
                continue;
            };
            let first = svc.matches[m.name.node.as_str()];
            if std::ptr::eq(first, m) {
                continue;
            }
            out.push(
                DuplicateMatch {
                    name: m.name.node.clone(),
                    service: svc.name().to_string(),
                    src: cx.src(svc.file),
                    first: first.name.span.into(),
                    again: m.name.span.into(),
                }
                .into(),
            );
        }
    }
}
