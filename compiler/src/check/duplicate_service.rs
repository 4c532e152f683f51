//! `gov::duplicate-service`: two `service NAME` blocks with the same name,
//! in one file or across the checked files.
//!
//! Why: each service gets exactly one compiled config. Merging two blocks
//! silently, or letting the last one win, would drop rules someone wrote.
//!
//! Example: `service order { ... }` in `shop.gov` and again in `order.gov`.
//!
//! Fix: merge the two blocks into one, or rename one of them.

use miette::SourceSpan;
use thiserror::Error;

use crate::first_defined::{FirstDefinedHere, first_defined};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("service `{name}` is defined twice")]
#[diagnostic(
    code("gov::duplicate-service"),
    help("merge the two blocks into one `service {name} {{ ... }}`, or rename one")
)]
pub struct DuplicateService {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label("first defined here")]
    pub first: Option<SourceSpan>,
    #[label(primary, "defined again here")]
    pub again: SourceSpan,
    #[related]
    pub elsewhere: Vec<FirstDefinedHere>,
}

pub(crate) fn check<D: From<DuplicateService>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for (i, svc) in cx.services.iter().enumerate() {
        let first = cx.service_index[svc.name()];
        if first == i {
            continue;
        }
        let f = &cx.services[first];
        let (first_span, elsewhere) =
            first_defined(cx, svc.name(), (f.file, f.ast.name.span), svc.file);
        out.push(
            DuplicateService {
                name: svc.name().to_string(),
                src: cx.src(svc.file),
                first: first_span,
                again: svc.ast.name.span.into(),
                elsewhere,
            }
            .into(),
        );
    }
}
