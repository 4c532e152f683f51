//! `gov::lint::consumers-before-ready` (warning): the warmup starts MQ
//! consumers before the instance is ready (`ready when`) or registered
//! (`register`).
//!
//! Why: consumers take work from the queue at once; an instance whose
//! caches, pools and dependencies are not ready yet fails or slows that
//! work. Lossless scale-out starts consumers last.
//!
//! Example: `warmup { start consumers via http POST "/start"  ready when ... }`.
//!
//! Fix: move `start consumers` after `ready when` and `register`.

use gov_lang::ast::WarmupStep;
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("warmup starts consumers before the instance is {what}")]
#[diagnostic(
    code("gov::lint::consumers-before-ready"),
    severity(Warning),
    help("move `start consumers` after `ready when` and `register`")
)]
pub struct ConsumersBeforeReady {
    pub what: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "consumers start here")]
    pub start: SourceSpan,
    #[label("the instance is {what} only here")]
    pub later: SourceSpan,
}

pub(crate) fn check<D: From<ConsumersBeforeReady>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let Some(warmup) = svc.warmup else { continue };
        for (i, step) in warmup.steps.iter().enumerate() {
            let WarmupStep::Start { what, span, .. } = step else {
                continue;
            };
            if what.node != "consumers" {
                continue;
            }
            // Report the first gate that comes too late.
            let later = warmup.steps[i + 1..].iter().find_map(|s| match s {
                WarmupStep::Ready { span, .. } => Some(("ready", *span)),
                WarmupStep::Register { span } => Some(("registered", *span)),
                _ => None,
            });
            if let Some((what, later)) = later {
                out.push(
                    ConsumersBeforeReady {
                        what: what.to_string(),
                        src: cx.src(svc.file),
                        start: (*span).into(),
                        later: later.into(),
                    }
                    .into(),
                );
            }
        }
    }
}
