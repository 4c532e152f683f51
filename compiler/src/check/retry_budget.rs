//! `gov::retry-without-budget`: a retry rule without a `budget`.
//!
//! Why: retries without a bound turn an outage into a retry storm: each
//! tier that retries 3 times multiplies the load on the failing one, and
//! three tiers turn one failing call into 27, just when the service
//! underneath can least take it. A budget (Finagle's and Linkerd's model)
//! lets retries ride out a few failures and stops them when many calls
//! fail: at most a share of the calls plus a small floor per period.
//!
//! Example: `retry r on calls to checkout { attempts 3 }`.
//!
//! Fix: add `budget 20% min 10 per 1s` (retries at most 20% of the calls,
//! plus 10 per second whatever the traffic).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::retry::Retry;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("retry `{name}` has no budget")]
#[diagnostic(
    code("gov::retry-without-budget"),
    help(
        "add `budget 20% min 10 per 1s`: retries at most 20% of the calls plus 10 per second, so that failures are not multiplied into a retry storm"
    )
)]
pub struct RetryWithoutBudget {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "unbounded retries multiply the load on a failing service")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<RetryWithoutBudget>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(r) = Retry::of(rule) else { continue };
            if r.budget().is_some() {
                continue;
            }
            out.push(
                RetryWithoutBudget {
                    name: r.name.node.clone(),
                    src: cx.src(svc.file),
                    span: r.name.span.into(),
                }
                .into(),
            );
        }
    }
}
