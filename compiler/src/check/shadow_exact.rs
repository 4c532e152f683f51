//! `gov::shadow-exact-limit`: a limit in `mode shadow` that counts in the
//! cluster store with `sync exact`.
//!
//! Why: with `sync exact` every call waits for the store's answer before it
//! is admitted, and a rule in shadow must never delay a call. Agents refuse
//! such a config (NACK), so the policy would not take effect.
//!
//! Example: `limit l on api { calls 100 per 1s  scope cluster sync exact  mode shadow }`.
//!
//! Fix: count with `sync batch 100ms` while the limit is in shadow, and
//! switch to `sync exact` when it is enforced. (`govc apply --shadow` refuses
//! a policy with such a limit for the same reason.)

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::RuleMode;
use crate::kind::limit::{Limit, LimitEff, LimitSetting, Scope};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("limit `{name}` is in mode shadow but counts with `sync exact`")]
#[diagnostic(
    code("gov::shadow-exact-limit"),
    help(
        "count with `sync batch 100ms` while the limit is in shadow (`sync exact` makes every call wait for the store, and a shadow rule never delays a call)"
    )
)]
pub struct ShadowExactLimit {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "in shadow")]
    pub mode: SourceSpan,
    #[label("every call would wait for the cluster store")]
    pub scope: SourceSpan,
}

pub(crate) fn check<D: From<ShadowExactLimit>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for (rule, _) in svc.rules_with_norms() {
            let Some(l) = Limit::of(rule) else { continue };
            let Some((mode, mode_span)) = RuleMode::written(rule.def) else {
                continue;
            };
            let scope = l.settings.iter().find_map(|s| match s {
                LimitSetting::Scope { span, .. } => Some(*span),
                _ => None,
            });
            let Some(scope) = scope else { continue };
            if mode.shadow && matches!(LimitEff::of(&l).scope, Scope::ClusterExact { .. }) {
                out.push(
                    ShadowExactLimit {
                        name: l.name.node.clone(),
                        src: cx.src(svc.file),
                        mode: mode_span.into(),
                        scope: scope.into(),
                    }
                    .into(),
                );
            }
        }
    }
}
