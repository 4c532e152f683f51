//! `gov::lint::drain-after-stop` (warning): the shutdown stops something
//! that requests or consumers still need before they are done with it:
//!
//! - a `drain` after a `stop NAME` where `NAME` is not `consumers`: the
//!   drained in-flight requests may need that resource (a database, an MQ
//!   client, a cache);
//! - `stop consumers` after `stop NAME`: the MQ consumers stopped after the
//!   middleware they use (apache/rocketmq#2085: the datasource closes
//!   before consumer tasks finish, giving errors and duplicate messages).
//!
//! Why: requests in flight or queued, and messages being processed, must
//! never be dropped on scale-in.
//!
//! Example: `shutdown { deregister  stop kafka via signal SIGTERM  drain 30s }`.
//!
//! Fix: stop MQ consumers first, then drain, then stop the middleware:
//! `stop consumers ...`, `drain 30s`, `stop kafka ...`.

use gov_lang::ast::ShutdownStep;
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{message}")]
#[diagnostic(code("gov::lint::drain-after-stop"), severity(Warning))]
pub struct DrainAfterStop {
    pub message: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "`{stopped}` stopped here")]
    pub stop: SourceSpan,
    pub stopped: String,
    #[label("{later_label}")]
    pub later: SourceSpan,
    pub later_label: String,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<DrainAfterStop>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let Some(shutdown) = svc.shutdown else {
            continue;
        };
        for (i, step) in shutdown.steps.iter().enumerate() {
            let ShutdownStep::Stop { what, span, .. } = step else {
                continue;
            };
            if what.node == "consumers" {
                continue;
            }
            for later in &shutdown.steps[i + 1..] {
                let (message, label, help) = match later {
                    ShutdownStep::Drain { span, .. } => (
                        format!("shutdown drains requests after stopping `{}`", what.node),
                        ("requests still in flight here may need it", *span),
                        format!("move `stop {}` after `drain`", what.node),
                    ),
                    ShutdownStep::Stop { what: w, span, .. } if w.node == "consumers" => (
                        format!("shutdown stops consumers after stopping `{}`", what.node),
                        ("consumers still running here may use it", *span),
                        format!("stop consumers before `stop {}`", what.node),
                    ),
                    _ => continue,
                };
                out.push(
                    DrainAfterStop {
                        message,
                        src: cx.src(svc.file),
                        stop: (*span).into(),
                        stopped: what.node.clone(),
                        later: label.1.into(),
                        later_label: label.0.to_string(),
                        help,
                    }
                    .into(),
                );
            }
        }
    }
}
