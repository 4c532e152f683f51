//! `gov::lint::fixed-wait` (warning): after `deregister`, a service that
//! declares no registry waits a fixed time where `wait for gov` would wait
//! exactly as long as its callers need.
//!
//! Without a `registry`, govd is the service's registry: its callers find its
//! instances through their own agents, which govd tells when an instance
//! deregisters. `wait for gov` waits until every one of them has acknowledged
//! the set without this instance (usually well under a second), and at most
//! 30s. A fixed `wait D` is either longer than that, which slows every
//! scale-in and rollout for nothing, or shorter, and calls reach an instance
//! that is about to stop.
//!
//! Why: the systems people use sleep a fixed time because they cannot know
//! when the callers have heard; gov can (issue: lossless scale-in).
//!
//! Example: `shutdown { deregister  wait 30s  drain 10s }` in a service with
//! no `registry`.
//!
//! Fix: `wait for gov`. If callers outside gov find this instance through a
//! registry, declare it (`registry NAME`) and write `wait for NAME` instead.

use gov_lang::ast::ShutdownStep;
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{message}")]
#[diagnostic(code("gov::lint::fixed-wait"), severity(Warning))]
pub struct FixedWait {
    pub message: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "a fixed wait")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<FixedWait>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let (None, Some(shutdown)) = (svc.registry, svc.shutdown) else {
            continue;
        };
        let Some(dereg) = shutdown
            .steps
            .iter()
            .position(|s| matches!(s, ShutdownStep::Deregister { .. }))
        else {
            continue;
        };
        let after = &shutdown.steps[dereg..];
        if after
            .iter()
            .any(|s| matches!(s, ShutdownStep::WaitFor { .. }))
        {
            continue;
        }
        // The first fixed wait after `deregister` is the one that stands in
        // for the callers' caches; later ones wait for something else.
        let Some(duration) = after.iter().find_map(|s| match s {
            ShutdownStep::Wait { duration, .. } => Some(duration),
            _ => None,
        }) else {
            continue;
        };
        let name = &svc.ast.name.node;
        out.push(
            FixedWait {
                message: format!(
                    "`{name}` waits {} after `deregister`, but its callers learn it left from gov",
                    cx.text(svc.file, duration.span)
                ),
                src: cx.src(svc.file),
                span: duration.span.into(),
                help: "write `wait for gov`: it waits until every caller's agent has acknowledged \
                       (at most 30s); if callers outside gov use a registry, declare it and \
                       `wait for` it"
                    .to_string(),
            }
            .into(),
        );
    }
}
