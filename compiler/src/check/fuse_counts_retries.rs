//! `gov::lint::fuse-counts-retries` (warning): a service's fuse counts each
//! attempt of a caller's retries as a call of its own.
//!
//! A retried call is one call to the rules of the service that retries
//! (its fuse on those calls sees the call's final outcome), but every
//! attempt reaches the called service as a new call. A fuse there counts a
//! call that failed three times as three errors: an error count trips at a
//! third of the failing calls it names, and an error ratio rises when some
//! calls always fail (10% of calls failing every attempt of 3 count as 25%
//! of the attempts). The lint fires on a fuse on the inbound calls of a
//! service that a caller retries on outcomes that reach it (anything but
//! `connect_failure`, which never reached its agent).
//!
//! Example: `service pay { fuse f on any { trip when errors >= 50 over 1m } }`
//! and, in `web`, `retry r on calls to pay { attempts 3  on status 503
//! budget 10% min 5 per 1s }`.
//!
//! Fix: put the fuse where the calls are made, on the caller's calls to the
//! service (it counts each call once, after its retries); or set its
//! threshold knowing each failing call counts up to `attempts` times.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::fuse::Fuse;
use crate::paths;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "fuse `{name}` counts each attempt of {callers}: a call that fails every attempt counts up to {attempts} times"
)]
#[diagnostic(
    code("gov::lint::fuse-counts-retries"),
    severity(Warning),
    help(
        "put the fuse on the callers' calls to `{service}` (there it sees each call once, after its retries), or set its thresholds knowing a failing call counts up to {attempts} times"
    )
)]
pub struct FuseCountsRetries {
    pub name: String,
    pub service: String,
    pub callers: String,
    pub attempts: u32,
    #[source_code]
    pub src: Src,
    #[label(primary, "counts retried attempts as calls")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<FuseCountsRetries>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    let retries = paths::retries(cx);
    for svc in cx.unique_services() {
        let me = svc.name();
        let retrying: Vec<_> = retries
            .iter()
            .filter(|r| r.to.contains(&me) && r.spec.attempts > 1)
            .filter(|r| {
                r.spec.on.as_ref().is_some_and(|on| {
                    !on.status.is_empty() || on.timeout || on.reset || !on.grpc_status.is_empty()
                })
            })
            .collect();
        let Some(attempts) = retrying.iter().map(|r| r.spec.attempts).max() else {
            continue;
        };
        let mut callers: Vec<String> = retrying
            .iter()
            .map(|r| format!("`{}`'s retry `{}`", r.svc.name(), r.rule.def.name.node))
            .collect();
        callers.dedup();
        for (rule, norm) in svc.rules_with_norms() {
            if norm.is_outbound() || Fuse::of(rule).is_none() {
                continue;
            }
            out.push(
                FuseCountsRetries {
                    name: rule.def.name.node.clone(),
                    service: me.to_string(),
                    callers: callers.join(", "),
                    attempts,
                    src: cx.src(svc.file),
                    span: rule.def.name.span.into(),
                }
                .into(),
            );
        }
    }
}
