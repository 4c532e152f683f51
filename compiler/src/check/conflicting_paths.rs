//! `gov::conflicting-paths`: `paths` names two ways of reading `;` parameters
//! (`paths strict servlet`), or one word twice (`paths servlet servlet`).
//!
//! Why: a service reads its paths one way. `strict` and `servlet` say
//! opposite things about `/x/..;/admin/` (refused, or `/admin/`); which one the
//! agent would apply would be an accident of the word order. A word said
//! twice means nothing more than once, and hides a mistyped second word
//! (`paths servlet servlet` where `paths servlet case-insensitive` was meant).
//!
//! Example: `paths strict servlet`.
//!
//! Fix: keep one of `strict` and `servlet`, each word once;
//! `case-insensitive` combines with either (`paths servlet case-insensitive`).

use gov_lang::ast::ServiceStmt;
use gov_proto::path::{CASE_INSENSITIVE, Dialect};
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`paths {first} {again}`: {why}")]
#[diagnostic(code("gov::conflicting-paths"))]
pub struct ConflictingPaths {
    pub first: String,
    pub again: String,
    pub why: &'static str,
    #[source_code]
    pub src: Src,
    #[label("first here")]
    pub first_span: SourceSpan,
    #[label(primary, "conflicts with it")]
    pub again_span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<ConflictingPaths>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for stmt in &svc.ast.body {
            let ServiceStmt::Paths(p) = stmt else {
                continue;
            };
            for (i, again) in p.words.iter().enumerate() {
                let dialect = Dialect::from_word(&again.node);
                let earlier = p.words[..i].iter().find(|w| {
                    w.node == again.node
                        || (dialect.is_some() && Dialect::from_word(&w.node).is_some())
                });
                let Some(first) = earlier else {
                    continue;
                };
                let (why, help) = if first.node == again.node {
                    ("a word said twice", format!("say `{}` once", again.node))
                } else {
                    (
                        "two ways of reading `;` parameters",
                        format!(
                            "keep one of `{}` and `{}`; `{CASE_INSENSITIVE}` combines with either",
                            first.node, again.node
                        ),
                    )
                };
                out.push(
                    ConflictingPaths {
                        first: first.node.clone(),
                        again: again.node.clone(),
                        why,
                        src: cx.src(svc.file),
                        first_span: first.span.into(),
                        again_span: again.span.into(),
                        help,
                    }
                    .into(),
                );
            }
        }
    }
}
