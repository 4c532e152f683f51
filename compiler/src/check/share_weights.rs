//! `gov::share-weights`: a bulkhead's or a limit's `share by consumer { ... }` that names
//! a consumer (or `default`) twice, names an empty consumer (`""`), names
//! more than 64 consumers, or names none besides `default`.
//!
//! Why: a consumer has one weight; the agent refuses a share that gives it
//! two, or that names more consumers than its table holds. A share with
//! only `default` puts every call in one class: it shares nothing.
//!
//! Example: `share by consumer { crm 3  web 1  crm 2 }`.
//!
//! Fix: give each consumer one weight, name the consumers whose calls must
//! keep their share (the others share `default`'s), or drop the `share`.
//! A weight of 0 or less is `gov::non-positive`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::share::{MAX_CONSUMERS, Share};
use crate::kind::shares;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{kind} `{name}`: {problem}")]
#[diagnostic(
    code("gov::share-weights"),
    help(
        "give each consumer one weight (`share by consumer {{ crm 3  web 1  default 1 }}`), at most 64 consumers besides `default`, which weighs every other one"
    )
)]
pub struct ShareWeights {
    pub kind: &'static str,
    pub name: String,
    pub problem: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{label}")]
    pub span: SourceSpan,
    pub label: String,
}

/// What is wrong with `share`: the problem, where, and the label.
fn problem(share: &Share) -> Option<(String, gov_lang::ast::Span, String)> {
    for (i, (name, _)) in share.weights.iter().enumerate() {
        if name.node.is_empty() {
            return Some((
                "the share names an empty consumer".to_string(),
                name.span,
                "calls without a consumer are `default`'s".to_string(),
            ));
        }
        if share.weights[..i].iter().any(|(n, _)| n.node == name.node) {
            return Some((
                format!("the share names `{}` twice", name.node),
                name.span,
                "named again here".to_string(),
            ));
        }
    }
    let named = share.consumers().count();
    if named == 0 {
        return Some((
            "the share names no consumer besides `default`".to_string(),
            share.span,
            "every call is in one class".to_string(),
        ));
    }
    (named > MAX_CONSUMERS).then(|| {
        (
            format!("the share names {named} consumers, at most {MAX_CONSUMERS}"),
            share.span,
            "too many consumers".to_string(),
        )
    })
}

pub(crate) fn check<D: From<ShareWeights>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            for s in shares::of(rule) {
                if let Some((problem, span, label)) = problem(&s.share) {
                    out.push(
                        ShareWeights {
                            kind: s.kind,
                            name: s.name.node.clone(),
                            problem,
                            src: cx.src(svc.file),
                            span: span.into(),
                            label,
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
