//! `gov::lint::criticality-unused` (warning): a match declares a
//! criticality (`critical`, `sheddable`, or an explicit `default`), but no
//! rule of its service uses classes: the service has no bulkhead.
//!
//! A call's class is that of the most critical match it meets in its
//! service, and only bulkheads act on it (a sheddable call fails fast, a
//! critical one is served first); limits do not read it.
//!
//! Why: the declaration reads as protection the service does not have:
//! under overload every call is treated alike.
//!
//! Example: `match crm = consumer "crm" critical` in a service with limits
//! and fuses but no bulkhead.
//!
//! Fix: add the bulkhead the class is meant for (`bulkhead b on slow {
//! max_concurrent 10  max_wait 50ms }`), or drop the class.

use miette::SourceSpan;
use thiserror::Error;

use crate::diagnostic::Diagnostic;
use crate::kind::bulkhead::Bulkhead;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "match `{name}` is declared `{class}`, but no rule of service `{service}` uses classes (it has no bulkhead)"
)]
#[diagnostic(
    code("gov::lint::criticality-unused"),
    severity(Warning),
    help(
        "only bulkheads shed by class: add the bulkhead the class is meant for, or drop `{class}`"
    )
)]
pub struct CriticalityUnused {
    pub name: String,
    pub class: &'static str,
    pub service: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no rule acts on this")]
    pub span: SourceSpan,
}

pub(crate) fn check(cx: &Ctx<'_>, out: &mut Vec<Diagnostic>) {
    for svc in &cx.services {
        if svc.rules.iter().any(|r| Bulkhead::of(r).is_some()) {
            continue;
        }
        for m in svc.matches.values() {
            let Some(class) = &m.criticality else {
                continue;
            };
            out.push(
                CriticalityUnused {
                    name: m.name.node.clone(),
                    class: class.node.word(),
                    service: svc.ast.name.node.clone(),
                    src: cx.src(svc.file),
                    span: class.span.into(),
                }
                .into(),
            );
        }
    }
}
