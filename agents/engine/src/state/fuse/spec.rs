//! What a fuse does ([`FuseSpec`]): its trip conditions, error classes
//! and recovery, converted from its wire `Fuse`: every value checked,
//! nothing filled in.

use std::time::Duration;

use gov_proto::v1::{self as proto, GrpcCode};
use http::StatusCode;

use crate::config::invalid::{Ctx, InvalidConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TripMetric {
    Errors,
    ErrorRatio,
    BusinessErrors,
    BusinessErrorRatio,
    SystemErrors,
    SystemErrorRatio,
    /// Calls slower than the trip's `slower_than` (or timed out).
    SlowCalls,
    SlowCallRatio,
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
            TripMetric::SlowCalls => "slow_calls",
            TripMetric::SlowCallRatio => "slow_call_ratio",
        }
    }

    pub fn is_ratio(self) -> bool {
        matches!(
            self,
            TripMetric::ErrorRatio
                | TripMetric::BusinessErrorRatio
                | TripMetric::SystemErrorRatio
                | TripMetric::SlowCallRatio
        )
    }

    /// Counts slow calls (its trip has a `slower_than`).
    pub fn is_slow(self) -> bool {
        matches!(self, TripMetric::SlowCalls | TripMetric::SlowCallRatio)
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
    /// The slow metrics only: a call whose latency is above this, or that
    /// timed out, is slow. `None` for the error metrics.
    pub slower_than: Option<Duration>,
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

    /// Whether a call that ended with `outcome` is in this class.
    #[inline]
    pub(crate) fn has(&self, outcome: crate::outcome::Outcome) -> bool {
        use crate::outcome::Outcome;
        match outcome {
            Outcome::Status(code) => self.has_status(code),
            Outcome::Grpc(code) => self.has_grpc(code),
            Outcome::ConnectFailure => self.connect_failure,
            Outcome::Timeout => self.timeout,
            Outcome::Reset => self.reset,
        }
    }

    /// The outcomes of this class or of `other`.
    pub(crate) fn or(&self, other: &Self) -> Self {
        let mut statuses = self.statuses;
        for (s, o) in statuses.iter_mut().zip(other.statuses) {
            *s |= o;
        }
        Self {
            statuses,
            grpc: self.grpc | other.grpc,
            connect_failure: self.connect_failure || other.connect_failure,
            timeout: self.timeout || other.timeout,
            reset: self.reset || other.reset,
        }
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

/// A fuse's spec from the wire.
pub(crate) fn spec(ctx: &Ctx<'_>, f: &proto::Fuse) -> Result<FuseSpec, InvalidConfig> {
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
                proto::TripMetric::SlowCalls => TripMetric::SlowCalls,
                proto::TripMetric::SlowCallRatio => TripMetric::SlowCallRatio,
            };
            let slower_than = match (metric.is_slow(), t.slow_ms) {
                (true, _) => Some(ctx.positive_ms("trip.slow_ms", t.slow_ms)?),
                (false, 0) => None,
                (false, _) => {
                    return Err(ctx.err(format!(
                        "`trip.slow_ms` is set on `{}`, which counts errors, not slow calls",
                        metric.as_str()
                    )));
                }
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
                slower_than,
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

pub(crate) fn classifier(
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
