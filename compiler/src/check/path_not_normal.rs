//! `gov::path-not-normal`: a path in a match that is not in normal form, so no
//! request can ever match it.
//!
//! Why: the agent normalizes every request path before matching (RFC 3986
//! section 6: `//` merged, `.` and `..` removed, escapes of letters and digits
//! decoded; see `docs/operations.md`, "Request handling"), so `path prefix
//! "/api//v1"` or `path exact "/a/./b"` never matches, and a path with a `?`
//! never matches because the query is not part of the path. A rule that never
//! matches protects nothing, silently.
//!
//! Example: `match old = path prefix "/api//v1"`.
//!
//! Fix: write the normal form the help shows (`/api/v1`); match on the path
//! only, without a query. In a service that says `paths servlet` the normal
//! form has no `;` parameters (`/a;v=1` is `/a`).

use gov_lang::ast::{self, MatchExpr, ServiceStmt};
use gov_proto::path::{Reading, normalize};
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("path `{path}` can never match: requests are matched on their normalized path")]
#[diagnostic(code("gov::path-not-normal"))]
pub struct PathNotNormal {
    pub path: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "not in normal form")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

fn paths<'a>(expr: &'a MatchExpr, out: &mut Vec<&'a ast::Str>) {
    match expr {
        MatchExpr::Path { value, .. } => out.push(value),
        MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
            paths(lhs, out);
            paths(rhs, out);
        }
        MatchExpr::Group { inner, .. } => paths(inner, out),
        _ => {}
    }
}

/// What to tell the author of `path`, or `None` when it is normal for a service
/// that reads paths as `reading` says.
fn help(path: &str, reading: impl Into<Reading>) -> Option<String> {
    if path.contains('?') || path.contains('#') {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        return Some(format!(
            "a path match sees the path without its query; write `{bare}`"
        ));
    }
    match normalize(path, reading) {
        Ok(normal) if normal == path => None,
        Ok(normal) => Some(format!("write `{normal}`, the path requests arrive with")),
        Err(gov_proto::path::PathError::NotAbsolute) => {
            Some(format!("request paths start with `/`; write `/{path}`"))
        }
        Err(error) => Some(format!(
            "{error}: the agent refuses such requests with 400, so write the path without it"
        )),
    }
}

pub(crate) fn check<D: From<PathNotNormal>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut found = Vec::new();
        for stmt in &svc.ast.body {
            if let ServiceStmt::Match(m) = stmt {
                paths(&m.expr, &mut found);
            }
        }
        for rule in &svc.rules {
            paths(rule.on(), &mut found);
        }
        for path in found {
            // An empty prefix matches every path: normal by definition.
            if path.node.is_empty() {
                continue;
            }
            if let Some(help) = help(&path.node, svc.reading()) {
                out.push(
                    PathNotNormal {
                        path: path.node.clone(),
                        src: cx.src(svc.file),
                        span: path.span.into(),
                        help,
                    }
                    .into(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::help;
    use gov_proto::path::Dialect;

    #[test]
    fn normal_paths_pass_and_others_get_their_normal_form() {
        for ok in ["/", "/api", "/api/v1/", "/a.b", "/~me"] {
            assert_eq!(help(ok, Dialect::Strict), None, "{ok}");
        }
        assert_eq!(
            help("/api//v1", Dialect::Strict).as_deref(),
            Some("write `/api/v1`, the path requests arrive with")
        );
        assert!(help("/a/./b", Dialect::Strict).is_some_and(|h| h.contains("`/a/b`")));
        assert!(help("/%61pi", Dialect::Strict).is_some_and(|h| h.contains("`/api`")));
        assert!(help("/a?x=1", Dialect::Strict).is_some_and(|h| h.contains("`/a`")));
        assert!(help("/../a", Dialect::Strict).is_some_and(|h| h.contains("400")));
        assert_eq!(
            help("api", Dialect::Strict).as_deref(),
            Some("request paths start with `/`; write `/api`")
        );
        // A servlet service never sees a path parameter: it can never match.
        assert!(help("/a;v=1", Dialect::Servlet).is_some_and(|h| h.contains("`/a`")));
        assert_eq!(help("/a;v=1", Dialect::Strict), None);
    }
}
