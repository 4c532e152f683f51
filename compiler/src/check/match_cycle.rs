//! `gov::match-cycle`: a match that refers to itself, directly
//! (`match a = a or path prefix "/x"`) or through others
//! (`match a = b`, `match b = a`).
//!
//! Why: the expression would be infinite; no call could be decided.
//!
//! Example: `match a = b and method GET` with `match b = a or method POST`.
//!
//! Fix: write the shared part once in a match of its own that refers to
//! neither.

use gov_lang::ast::{Ident, MatchDef, ServiceStmt};
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src, Svc, refs};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("match `{name}` refers to itself: {path}")]
#[diagnostic(
    code("gov::match-cycle"),
    help("write the shared part once in a match that refers to neither")
)]
pub struct MatchCycle {
    pub name: String,
    pub path: String,
    #[source_code]
    pub src: Src,
    #[label("defined here")]
    pub def: SourceSpan,
    #[label(primary, "the cycle closes here")]
    pub closing: SourceSpan,
}

/// A path of references from `def` back to `target`, if there is one.
fn find<'a>(
    svc: &Svc<'a>,
    def: &'a MatchDef,
    target: &str,
    path: &mut Vec<&'a Ident>,
    seen: &mut Vec<&'a str>,
) -> bool {
    let mut names = Vec::new();
    refs(&def.expr, &mut names);
    for name in names {
        path.push(name);
        if name.node == target {
            return true;
        }
        if let Some(next) = svc.matches.get(name.node.as_str())
            && !seen.contains(&name.node.as_str())
        {
            seen.push(&next.name.node);
            if find(svc, next, target, path, seen) {
                return true;
            }
        }
        path.pop();
    }
    false
}

pub(crate) fn check<D: From<MatchCycle>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let defs: Vec<&MatchDef> = svc
            .ast
            .body
            .iter()
            .filter_map(|s| match s {
                ServiceStmt::Match(m) if std::ptr::eq(svc.matches[m.name.node.as_str()], m) => {
                    Some(m)
                }
                _ => None,
            })
            .collect();
        for (i, def) in defs.iter().enumerate() {
            let mut path = Vec::new();
            let mut seen = Vec::new();
            if !find(svc, def, &def.name.node, &mut path, &mut seen) {
                continue;
            }
            // Report each cycle once, at its first member in source order.
            let first_member = path
                .iter()
                .all(|n| defs[..i].iter().all(|d| d.name.node != n.node));
            if !first_member {
                continue;
            }
            let mut names = vec![def.name.node.clone()];
            names.extend(path.iter().map(|n| n.node.clone()));
            let closing = path.last().map_or(def.name.span, |n| n.span);
            out.push(
                MatchCycle {
                    name: def.name.node.clone(),
                    path: names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(" -> "),
                    src: cx.src(svc.file),
                    def: def.name.span.into(),
                    closing: closing.into(),
                }
                .into(),
            );
        }
    }
}
