//! `gov::lint::expired-rule` (warning): a rule's `expires` instant has
//! already passed.
//!
//! Why: an expired rule is compiled and shipped, but no agent enforces it:
//! it reads like a rule in force and protects nothing. Usually the date is
//! a typo (the wrong year) or the rule is left over from an event that is
//! over.
//!
//! Example: `limit promo on any { calls 100 per 1s  expires 2020-01-01T00:00Z }`.
//!
//! Fix: remove the rule, or give it an instant still to come (or a `for`
//! lifetime, which starts at the apply). The check reads the machine's
//! clock when it runs (`govc check`, and govd at each apply).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::RuleExpiry;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{kind} `{name}` expired at {at}: no agent enforces it")]
#[diagnostic(
    code("gov::lint::expired-rule"),
    severity(Warning),
    help(
        "remove the rule, or give it an instant still to come (`expires T`) or a lifetime from the apply (`for D`)"
    )
)]
pub struct ExpiredRule {
    pub kind: String,
    pub name: String,
    pub at: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "this instant has passed")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<ExpiredRule>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    let now = gov_common::instant::now_unix_ms();
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some((RuleExpiry::At(at), span)) = RuleExpiry::of(rule.def) else {
                continue;
            };
            if at.node > now {
                continue;
            }
            out.push(
                ExpiredRule {
                    kind: rule.def.kind.node.to_string(),
                    name: rule.def.name.node.clone(),
                    at: gov_common::instant::Utc(at.node).to_string(),
                    src: cx.src(svc.file),
                    span: span.into(),
                }
                .into(),
            );
        }
    }
}
