//! `gov::conflicting-rules`: two rules of one kind on the same calls that
//! contradict each other.
//!
//! "The same calls" means the two `on` expressions are equal once match
//! references are expanded (so `on slow` and `on path prefix "/slow"` are
//! the same when `match slow = path prefix "/slow"`). Contradicting means:
//!
//! - two bulkheads with the same keying (`per`): two caps on the same
//!   calls, of which only the smaller takes effect and whose waits and
//!   rejection statuses disagree;
//! - two limits with the same `per` key and the same scope (local or
//!   cluster) that count the same unit over the same window
//!   (`calls 100 per 1s` and `calls 200 per 1s`), or that act differently
//!   (`reject` and `shape`). Limits over different windows (a burst and a
//!   sustained limit) or different keys stack and are fine;
//! - two fuses whose recovery or rejection status differ: one would
//!   release the calls while the other keeps them out.
//! - two retry rules whose `attempts` or `budget` differ: one retry rule
//!   applies to a call, so the other's would never be used.
//!
//! Why: other systems evaluate such rules one by one and let the strictest
//! win by accident; nobody checks rules against each other.
//!
//! Example: `bulkhead a on slow { max_concurrent 10 }` and
//! `bulkhead b on slow { max_concurrent 20 }`.
//!
//! Each rule is reported once, against the first earlier rule it conflicts
//! with: thirty limits that all conflict give twenty-nine diagnostics, each
//! naming the first limit, not 435 pairs.
//!
//! Fix: merge the two rules into one, or make them select different calls.

use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{kind} rules `{first}` and `{second}` conflict on the same calls: {detail}")]
#[diagnostic(code("gov::conflicting-rules"))]
pub struct ConflictingRules {
    pub kind: String,
    pub first: String,
    pub second: String,
    pub detail: String,
    #[source_code]
    pub src: Src,
    #[label("first {kind} here")]
    pub first_span: SourceSpan,
    #[label(primary, "conflicts with this one")]
    pub second_span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<ConflictingRules>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let norms = &svc.norms;
        // Rules that already conflict with an earlier one: each rule is
        // reported once, against the first rule it conflicts with, so n
        // conflicting rules give n - 1 diagnostics, not n(n-1)/2.
        let mut reported = vec![false; svc.rules.len()];
        for (j, b) in svc.rules.iter().enumerate() {
            for (i, a) in svc.rules[..j].iter().enumerate() {
                // A rule reported against an earlier one is not the first
                // of anything: comparing with it again says nothing new.
                if reported[i] {
                    continue;
                }
                if a.kind() != b.kind() || norms[i] != norms[j] || !norms[i].is_valid() {
                    continue;
                }
                // Same name: reported as a duplicate rule instead.
                if a.name().node == b.name().node {
                    continue;
                }
                let text = |span| cx.text(svc.file, span).to_string();
                let Some((detail, help)) = a.imp.conflict(a.def, b.def, &text) else {
                    continue;
                };
                reported[j] = true;
                out.push(
                    ConflictingRules {
                        kind: a.kind().to_string(),
                        first: a.name().node.clone(),
                        second: b.name().node.clone(),
                        detail,
                        src: cx.src(svc.file),
                        first_span: a.name().span.into(),
                        second_span: b.name().span.into(),
                        help: help.to_string(),
                    }
                    .into(),
                );
                break;
            }
        }
    }
}
