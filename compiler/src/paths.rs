//! Call paths across services: how many attempts one call at the top of a
//! path can cause at each service below it through the retries on the way.
//!
//! A hop is one service calling another (a `calls to` in any of its matches
//! or rules). Each hop carries its caller's retries of those calls: the most
//! attempts of one call (1 without a retry rule) and the share its budget
//! allows. Along a path attempts multiply: three tiers that each make 3
//! attempts turn one call at the top into 27 at the bottom when every
//! attempt fails and the budgets' floors pay every retry (the worst case, at
//! low traffic). Under load a budget of `r%` holds a hop to `1 + r` times its
//! calls, so the budgeted amplification of a path is the product of those.
//!
//! Read by `gov::lint::retry-amplification` (the worst case against the
//! service's `capacity amplification`) and by the plan, which prints the
//! amplification of each service that changes.

use std::collections::BTreeMap;

use gov_proto::v1 as pb;

use crate::kind::Rule;
use crate::kind::retry::Retry;
use crate::resolve::{Ctx, Norm, Svc, calls_to};

/// One service calling another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hop<'a> {
    pub from: &'a str,
    pub to: &'a str,
    /// The most attempts of one call on this hop, the first included.
    pub attempts: u64,
    /// The retries the hop's budget allows per call, in milli-percent
    /// (`budget 20%`: 20,000); at most `(attempts - 1) * 100%`.
    pub budget_milli_percent: u64,
}

/// The worst a call at the top of some path can do to one service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reach<'a> {
    /// The attempts one call at the top can cause here, every budget's floor
    /// paying (the product of the hops' attempts).
    pub worst: u64,
    /// The same with every budget holding its share, in thousandths (1,000:
    /// no amplification).
    pub budgeted_milli: u64,
    /// The path with the worst amplification, top first, this service last.
    pub path: Vec<&'a str>,
}

/// Beyond this many hops walked, the search stops (a policy of hundreds of
/// services calling each other in every order); what it found by then is
/// reported, a lower bound.
const MAX_STEPS: usize = 100_000;

/// For every service some hop reaches, the worst path to it. Only simple
/// paths count: a cycle of calls (a service calling back up its path)
/// multiplies nothing more, its calls are counted once around.
pub(crate) fn reach<'a>(hops: &[Hop<'a>]) -> BTreeMap<&'a str, Reach<'a>> {
    let mut out: BTreeMap<&'a str, Reach<'a>> = BTreeMap::new();
    let mut from: BTreeMap<&'a str, Vec<&Hop<'a>>> = BTreeMap::new();
    for hop in hops {
        from.entry(hop.from).or_default().push(hop);
    }
    let mut steps = 0;
    for &top in from.keys() {
        let mut path = vec![top];
        walk(&from, &mut path, 1, 1000, &mut out, &mut steps);
    }
    out
}

fn walk<'a>(
    from: &BTreeMap<&'a str, Vec<&Hop<'a>>>,
    path: &mut Vec<&'a str>,
    worst: u64,
    budgeted_milli: u64,
    out: &mut BTreeMap<&'a str, Reach<'a>>,
    steps: &mut usize,
) {
    let Some(&at) = path.last() else {
        return;
    };
    for hop in from.get(at).into_iter().flatten() {
        *steps += 1;
        if *steps > MAX_STEPS || path.contains(&hop.to) {
            continue;
        }
        let worst = worst.saturating_mul(hop.attempts.max(1));
        let factor = (1000 + hop.budget_milli_percent / 100).min(hop.attempts.max(1) * 1000);
        let budgeted_milli = budgeted_milli.saturating_mul(factor) / 1000;
        path.push(hop.to);
        let better = out.get(hop.to).is_none_or(|r| {
            (worst, budgeted_milli) > (r.worst, r.budgeted_milli)
                || ((worst, budgeted_milli) == (r.worst, r.budgeted_milli)
                    && path.len() < r.path.len())
        });
        if better {
            out.insert(
                hop.to,
                Reach {
                    worst,
                    budgeted_milli,
                    path: path.clone(),
                },
            );
        }
        walk(from, path, worst, budgeted_milli, out, steps);
        path.pop();
    }
}

/// The hop `from -> to` with the retries of `retry` (none: one attempt).
pub(crate) fn hop<'a>(from: &'a str, to: &'a str, retry: Option<&pb::Retry>) -> Hop<'a> {
    let attempts = retry.map_or(1, |r| u64::from(r.attempts.max(1)));
    let share = retry
        .and_then(|r| r.budget.as_ref())
        .map_or(0, |b| u64::from(b.ratio_milli_percent));
    Hop {
        from,
        to,
        attempts,
        budget_milli_percent: share.min((attempts - 1) * 100_000),
    }
}

/// Adds `hop`, or raises the hop already there between the same services
/// to the larger attempts and share (two retry rules on calls to one
/// service: a call may meet either).
pub(crate) fn add<'a>(hops: &mut Vec<Hop<'a>>, hop: Hop<'a>) {
    match hops
        .iter_mut()
        .find(|h| (h.from, h.to) == (hop.from, hop.to))
    {
        Some(h) => {
            h.attempts = h.attempts.max(hop.attempts);
            h.budget_milli_percent = h.budget_milli_percent.max(hop.budget_milli_percent);
        }
        None => hops.push(hop),
    }
}

/// Every service `e` names in a `calls to`.
pub(crate) fn callees<'e>(e: &'e pb::MatchExpr, out: &mut Vec<&'e str>) {
    use pb::match_expr::Kind;
    match &e.kind {
        Some(Kind::CallsTo(s)) => out.push(s),
        Some(Kind::And(l) | Kind::Or(l)) => l.exprs.iter().for_each(|e| callees(e, out)),
        _ => {}
    }
}

/// The hops of a compiled policy: every service a config's matches or
/// rules call, with the retries of its retry rules on those calls.
pub(crate) fn bundle_hops(bundle: &pb::Bundle) -> Vec<Hop<'_>> {
    let mut hops = Vec::new();
    for t in &bundle.targets {
        let mut to = Vec::new();
        for m in &t.matches {
            m.expr.iter().for_each(|e| callees(e, &mut to));
        }
        for &callee in &to {
            add(&mut hops, hop(&t.service, callee, None));
        }
        for rule in &t.rules {
            let mut to = Vec::new();
            rule.on.iter().for_each(|e| callees(e, &mut to));
            let retry = match &rule.spec {
                Some(pb::rule::Spec::Retry(r)) => Some(r),
                _ => None,
            };
            for callee in to {
                add(&mut hops, hop(&t.service, callee, retry));
            }
        }
    }
    hops
}

/// A retry rule of the policy with the services it retries calls to.
pub(crate) struct RetryAt<'c, 'a> {
    pub svc: &'c Svc<'a>,
    pub rule: &'c Rule<'a>,
    pub spec: pb::Retry,
    pub to: Vec<&'a str>,
}

/// Every retry rule of the policy (of the first definition of each
/// service), with its spec, defaults written out.
pub(crate) fn retries<'c, 'a>(cx: &'c Ctx<'a>) -> Vec<RetryAt<'c, 'a>> {
    let mut out = Vec::new();
    for svc in cx.unique_services() {
        for (rule, norm) in svc.rules_with_norms() {
            let Some(retry) = Retry::of(rule) else {
                continue;
            };
            let mut to = Vec::new();
            norm_callees(norm, &mut to);
            out.push(RetryAt {
                svc,
                rule,
                spec: retry.spec(),
                to,
            });
        }
    }
    out
}

/// The hops of a checked policy, as [`bundle_hops`] finds them in its
/// compiled form.
pub(crate) fn ctx_hops<'a>(cx: &Ctx<'a>, retries: &[RetryAt<'_, 'a>]) -> Vec<Hop<'a>> {
    let mut hops = Vec::new();
    for svc in cx.unique_services() {
        let mut to = Vec::new();
        for m in svc.matches.values() {
            let mut ids = Vec::new();
            calls_to(&m.expr, &mut ids);
            to.extend(ids.into_iter().map(|i| i.node.as_str()));
        }
        for (_, norm) in svc.rules_with_norms() {
            norm_callees(norm, &mut to);
        }
        for callee in to {
            add(&mut hops, hop(svc.name(), callee, None));
        }
    }
    for r in retries {
        for &callee in &r.to {
            add(&mut hops, hop(r.svc.name(), callee, Some(&r.spec)));
        }
    }
    hops
}

/// Every service a normalized expression names in a `calls to`.
pub(crate) fn norm_callees<'a>(norm: &Norm<'a>, out: &mut Vec<&'a str>) {
    match norm {
        Norm::CallsTo(s) => out.push(s),
        Norm::And(parts) | Norm::Or(parts) => parts.iter().for_each(|n| norm_callees(n, out)),
        _ => {}
    }
}

/// The longest the attempts of one call can take: each its whole per-try
/// timeout, each wait before a retry its longest. `None` without a per-try
/// timeout (an attempt is then bounded only by the call's own deadline).
pub(crate) fn retry_worst_ms(r: &pb::Retry) -> Option<u64> {
    if r.per_try_timeout_ms == 0 {
        return None;
    }
    let attempts = u64::from(r.attempts.max(1));
    let (mut backoff, mut wait) = (0u64, r.backoff_ms);
    for _ in 1..attempts {
        backoff = backoff.saturating_add(wait.min(r.backoff_max_ms));
        wait = wait.saturating_mul(2);
    }
    Some(
        attempts
            .saturating_mul(r.per_try_timeout_ms)
            .saturating_add(backoff),
    )
}

/// `1.35x` from thousandths.
pub(crate) fn times(milli: u64) -> String {
    let text = format!("{}.{:03}", milli / 1000, milli % 1000);
    format!("{}x", text.trim_end_matches('0').trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop<'a>(from: &'a str, to: &'a str, attempts: u64, budget: u64) -> Hop<'a> {
        Hop {
            from,
            to,
            attempts,
            budget_milli_percent: budget,
        }
    }

    #[test]
    fn attempts_multiply_along_a_path_and_budgets_hold_each_hop() {
        let hops = [
            hop("edge", "t1", 3, 10_000),
            hop("t1", "t2", 3, 10_000),
            hop("t2", "t3", 3, 10_000),
        ];
        let reach = reach(&hops);
        let t3 = &reach["t3"];
        assert_eq!(t3.worst, 27);
        assert_eq!(t3.budgeted_milli, 1331);
        assert_eq!(t3.path, ["edge", "t1", "t2", "t3"]);
        assert_eq!(reach["t1"].worst, 3);
        assert!(!reach.contains_key("edge"), "nothing calls the top");
    }

    #[test]
    fn the_worst_of_two_paths_counts_and_a_hop_without_retries_passes_calls_on() {
        let hops = [
            hop("a", "b", 1, 0),
            hop("b", "d", 2, 100_000),
            hop("a", "c", 4, 50_000),
            hop("c", "d", 1, 0),
        ];
        let d = &reach(&hops)["d"];
        assert_eq!(d.worst, 4);
        assert_eq!(d.path, ["a", "c", "d"]);
        assert_eq!(d.budgeted_milli, 1500);
    }

    #[test]
    fn a_budget_never_allows_more_than_the_attempts() {
        let d = &reach(&[hop("a", "b", 2, 300_000)])["b"];
        assert_eq!((d.worst, d.budgeted_milli), (2, 2000));
    }

    #[test]
    fn a_cycle_of_calls_is_walked_once_around() {
        let hops = [hop("a", "b", 3, 0), hop("b", "a", 3, 0)];
        let reach = reach(&hops);
        assert_eq!(reach["a"].worst, 3);
        assert_eq!(reach["a"].path, ["b", "a"]);
        assert_eq!(reach["b"].worst, 3);
    }

    #[test]
    fn a_retry_takes_its_attempts_timeouts_and_backoffs_at_worst() {
        let r = pb::Retry {
            attempts: 3,
            per_try_timeout_ms: 300,
            backoff_ms: 25,
            backoff_max_ms: 40,
            ..pb::Retry::default()
        };
        assert_eq!(retry_worst_ms(&r), Some(900 + 25 + 40));
        let unbounded = pb::Retry {
            per_try_timeout_ms: 0,
            ..r
        };
        assert_eq!(retry_worst_ms(&unbounded), None);
    }

    #[test]
    fn times_prints_thousandths_as_a_factor() {
        assert_eq!(times(1000), "1x");
        assert_eq!(times(1331), "1.331x");
        assert_eq!(times(1500), "1.5x");
        assert_eq!(times(27_000), "27x");
    }
}
