//! `gov::lint::cluster-limit-inconsistent` (warning): a cluster-wide limit
//! that can never engage because local (per-instance) limits on the same
//! calls always engage first.
//!
//! On the same match and the same `per` key, a local limit of `L` per
//! window admits at most `L * instances` across the service's declared
//! `capacity instances`. A cluster limit whose rate (normalised to the
//! same window) is at or above that total is dead configuration: it costs
//! a shared store and never rejects anything. Calls and bytes are compared
//! separately.
//!
//! Why: Sentinel's `AVG_LOCAL` vs `GLOBAL` and Polaris' `SHARE_EQUALLY`
//! modes make this mismatch easy; the intent was usually a cluster limit
//! below the sum, with the local limit as a safety net.
//!
//! Example: `capacity instances 3`, `limit local on api { calls 100 per 1s }`,
//! `limit global on api { calls 500 per 1s  scope cluster sync exact }`.
//!
//! Fix: lower the cluster limit below `local * instances`, or raise the
//! local one. Only checked when the service declares `capacity instances`.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::limit::{Counter, Limit, LimitEff};
use crate::resolve::{Ctx, Src};
use crate::units::{fmt_bytes, fmt_millis};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "cluster limit `{cluster}` never engages: local limit `{local}` admits at most {total} across {instances} instances"
)]
#[diagnostic(
    code("gov::lint::cluster-limit-inconsistent"),
    severity(Warning),
    help("lower the cluster limit below {total}, or raise the local limit `{local}`")
)]
pub struct ClusterLimitInconsistent {
    pub cluster: String,
    pub local: String,
    pub total: String,
    pub instances: i64,
    #[source_code]
    pub src: Src,
    #[label(primary, "cluster-wide")]
    pub cluster_span: SourceSpan,
    #[label("per instance")]
    pub local_span: SourceSpan,
}

/// `a` per `a.window` >= `b * n` per `b.window`, without rounding.
fn at_least(a: &Counter, b: &Counter, n: i64) -> bool {
    let lhs = i128::from(a.amount) * i128::from(b.window_ms);
    let rhs = i128::from(b.amount) * i128::from(n) * i128::from(a.window_ms);
    a.window_ms > 0 && b.window_ms > 0 && lhs >= rhs
}

pub(crate) fn check<D: From<ClusterLimitInconsistent>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let Some(instances) = svc.instances else {
            continue;
        };
        let n = instances.node;
        if n <= 0 {
            continue;
        }
        let limits: Vec<_> = svc
            .rules_with_norms()
            .filter_map(|(r, norm)| {
                let l = Limit::of(r)?;
                let e = LimitEff::of(&l);
                Some((l, e, norm))
            })
            .collect();
        for (cl, ce, cn) in &limits {
            if !ce.scope.is_cluster() || !cn.is_valid() {
                continue;
            }
            for (ll, le, ln) in &limits {
                if le.scope.is_cluster() || ln != cn || le.per != ce.per {
                    continue;
                }
                let pairs = [(ce.calls, le.calls, false), (ce.bytes, le.bytes, true)];
                for (c, l, is_bytes) in pairs {
                    let (Some(c), Some(l)) = (c, l) else { continue };
                    if !at_least(&c, &l, n) {
                        continue;
                    }
                    let total = l.amount.saturating_mul(n);
                    let total = if is_bytes {
                        format!("{} per {}", fmt_bytes(total), fmt_millis(l.window_ms))
                    } else {
                        format!("{total} calls per {}", fmt_millis(l.window_ms))
                    };
                    out.push(
                        ClusterLimitInconsistent {
                            cluster: cl.name.node.clone(),
                            local: ll.name.node.clone(),
                            total,
                            instances: n,
                            src: cx.src(svc.file),
                            cluster_span: c.span.into(),
                            local_span: l.span.into(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
