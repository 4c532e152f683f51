//! `gov::lint::criticality-unused` (warning): a match declares a
//! criticality (`critical`, `sheddable`, or an explicit `default`), but no
//! rule of its service uses classes: the service has no bulkhead and no
//! local limit of calls without a key.
//!
//! A call's class is that of the most critical match it meets in its
//! service, and only bulkheads (a sheddable call fails fast, a critical one
//! is served first) and local limits of calls without a key (a sheddable
//! call leaves the last tenth of a window to the others) act on it.
//!
//! Why: the declaration reads as protection the service does not have:
//! under overload every call is treated alike.
//!
//! Example: `match crm = consumer "crm" critical` in a service with a
//! `per service` limit and fuses but no bulkhead.
//!
//! Fix: add the bulkhead or limit the class is meant for (`bulkhead b on
//! slow { max_concurrent 10  max_wait 50ms }`), or drop the class.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::Bulkhead;
use crate::kind::limit::{Limit, LimitEff, LimitKey};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "match `{name}` is declared `{class}`, but no rule of service `{service}` uses classes (it has no bulkhead and no limit of calls without a key)"
)]
#[diagnostic(
    code("gov::lint::criticality-unused"),
    severity(Warning),
    help(
        "only bulkheads and local limits of calls without a key shed by class: add the rule the class is meant for, or drop `{class}`"
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

pub(crate) fn check<D: From<CriticalityUnused>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        if svc
            .rules
            .iter()
            .any(|r| Bulkhead::of(r).is_some() || sheds(r))
        {
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

/// Whether `rule` is a limit that sheds by class: local, of calls, without
/// a key (as the agent reads it).
fn sheds(rule: &crate::kind::Rule<'_>) -> bool {
    Limit::of(rule).is_some_and(|l| {
        let e = LimitEff::of(&l);
        e.calls.is_some()
            && !e.scope.is_cluster()
            && matches!(e.per, LimitKey::All | LimitKey::Domain)
    })
}
