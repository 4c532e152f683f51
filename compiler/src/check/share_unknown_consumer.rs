//! `gov::lint::share-unknown-consumer` (warning): a `share by consumer`
//! names a consumer that the policy never names elsewhere: in no match
//! (`consumer "crm"`, in any service) and as no service (the consumer of a
//! call between agents, `consumer from peer`).
//!
//! Why: a consumer the share names but no caller is known as is most often
//! a typo (`crn 3`): the calls of the consumer meant fall in `default`, and
//! the weight written for them protects nobody.
//!
//! Example: `share by consumer { crn 3  web 1 }` in a policy whose matches
//! name `consumer "crm"` and `consumer "web"`.
//!
//! Fix: spell the consumer as the matches do, or name it in a match where
//! it is used (`match crm = consumer "crm"`).

use std::collections::BTreeSet;

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::shares;
use crate::resolve::{Ctx, Norm, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{kind} `{name}` shares with consumer `{consumer}`, which the policy names nowhere else")]
#[diagnostic(
    code("gov::lint::share-unknown-consumer"),
    severity(Warning),
    help(
        "its calls would count as `default`: spell it as a match does (`consumer \"NAME\"`), or name it in a match"
    )
)]
pub struct ShareUnknownConsumer {
    pub kind: &'static str,
    pub name: String,
    pub consumer: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "not named by any match or service")]
    pub span: SourceSpan,
}

fn consumers<'a>(norm: &Norm<'a>, out: &mut BTreeSet<&'a str>) {
    match norm {
        Norm::Consumer(c) => {
            out.insert(c);
        }
        Norm::And(parts) | Norm::Or(parts) => parts.iter().for_each(|p| consumers(p, out)),
        _ => {}
    }
}

/// Every consumer a match of the policy names, and every service's name.
fn known<'a>(cx: &Ctx<'a>) -> BTreeSet<&'a str> {
    let mut out = BTreeSet::new();
    for svc in &cx.services {
        out.insert(svc.name());
        for norm in &svc.norms {
            consumers(norm, &mut out);
        }
        for def in svc.matches.values() {
            consumers(&svc.normalize(&def.expr), &mut out);
        }
    }
    out
}

pub(crate) fn check<D: From<ShareUnknownConsumer>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    let mut names = None;
    for svc in &cx.services {
        for rule in &svc.rules {
            for s in shares::of(rule) {
                let names = names.get_or_insert_with(|| known(cx));
                for c in s.share.consumers() {
                    if names.contains(c.node.as_str()) {
                        continue;
                    }
                    out.push(
                        ShareUnknownConsumer {
                            kind: s.kind,
                            name: s.name.node.clone(),
                            consumer: c.node.clone(),
                            src: cx.src(svc.file),
                            span: c.span.into(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
