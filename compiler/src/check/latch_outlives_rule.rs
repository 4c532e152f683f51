//! `gov::lint::latch-outlives-rule` (warning): a limit that expires (`for
//! D`) latches for at least as long as it lives (`release after R` with R
//! >= D, or `release manual`).
//!
//! Why: a latch never outlives its rule. When a rule expires, every agent
//! stops enforcing it and govd ends its latches (audited as `expire`, one
//! record per latch, so none is lost unseen). A latch release shorter than
//! the rule's life only cuts short the latches engaged in its last R; one
//! as long as the life or longer (or a manual one) never takes effect as
//! written: every latch the rule engages is ended by the expiry instead,
//! and an operator waiting to release a manual latch finds it gone.
//!
//! Example: `limit l on any { calls 10 per 1s  release after 2h  for 1h }`.
//!
//! Fix: a release shorter than the rule's life (`release after 10m`), or a
//! longer life. An `expires T` is not checked: its life depends on when
//! the policy is applied.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::RuleExpiry;
use crate::kind::limit::{Limit, LimitEff, ReleaseEff};
use crate::resolve::{Ctx, Src};
use crate::units::{fmt_millis, millis};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}` latches {release}, but expires {life} after the apply")]
#[diagnostic(
    code("gov::lint::latch-outlives-rule"),
    severity(Warning),
    help(
        "the expiry ends every latch of the rule (audited), so this release never happens as written: release sooner than the rule expires, or give the rule a longer life"
    )
)]
pub struct LatchOutlivesRule {
    pub name: String,
    pub release: String,
    pub life: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "the rule's life")]
    pub life_span: SourceSpan,
}

pub(crate) fn check<D: From<LatchOutlivesRule>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some((RuleExpiry::For(d), span)) = RuleExpiry::of(rule.def) else {
                continue;
            };
            let Some(l) = Limit::of(rule) else { continue };
            let life = millis(&d.node);
            let release = match LimitEff::of(&l).release {
                ReleaseEff::Window => continue,
                ReleaseEff::After(r) if r < life => continue,
                ReleaseEff::After(r) => format!("for {}", fmt_millis(r)),
                ReleaseEff::Manual => "until released by hand".to_string(),
            };
            out.push(
                LatchOutlivesRule {
                    name: rule.def.name.node.clone(),
                    release,
                    life: fmt_millis(life),
                    src: cx.src(svc.file),
                    life_span: span.into(),
                }
                .into(),
            );
        }
    }
}
