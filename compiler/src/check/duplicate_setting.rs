//! `gov::duplicate-setting`: one setting given twice in the same block: in a
//! rule (`max_concurrent` twice), a registry (`server_cache` twice), a
//! service (`capacity workers` or `domain` twice, two `warmup` blocks, two
//! `outlier` blocks for the same callee) or a lifecycle or outlier block
//! (`register` twice, `eject` twice).
//!
//! Why: which value wins would be an accident of the implementation. Other
//! systems keep the last value silently; a reviewer reading the first one
//! would be misled.
//!
//! Example: `bulkhead b on slow { max_concurrent 10  max_concurrent 20 }`.
//!
//! Fix: keep one of the two.

use gov_lang::ast::{Capacity, RegistryKey, ServiceStmt, ShutdownStep, Span, WarmupStep};
use miette::SourceSpan;
use thiserror::Error;

use crate::kind;
use crate::resolve::{Ctx, Src, Svc};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{setting}` is set twice in {owner}")]
#[diagnostic(
    code("gov::duplicate-setting"),
    help("keep one `{setting}`; which one wins would be an accident")
)]
pub struct DuplicateSetting {
    pub setting: String,
    pub owner: String,
    #[source_code]
    pub src: Src,
    #[label("first set here")]
    pub first: SourceSpan,
    #[label(primary, "set again here")]
    pub again: SourceSpan,
}

/// Reports every key seen twice in `items`.
fn report<K: AsRef<str>, D: From<DuplicateSetting>>(
    cx: &Ctx<'_>,
    file: usize,
    owner: impl Fn() -> String,
    items: &[(K, Span)],
    out: &mut Vec<D>,
) {
    for (i, (key, span)) in items.iter().enumerate() {
        if let Some((_, first)) = items[..i].iter().find(|(k, _)| k.as_ref() == key.as_ref()) {
            out.push(
                DuplicateSetting {
                    setting: key.as_ref().to_string(),
                    owner: owner(),
                    src: cx.src(file),
                    first: (*first).into(),
                    again: (*span).into(),
                }
                .into(),
            );
        }
    }
}

pub(crate) fn check<D: From<DuplicateSetting>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    registries(cx, out);
    for svc in &cx.services {
        service(cx, svc, out);
        rules(cx, svc, out);
    }
}

/// A registry's settings.
fn registries<D: From<DuplicateSetting>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for (file, reg) in &cx.registries {
        let items: Vec<_> = reg
            .settings
            .iter()
            .map(|s| {
                let key = match s.key.node {
                    RegistryKey::ServerCache => "server_cache",
                    RegistryKey::ClientRefresh => "client_refresh",
                    RegistryKey::BalancerRefresh => "balancer_refresh",
                };
                (key, s.span)
            })
            .collect();
        report(
            cx,
            *file,
            || format!("registry `{}`", reg.name.node),
            &items,
            out,
        );
    }
}

/// A service's statements, the steps of its warmup and shutdown, its
/// outlier blocks and their settings.
fn service<D: From<DuplicateSetting>>(cx: &Ctx<'_>, svc: &Svc<'_>, out: &mut Vec<D>) {
    let mut stmts = Vec::new();
    for stmt in &svc.ast.body {
        match stmt {
            ServiceStmt::Domain(d) => stmts.push(("domain", d.span)),
            ServiceStmt::Registry(r) => stmts.push(("registry", r.span)),
            ServiceStmt::Consumer(c) => stmts.push(("consumer from", c.span)),
            ServiceStmt::Paths(p) => stmts.push(("paths", p.span)),
            ServiceStmt::Capacity(Capacity::Workers { span, .. }) => {
                stmts.push(("capacity workers", *span));
            }
            ServiceStmt::Capacity(Capacity::Instances { span, .. }) => {
                stmts.push(("capacity instances", *span));
            }
            ServiceStmt::Capacity(Capacity::Rate { span, .. }) => {
                stmts.push(("capacity rate", *span));
            }
            ServiceStmt::Capacity(Capacity::Amplification { span, .. }) => {
                stmts.push(("capacity amplification", *span));
            }
            ServiceStmt::Warmup(w) => {
                stmts.push(("warmup", w.span));
                let steps: Vec<_> = w
                    .steps
                    .iter()
                    .filter_map(|s| match s {
                        WarmupStep::Ready { span, .. } => Some(("ready when", *span)),
                        WarmupStep::Register { span } => Some(("register", *span)),
                        WarmupStep::Ramp { span, .. } => Some(("ramp", *span)),
                        WarmupStep::Start { .. } => None,
                    })
                    .collect();
                report(
                    cx,
                    svc.file,
                    || format!("the warmup of `{}`", svc.name()),
                    &steps,
                    out,
                );
            }
            ServiceStmt::Shutdown(s) => {
                stmts.push(("shutdown", s.span));
                let steps: Vec<_> = s
                    .steps
                    .iter()
                    .filter_map(|s| match s {
                        ShutdownStep::Deregister { span } => Some(("deregister", *span)),
                        _ => None,
                    })
                    .collect();
                report(
                    cx,
                    svc.file,
                    || format!("the shutdown of `{}`", svc.name()),
                    &steps,
                    out,
                );
            }
            ServiceStmt::Outlier(o) => {
                let items: Vec<_> = o
                    .settings
                    .iter()
                    .filter_map(|s| Some((s.key()?, s.span)))
                    .collect();
                let owner = || match &o.to {
                    Some(to) => {
                        format!("the outlier policy of `{}` for `{}`", svc.name(), to.node)
                    }
                    None => format!("the outlier policy of `{}`", svc.name()),
                };
                report(cx, svc.file, owner, &items, out);
            }
            ServiceStmt::Match(_) | ServiceStmt::Rule(_) => {}
        }
    }
    report(
        cx,
        svc.file,
        || format!("service `{}`", svc.name()),
        &stmts,
        out,
    );
    let blocks: Vec<(String, Span)> = svc
        .outliers
        .iter()
        .map(|o| match &o.to {
            Some(to) => (format!("outlier to {}", to.node), o.span),
            None => ("outlier".to_string(), o.span),
        })
        .collect();
    report(
        cx,
        svc.file,
        || format!("service `{}`", svc.name()),
        &blocks,
        out,
    );
}

/// Each rule's settings, as its kind says which may appear once.
fn rules<D: From<DuplicateSetting>>(cx: &Ctx<'_>, svc: &Svc<'_>, out: &mut Vec<D>) {
    for rule in &svc.rules {
        let items: Vec<_> = rule
            .def
            .settings
            .iter()
            .filter_map(|s| {
                let key = rule.imp.setting_key(s).or_else(|| kind::header_key(s))?;
                Some((key, s.span))
            })
            .collect();
        let owner = || format!("{} `{}`", rule.kind(), rule.name().node);
        report(cx, svc.file, owner, &items, out);
    }
}
