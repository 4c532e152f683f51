//! `gov::unknown-paths`: a word of `paths WORD...` names no way of reading
//! request paths the agent knows.
//!
//! Why: `paths` says how the service reads a path's `;` parameters and the
//! case of its letters, so that the agent matches rules on the path the
//! service will serve. An unknown word would leave the service on the
//! default, which refuses parameters the service expects, or matches `/admin`
//! case-sensitively in front of a service that serves `/ADMIN` as `/admin`.
//!
//! Example: `paths tomcat`.
//!
//! Fix: write `paths servlet` for Tomcat, Jetty, Undertow and Spring (each
//! segment's parameters removed before dot segments), `paths
//! case-insensitive` for IIS (letters compared without their case), both
//! for a Servlet container that ignores case, or `paths strict` (the default:
//! a `;` that could change what the path names is refused).

use gov_lang::ast::ServiceStmt;
use gov_proto::path::Reading;
use miette::SourceSpan;
use thiserror::Error;

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

pub(crate) fn check<D: From<UnknownPaths>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    let words = Reading::WORDS;
    for svc in &cx.services {
        for stmt in &svc.ast.body {
            let ServiceStmt::Paths(p) = stmt else {
                continue;
            };
            for word in &p.words {
                let name = &word.node;
                if words.contains(&name.as_str()) {
                    continue;
                }
                let help = match suggest::closest(name, words) {
                    Some(word) => format!("did you mean `{word}`?"),
                    None => format!(
                        "use `servlet` for Tomcat, Jetty, Undertow and Spring, `case-insensitive` for IIS, or `strict` (the default); known: {}",
                        words.join(", ")
                    ),
                };
                out.push(
                    UnknownPaths {
                        name: name.clone(),
                        src: cx.src(svc.file),
                        span: word.span.into(),
                        help,
                    }
                    .into(),
                );
            }
        }
    }
}
