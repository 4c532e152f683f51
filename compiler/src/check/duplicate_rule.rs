//! `gov::duplicate-rule`: two rules (bulkhead, limit or fuse) with the same
//! name in one service.
//!
//! Why: a rule's name `service/rule` identifies it everywhere: in rejection
//! headers, metrics, the TUI, `govc release` and `govc plan`. Two rules with
//! one name cannot be told apart.
//!
//! Example: `bulkhead slow { ... }` and `limit slow { ... }` in one service.
//!
//! Fix: give each rule its own name.

use std::collections::BTreeMap;

use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("rule `{name}` is defined twice in service `{service}`")]
#[diagnostic(
    code("gov::duplicate-rule"),
    help("rule names identify rules in metrics, plans and releases; give each rule its own name")
)]
pub struct DuplicateRule {
    pub name: String,
    pub service: String,
    #[source_code]
    pub src: Src,
    #[label("first defined here")]
    pub first: SourceSpan,
    #[label(primary, "defined again here")]
    pub again: SourceSpan,
}

pub(crate) fn check<D: From<DuplicateRule>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut seen = BTreeMap::new();
        for rule in &svc.rules {
            let name = rule.name();
            match seen.get(name.node.as_str()) {
                None => {
                    seen.insert(name.node.as_str(), name.span);
                }
                Some(first) => out.push(
                    DuplicateRule {
                        name: name.node.clone(),
                        service: svc.name().to_string(),
                        src: cx.src(svc.file),
                        first: (*first).into(),
                        again: name.span.into(),
                    }
                    .into(),
                ),
            }
        }
    }
}
