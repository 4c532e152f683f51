//! `gov::lint::retry-amplification` (warning): the retries on a call path
//! can turn one call at its top into more attempts at a service than the
//! service declares it can take.
//!
//! The compiler sees every service's outbound rules, so it follows every
//! call path (`calls to` in a match or rule) and multiplies the attempts of
//! the retry rules along it: three tiers that each make 3 attempts turn one
//! call at the top into 27 at the bottom. That is the worst case: every
//! attempt failing, at a rate low enough for the budgets' floors to pay
//! every retry. The lint compares it with the service's `capacity
//! amplification N`, or 10 when the service declares none (two tiers of 3
//! attempts pass, three do not). The message also gives the steady state
//! under load, where each budget holds its hop to `1 + share` times its
//! calls. `govc plan` prints the amplification of every service a change
//! moves.
//!
//! Why: the retry storm is the classic outage of a deep call graph: each
//! tier retries on its own terms, a failing service at the bottom gets many
//! times its normal load exactly when it is least able to carry it, and it
//! stays down.
//!
//! Example: `edge`, `t1` and `t2` each with `retry ... { attempts 3 ... }`
//! on their calls to the next; `t3` at the bottom.
//!
//! Fix: retry at one tier, the one nearest the failure (lower `attempts` on
//! the others to 1 by removing their retry rules), or, if the service can
//! take the load, declare it: `capacity amplification 27`.

use miette::SourceSpan;
use thiserror::Error;

use crate::paths::{self, RetryAt};
use crate::resolve::{Ctx, Src};

/// The bound of a service that declares no `capacity amplification`.
pub(crate) const DEFAULT_BOUND: i64 = 10;

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "one call at `{top}` can reach `{service}` as {worst} attempts ({path}), above its capacity amplification {bound}"
)]
#[diagnostic(
    code("gov::lint::retry-amplification"),
    severity(Warning),
    help(
        "retry at one tier, the one nearest the failure, and remove the other retry rules on the path; or, if `{service}` can take that load, declare `capacity amplification {worst}` on it (with the budgets' shares it is {budgeted} in steady state)"
    )
)]
pub struct RetryAmplification {
    pub service: String,
    pub top: String,
    pub worst: u64,
    pub path: String,
    pub bound: i64,
    pub budgeted: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{attempts} attempts of each call to `{to}`")]
    pub span: SourceSpan,
    pub attempts: u32,
    pub to: String,
}

pub(crate) fn check<D: From<RetryAmplification>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    let retries = paths::retries(cx);
    let reach = paths::reach(&paths::ctx_hops(cx, &retries));
    for svc in cx.unique_services() {
        let Some(r) = reach.get(svc.name()) else {
            continue;
        };
        let bound = svc.amplification.map_or(DEFAULT_BOUND, |b| b.node);
        if i64::try_from(r.worst).unwrap_or(i64::MAX) <= bound {
            continue;
        }
        // The label goes on the retry of the path nearest this service.
        let Some((retry, to)) = r.path.windows(2).rev().find_map(|hop| {
            let found = retries.iter().filter(|x| {
                x.svc.name() == hop[0] && x.to.contains(&hop[1]) && x.spec.attempts > 1
            });
            found.max_by_key(|x| x.spec.attempts).map(|x| (x, hop[1]))
        }) else {
            continue;
        };
        let RetryAt {
            svc: at,
            rule,
            spec,
            ..
        } = retry;
        out.push(
            RetryAmplification {
                service: svc.name().to_string(),
                top: r.path.first().copied().unwrap_or_default().to_string(),
                worst: r.worst,
                path: r.path.join(" -> "),
                bound,
                budgeted: paths::times(r.budgeted_milli),
                src: cx.src(at.file),
                span: rule.def.name.span.into(),
                attempts: spec.attempts,
                to: to.to_string(),
            }
            .into(),
        );
    }
}
