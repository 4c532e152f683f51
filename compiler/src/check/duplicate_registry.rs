//! `gov::duplicate-registry`: two `registry NAME` blocks with the same name.
//!
//! Why: `wait for NAME` computes the shutdown wait from the registry's cache
//! timings; with two definitions it is unclear which timings apply.
//!
//! Example: `registry eureka { server_cache 30s }` twice.
//!
//! Fix: keep one definition with every setting in it.

use miette::SourceSpan;
use thiserror::Error;

use crate::first_defined::{FirstDefinedHere, first_defined};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("registry `{name}` is defined twice")]
#[diagnostic(
    code("gov::duplicate-registry"),
    help("keep one `registry {name}` block")
)]
pub struct DuplicateRegistry {
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

pub(crate) fn check<D: From<DuplicateRegistry>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for (i, (file, reg)) in cx.registries.iter().enumerate() {
        let name = reg.name.node.as_str();
        let first = cx.registry_index[name];
        if first == i {
            continue;
        }
        let (ffile, freg) = cx.registries[first];
        let (first_span, elsewhere) = first_defined(cx, name, (ffile, freg.name.span), *file);
        out.push(
            DuplicateRegistry {
                name: name.to_string(),
                src: cx.src(*file),
                first: first_span,
                again: reg.name.span.into(),
                elsewhere,
            }
            .into(),
        );
    }
}
