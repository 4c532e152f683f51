//! What each rule kind does ([`RuleSpec`]), converted from its wire
//! `spec`: every value checked, nothing filled in. A new kind is one more
//! variant here, its spec type and its conversion.

use std::time::Duration;

use gov_proto::v1 as proto;
use http::StatusCode;
use proto::{GrpcCode, RuleKind};

use super::invalid::{Ctx, InvalidConfig};

/// What a rule does. Equal specs under the same rule name keep their state
/// across a config swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleSpec {
    Bulkhead(BulkheadSpec),
    Limit(LimitSpec),
    Fuse(FuseSpec),
}

impl RuleSpec {
    /// The kind of rule.
    pub fn kind(&self) -> RuleKind {
        match self {
            RuleSpec::Bulkhead(_) => RuleKind::Bulkhead,
            RuleSpec::Limit(_) => RuleKind::Limit,
            RuleSpec::Fuse(_) => RuleKind::Fuse,
        }
    }
}

/// Whose calls share one set of bulkhead permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BulkheadKey {
    Operation,
    Instance,
    InstancePath,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BulkheadSpec {
    pub key: BulkheadKey,
    pub max_concurrent: u32,
    /// Zero: fail fast.
    pub max_wait: Duration,
    /// At most this many waiters per key. `None`: bounded only by `max_wait`.
    pub max_queue: Option<u32>,
    pub timeout: Option<Duration>,
    pub reject_status: StatusCode,
    /// The answer to a gRPC call it rejects.
    pub reject_grpc: GrpcCode,
}

/// Whose calls share one limit counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitKey {
    All,
    Domain,
    Service,
    Consumer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateSpec {
    pub amount: u64,
    pub window: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitAction {
    Reject,
    /// Delay the call until it fits, at most `max_delay`.
    Shape {
        max_delay: Duration,
    },
}

/// How an engaged (latched) limit is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseSpec {
    After(Duration),
    Manual,
}

/// Where counters live. Cluster scopes share them in Redis when the engine
/// has a [`ClusterStore`](crate::ClusterStore) (see `limit.rs`); without one,
/// [`Engine::apply_target`](crate::Engine::apply_target) refuses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitScope {
    Local,
    ClusterExact,
    ClusterBatch(Duration),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub calls: Option<RateSpec>,
    pub bytes: Option<RateSpec>,
    pub key: LimitKey,
    pub action: LimitAction,
    pub reject_status: StatusCode,
    /// The answer to a gRPC call it rejects.
    pub reject_grpc: GrpcCode,
    /// `None`: not latched; counters reset every window.
    pub release: Option<ReleaseSpec>,
    pub scope: LimitScope,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TripMetric {
    Errors,
    ErrorRatio,
    BusinessErrors,
    BusinessErrorRatio,
    SystemErrors,
    SystemErrorRatio,
}

impl TripMetric {
    /// The name as written in `.gov`.
    pub fn as_str(self) -> &'static str {
        match self {
            TripMetric::Errors => "errors",
            TripMetric::ErrorRatio => "error_ratio",
            TripMetric::BusinessErrors => "business_errors",
            TripMetric::BusinessErrorRatio => "business_error_ratio",
            TripMetric::SystemErrors => "system_errors",
            TripMetric::SystemErrorRatio => "system_error_ratio",
        }
    }

    pub fn is_ratio(self) -> bool {
        matches!(
            self,
            TripMetric::ErrorRatio | TripMetric::BusinessErrorRatio | TripMetric::SystemErrorRatio
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Gt,
    Ge,
}

/// A count, or a ratio in thousandths of a percent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Threshold {
    Count(u64),
    MilliPercent(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TripSpec {
    pub metric: TripMetric,
    pub op: CompareOp,
    pub threshold: Threshold,
    pub window: Duration,
    pub min_calls: u64,
}

/// Which outcomes belong to an error class: a bitmap over status codes
/// 0..=639, one over gRPC codes, plus transport failures.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Classifier {
    pub(crate) statuses: [u64; 10],
    /// Bit `n`: gRPC code `n`.
    pub(crate) grpc: u32,
    pub connect_failure: bool,
    pub timeout: bool,
    pub reset: bool,
}

impl Classifier {
    /// Adds the inclusive range `from..=to` (clamped to 0..=639).
    pub fn add_statuses(&mut self, from: u16, to: u16) {
        for code in from..=to.min(639) {
            self.statuses[usize::from(code / 64)] |= 1 << (code % 64);
        }
    }

    /// Whether `code` is in this class.
    pub fn has_status(&self, code: u16) -> bool {
        code < 640 && self.statuses[usize::from(code / 64)] & (1 << (code % 64)) != 0
    }

    /// Adds the gRPC code `code`.
    pub fn add_grpc(&mut self, code: GrpcCode) {
        self.grpc |= 1 << (code as u32);
    }

    /// Whether a gRPC call that ended with `code` is in this class.
    pub fn has_grpc(&self, code: GrpcCode) -> bool {
        self.grpc & (1 << (code as u32)) != 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoverSpec {
    Manual,
    /// Half-open after `after`; `probes` successful calls close it.
    After {
        after: Duration,
        probes: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseSpec {
    pub trips: Vec<TripSpec>,
    pub business: Classifier,
    pub system: Classifier,
    pub recover: RecoverSpec,
    pub reject_status: StatusCode,
    /// The answer to a gRPC call it rejects.
    pub reject_grpc: GrpcCode,
}

/// The spec of one wire rule: the one place that turns a `oneof spec` into
/// a [`RuleSpec`].
pub(super) fn spec(ctx: &Ctx<'_>, r: &proto::Rule) -> Result<RuleSpec, InvalidConfig> {
    use proto::rule::Spec;
    Ok(match &r.spec {
        Some(Spec::Bulkhead(b)) => RuleSpec::Bulkhead(bulkhead(ctx, b)?),
        Some(Spec::Limit(l)) => RuleSpec::Limit(limit(ctx, l)?),
        Some(Spec::Fuse(f)) => RuleSpec::Fuse(fuse(ctx, f)?),
        None => {
            return Err(ctx.err(
                "the rule has no spec: its kind is missing, or one this agent does not know (upgrade the agent)",
            ));
        }
    })
}

fn bulkhead(ctx: &Ctx<'_>, b: &proto::Bulkhead) -> Result<BulkheadSpec, InvalidConfig> {
    if b.max_concurrent == 0 {
        return Err(ctx.err("`max_concurrent` must be > 0"));
    }
    Ok(BulkheadSpec {
        key: match ctx.known::<proto::BulkheadKey>("key", b.key)? {
            proto::BulkheadKey::Operation => BulkheadKey::Operation,
            proto::BulkheadKey::Instance => BulkheadKey::Instance,
            proto::BulkheadKey::InstancePath => BulkheadKey::InstancePath,
        },
        max_concurrent: b.max_concurrent,
        max_wait: Duration::from_millis(b.max_wait_ms),
        max_queue: b.max_queue,
        timeout: (b.timeout_ms > 0).then(|| Duration::from_millis(b.timeout_ms)),
        reject_status: ctx.status(b.reject_status)?,
        reject_grpc: ctx.grpc(b.reject_grpc_status)?,
    })
}

fn limit(ctx: &Ctx<'_>, l: &proto::Limit) -> Result<LimitSpec, InvalidConfig> {
    let calls = l
        .calls
        .as_ref()
        .map(|r| rate(ctx, "calls", r))
        .transpose()?;
    let bytes = l
        .bytes
        .as_ref()
        .map(|r| rate(ctx, "bytes", r))
        .transpose()?;
    if calls.is_none() && bytes.is_none() {
        return Err(ctx.err("neither `calls` nor `bytes` is set"));
    }
    let action = match ctx.known::<proto::LimitAction>("action", l.action)? {
        proto::LimitAction::Reject => LimitAction::Reject,
        proto::LimitAction::Shape => LimitAction::Shape {
            max_delay: ctx.positive_ms("max_delay_ms", l.max_delay_ms)?,
        },
    };
    let release = match l.release.as_ref().and_then(|r| r.kind.as_ref()) {
        None => None,
        Some(proto::release::Kind::AfterMs(ms)) => Some(ReleaseSpec::After(
            ctx.positive_ms("release.after_ms", *ms)?,
        )),
        Some(proto::release::Kind::Manual(_)) => Some(ReleaseSpec::Manual),
    };
    let scope = match (
        ctx.known::<proto::LimitScope>("scope", l.scope)?,
        ctx.known::<proto::ClusterSync>("sync", l.sync)?,
    ) {
        (proto::LimitScope::Local, _) => LimitScope::Local,
        (proto::LimitScope::Cluster, proto::ClusterSync::Exact) => LimitScope::ClusterExact,
        (proto::LimitScope::Cluster, proto::ClusterSync::Batch) => {
            LimitScope::ClusterBatch(ctx.positive_ms("sync_batch_ms", l.sync_batch_ms)?)
        }
    };
    Ok(LimitSpec {
        calls,
        bytes,
        key: match ctx.known::<proto::LimitKey>("key", l.key)? {
            proto::LimitKey::All => LimitKey::All,
            proto::LimitKey::Domain => LimitKey::Domain,
            proto::LimitKey::Service => LimitKey::Service,
            proto::LimitKey::Consumer => LimitKey::Consumer,
        },
        action,
        reject_status: ctx.status(l.reject_status)?,
        reject_grpc: ctx.grpc(l.reject_grpc_status)?,
        release,
        scope,
    })
}

fn fuse(ctx: &Ctx<'_>, f: &proto::Fuse) -> Result<FuseSpec, InvalidConfig> {
    if f.trips.is_empty() {
        return Err(ctx.err("the fuse has no `trip when` condition"));
    }
    let trips = f
        .trips
        .iter()
        .map(|t| {
            let metric = match ctx.known::<proto::TripMetric>("trip.metric", t.metric)? {
                proto::TripMetric::Errors => TripMetric::Errors,
                proto::TripMetric::ErrorRatio => TripMetric::ErrorRatio,
                proto::TripMetric::BusinessErrors => TripMetric::BusinessErrors,
                proto::TripMetric::BusinessErrorRatio => TripMetric::BusinessErrorRatio,
                proto::TripMetric::SystemErrors => TripMetric::SystemErrors,
                proto::TripMetric::SystemErrorRatio => TripMetric::SystemErrorRatio,
            };
            let threshold = if metric.is_ratio() {
                if t.ratio_milli_percent > 100_000 {
                    return Err(ctx.err("a ratio threshold is above 100%"));
                }
                Threshold::MilliPercent(t.ratio_milli_percent)
            } else {
                Threshold::Count(t.count)
            };
            Ok(TripSpec {
                metric,
                op: match ctx.known::<proto::CompareOp>("trip.op", t.op)? {
                    proto::CompareOp::Gt => CompareOp::Gt,
                    proto::CompareOp::Ge => CompareOp::Ge,
                },
                threshold,
                window: ctx.positive_ms("trip.window_ms", t.window_ms)?,
                min_calls: t.min_calls,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let business = classifier(ctx, "business", f.business.as_ref())?;
    let system = classifier(ctx, "system", f.system.as_ref())?;

    let recover = match f.recover.as_ref().and_then(|r| r.kind.as_ref()) {
        None => return Err(ctx.err("`recover` is missing")),
        Some(proto::recovery::Kind::Manual(_)) => RecoverSpec::Manual,
        Some(proto::recovery::Kind::After(a)) => {
            if a.probes == 0 {
                return Err(ctx.err("`recover.after.probes` must be > 0"));
            }
            RecoverSpec::After {
                after: ctx.positive_ms("recover.after.after_ms", a.after_ms)?,
                probes: a.probes,
            }
        }
    };
    Ok(FuseSpec {
        trips,
        business,
        system,
        recover,
        reject_status: ctx.status(f.reject_status)?,
        reject_grpc: ctx.grpc(f.reject_grpc_status)?,
    })
}

fn classifier(
    ctx: &Ctx<'_>,
    class: &str,
    c: Option<&proto::ErrorClass>,
) -> Result<Classifier, InvalidConfig> {
    let mut out = Classifier::default();
    let Some(c) = c else {
        return Err(ctx.err(format!("`{class}` (the error class) is missing")));
    };
    for r in &c.status {
        let (Ok(from), Ok(to)) = (u16::try_from(r.from), u16::try_from(r.to)) else {
            return Err(ctx.err(format!("status range {}..{} is out of range", r.from, r.to)));
        };
        if from < 100 || to > 599 || from > to {
            return Err(ctx.err(format!("status range {from}..{to} is not within 100..599")));
        }
        out.add_statuses(from, to);
    }
    for &n in &c.grpc_status {
        let code = u32::try_from(n).ok().and_then(gov_proto::grpc::from_number);
        let Some(code) = code else {
            return Err(ctx.err(format!(
                "`{class}.grpc_status` {n} is not a grpc status code"
            )));
        };
        out.add_grpc(code);
    }
    out.connect_failure = c.connect_failure;
    out.timeout = c.timeout;
    out.reset = c.reset;
    Ok(out)
}

fn rate(ctx: &Ctx<'_>, field: &str, r: &proto::Rate) -> Result<RateSpec, InvalidConfig> {
    if r.amount == 0 {
        return Err(ctx.err(format!("`{field}.amount` must be > 0")));
    }
    Ok(RateSpec {
        amount: r.amount,
        window: ctx.positive_ms(&format!("{field}.window_ms"), r.window_ms)?,
    })
}
