//! The other half of a duplicate: where the name was first defined.

use gov_lang::ast::Span;
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

/// The other half of a duplicate that was first defined in another file.
#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{name}` is first defined in `{file}`")]
#[diagnostic(severity(Advice))]
pub struct FirstDefinedHere {
    pub name: String,
    pub file: String,
    #[source_code]
    pub src: Src,
    #[label("first defined here")]
    pub span: SourceSpan,
}

/// The labels of a duplicate: "first defined here" in the same file, or a
/// related note pointing into the other file.
pub(crate) fn first_defined(
    cx: &Ctx<'_>,
    name: &str,
    first: (usize, Span),
    again_file: usize,
) -> (Option<SourceSpan>, Vec<FirstDefinedHere>) {
    if first.0 == again_file {
        return (Some(first.1.into()), Vec::new());
    }
    let note = FirstDefinedHere {
        name: name.to_string(),
        file: cx.files[first.0].name.to_string(),
        src: cx.src(first.0),
        span: first.1.into(),
    };
    (None, vec![note])
}
