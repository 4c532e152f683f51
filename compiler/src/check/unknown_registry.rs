//! `gov::unknown-registry`: `registry NAME` in a service, or `wait for NAME`
//! in a shutdown, names a registry that no file defines.
//!
//! Why: the shutdown wait is computed from the registry's cache timings; with
//! an unknown registry there is nothing to compute it from, and the instance
//! would be stopped while consumers still call it.
//!
//! Example: `wait for eurka` when the registry is `eureka`.
//!
//! Fix: use the name of a declared `registry NAME { ... }` or declare it.
//! Skipped when some file failed to parse.

use gov_lang::ast::{ServiceStmt, ShutdownStep};
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};
use crate::suggest;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("unknown registry `{name}`")]
#[diagnostic(code("gov::unknown-registry"))]
pub struct UnknownRegistry {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no registry of this name in the checked files")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<UnknownRegistry>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    let known: Vec<&str> = cx.registry_index.keys().copied().collect();
    for svc in &cx.services {
        let mut names = Vec::new();
        for stmt in &svc.ast.body {
            match stmt {
                ServiceStmt::Registry(r) => names.push(&r.name),
                ServiceStmt::Shutdown(s) => {
                    for step in &s.steps {
                        // `wait for gov` names govd itself, unless a registry
                        // is called `gov`.
                        if let ShutdownStep::WaitFor { registry, .. } = step
                            && !crate::lower::is_gov(cx, &registry.node)
                        {
                            names.push(registry);
                        }
                    }
                }
                _ => {}
            }
        }
        for name in names {
            if cx.registry_index.contains_key(name.node.as_str())
                || !cx.registry_surely_unknown(&name.node)
            {
                continue;
            }
            out.push(
                UnknownRegistry {
                    name: name.node.clone(),
                    src: cx.src(svc.file),
                    span: name.span.into(),
                    help: suggest::help("registry", &name.node, &known),
                }
                .into(),
            );
        }
    }
}
