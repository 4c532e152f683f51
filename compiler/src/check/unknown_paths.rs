//! `gov::unknown-paths`: `paths WORD` names no way of reading request paths
//! the agent knows.
//!
//! Why: `paths` says how the service reads a path's `;` parameters, so that
//! the agent matches rules on the path the service will serve. An unknown
//! word would leave the service on the default, which refuses parameters
//! the service expects (or, read as another dialect, matches paths it does
//! not serve).
//!
//! Example: `paths tomcat`.
//!
//! Fix: write `paths servlet` for Tomcat, Jetty, Undertow and Spring (each
//! segment's parameters removed before dot segments), or `paths strict` (the
//! default: a `;` that could change what the path names is refused).

use gov_lang::ast::ServiceStmt;
use gov_proto::path::Dialect;
use miette::SourceSpan;
use thiserror::Error;

use crate::diagnostic::Diagnostic;
use crate::resolve::{Ctx, Src};
use crate::suggest;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("unknown path dialect `{name}`")]
#[diagnostic(code("gov::unknown-paths"))]
pub struct UnknownPaths {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "not a way of reading paths")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check(cx: &Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let words = Dialect::WORDS.map(|(word, _)| word);
    for svc in &cx.services {
        for stmt in &svc.ast.body {
            let ServiceStmt::Paths(p) = stmt else {
                continue;
            };
            let name = &p.dialect.node;
            if Dialect::from_word(name).is_some() {
                continue;
            }
            let help = match suggest::closest(name, words) {
                Some(word) => format!("did you mean `{word}`?"),
                None => format!(
                    "use `servlet` for Tomcat, Jetty, Undertow and Spring, or `strict` (the default); known: {}",
                    words.join(", ")
                ),
            };
            out.push(
                UnknownPaths {
                    name: name.clone(),
                    src: cx.src(svc.file),
                    span: p.dialect.span.into(),
                    help,
                }
                .into(),
            );
        }
    }
}
