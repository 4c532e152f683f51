//! `gov::lint::shutdown-wait` (warning): after `deregister`, the shutdown
//! does not wait until every consumer has forgotten the instance.
//!
//! A consumer may keep calling a deregistered instance until the registry's
//! server cache, the client's refresh and the load balancer's refresh have
//! all expired: the registry's expiry is `server_cache + client_refresh +
//! balancer_refresh` (30s + 30s + 30s with Eureka and Ribbon defaults,
//! hence the classic 95s). The lint fires when
//!
//! - a `wait D` after `deregister` is shorter than the expiry of the
//!   service's registry, or
//! - the service declares a registry and the shutdown deregisters without
//!   any `wait` or `wait for` after it.
//!
//! Why: requests that arrive after the instance stopped fail; ServiceComb's
//! `turnDown.waitInSeconds` defaults to 0.
//!
//! Example: `registry eureka` (90s) and `shutdown { deregister  wait 30s  drain 10s }`.
//!
//! Fix: `wait for eureka` (computed from the registry), or a `wait` at least
//! as long as the expiry.

use gov_lang::ast::ShutdownStep;
use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src, registry_expiry_ms};
use crate::units::{fmt_millis, millis};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{message}")]
#[diagnostic(code("gov::lint::shutdown-wait"), severity(Warning))]
pub struct ShutdownWait {
    pub message: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{label}")]
    pub span: SourceSpan,
    pub label: String,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<ShutdownWait>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let (Some(uses), Some(shutdown)) = (svc.registry, svc.shutdown) else {
            continue;
        };
        let Some(reg) = cx.registry(&uses.name.node) else {
            continue;
        };
        let expiry = registry_expiry_ms(reg);
        let reg_name = &reg.name.node;
        let Some((dereg, dereg_span)) =
            shutdown
                .steps
                .iter()
                .enumerate()
                .find_map(|(i, s)| match s {
                    ShutdownStep::Deregister { span } => Some((i, *span)),
                    _ => None,
                })
        else {
            continue;
        };
        let mut waited = false;
        for step in &shutdown.steps[dereg..] {
            match step {
                ShutdownStep::WaitFor { .. } => waited = true,
                ShutdownStep::Wait { duration, .. } => {
                    waited = true;
                    let d = millis(&duration.node);
                    if d < expiry {
                        out.push(
                            ShutdownWait {
                                message: format!(
                                    "shutdown waits {} but consumers of `{reg_name}` may call this instance for {}",
                                    cx.text(svc.file, duration.span),
                                    fmt_millis(expiry)
                                ),
                                src: cx.src(svc.file),
                                span: duration.span.into(),
                                label: format!("shorter than the {} cache expiry", fmt_millis(expiry)),
                                help: format!(
                                    "write `wait for {reg_name}` or `wait {}` (server_cache + client_refresh + balancer_refresh)",
                                    fmt_millis(expiry)
                                ),
                            }
                            .into(),
                        );
                    }
                }
                _ => {}
            }
        }
        if !waited {
            out.push(
                ShutdownWait {
                    message: format!(
                        "shutdown deregisters from `{reg_name}` without waiting for its consumers' caches ({})",
                        fmt_millis(expiry)
                    ),
                    src: cx.src(svc.file),
                    span: dereg_span.into(),
                    label: "no wait follows".to_string(),
                    help: format!("add `wait for {reg_name}` right after `deregister`"),
                }
                .into(),
            );
        }
    }
}
