//! `fuse NAME on EXPR { ... }`: trips on errors or slow calls over a window and then
//! rejects every call (503 unless `reject with` says otherwise) until it is
//! released by hand or, with `recover after`, recovers through probes.
//!
//! ```gov
//! fuse mdm on supplier {
//!   trip when business_error_ratio > 50% over 1m min_calls 20
//!   trip when system_errors >= 10 over 10s
//!   trip when slow_call_ratio > 50% over 1m slower than 2s min_calls 20
//!   classify business status 500..599
//!   classify system connect_failure timeout status 401 403
//!   recover manual
//!   reject with 503
//! }
//! ```

use std::fmt::Write as _;

use gov_lang::ast::{Duration, Ident, Percent, RuleDef, Setting, Span, Spanned, Status};
use gov_proto::v1 as pb;

use super::{Bound, Large, LowerCx, Reject, Rule, Values, Words};
use crate::units::{fmt_milli_percent, fmt_millis, fmt_ms, millis, push, u32_of, unsigned};

/// The default rejection status, beside the kind's word in gov-proto
/// (`RuleKind::reject_status`; the compiler writes it).
pub(crate) const REJECT: i64 = pb::RuleKind::Fuse.reject_status() as i64;

#[derive(Clone, Debug)]
pub(crate) enum FuseSetting {
    Trip(Trip),
    Classify(Classify),
    Recover { recover: Recover },
    RejectWith { reject: Reject },
}

/// `trip when METRIC OP VALUE over D [slower than D] [min_calls N]`
#[derive(Clone, Debug)]
pub(crate) struct Trip {
    pub metric: Spanned<TripMetric>,
    pub op: Spanned<CompareOp>,
    pub threshold: Spanned<Threshold>,
    pub window: Spanned<Duration>,
    /// `slower than D`: what a slow call is (the slow metrics need it, the
    /// others refuse it: `gov::slower-than`); spans the whole clause.
    pub slower_than: Option<(Spanned<Duration>, Span)>,
    pub min_calls: Option<Spanned<i64>>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TripMetric {
    BusinessErrors,     // business_errors
    BusinessErrorRatio, // business_error_ratio
    SystemErrors,       // system_errors
    SystemErrorRatio,   // system_error_ratio
    Errors,             // errors (business + system)
    ErrorRatio,         // error_ratio
    SlowCalls,          // slow_calls (calls slower than `slower than D`)
    SlowCallRatio,      // slow_call_ratio
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompareOp {
    Gt, // >
    Ge, // >=
}

/// A count (`10`) or a percentage (`50%`); which one fits depends on the metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Threshold {
    Count(i64),
    Percent(Percent),
}

/// `classify business|system ITEM...`: which outcomes count as which error.
#[derive(Clone, Debug)]
pub(crate) struct Classify {
    pub class: Spanned<ErrorClass>,
    pub items: Vec<ClassifyItem>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    Business,
    System,
}

#[derive(Clone, Debug)]
pub(crate) enum ClassifyItem {
    /// `status 500` or `status 500..599` (inclusive), several after one `status`.
    Status {
        codes: Vec<StatusRange>,
    },
    /// `grpc_status UNAVAILABLE ...`: gRPC calls that ended with these
    /// codes (an unknown name is `gov::unknown-grpc-status`).
    Grpc {
        codes: Vec<Spanned<String>>,
    },
    ConnectFailure,
    Timeout,
    /// The upstream closed the connection mid-response.
    Reset,
}

#[derive(Clone, Debug)]
pub(crate) struct StatusRange {
    pub from: Status,
    /// `None` for a single code.
    pub to: Option<Status>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub(crate) enum Recover {
    /// `recover manual`: stays tripped until an operator releases it.
    Manual,
    /// `recover after D probe N`: half-open after D, N probe calls decide.
    After {
        after: Spanned<Duration>,
        probes: Spanned<i64>,
    },
}

/// A fuse with its settings decoded.
pub(crate) struct Fuse<'a> {
    pub name: &'a Ident,
    pub settings: Vec<FuseSetting>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RecoverEff {
    Manual,
    After { after_ms: i64, probes: i64 },
}

/// The effective settings: what is written, with defaults applied. When a
/// setting is given twice (an error of its own), the first wins.
pub(crate) struct FuseEff {
    pub trips: Vec<Trip>,
    /// `None`: the default classification applies.
    pub business: Option<Vec<ClassifyItem>>,
    pub system: Option<Vec<ClassifyItem>>,
    pub recover: RecoverEff,
    pub reject: i64,
    pub reject_grpc: pb::GrpcCode,
}

/// The kind.
pub(crate) struct Kind;

// === Decoding ===

fn decode(w: &mut Words<'_>) -> Option<FuseSetting> {
    let span = w.span;
    Some(match w.key()?.node {
        "trip" => {
            w.expect("when")?;
            let m = w.key()?;
            let metric = match m.node {
                "business_errors" => TripMetric::BusinessErrors,
                "business_error_ratio" => TripMetric::BusinessErrorRatio,
                "system_errors" => TripMetric::SystemErrors,
                "system_error_ratio" => TripMetric::SystemErrorRatio,
                "errors" => TripMetric::Errors,
                "error_ratio" => TripMetric::ErrorRatio,
                "slow_calls" => TripMetric::SlowCalls,
                "slow_call_ratio" => TripMetric::SlowCallRatio,
                _ => return None,
            };
            let o = w.key()?;
            let op = match o.node {
                ">=" => CompareOp::Ge,
                ">" => CompareOp::Gt,
                _ => return None,
            };
            let threshold = match w.percent() {
                Some(p) => Spanned::new(Threshold::Percent(p.node), p.span),
                None => {
                    let n = w.int()?;
                    Spanned::new(Threshold::Count(n.node), n.span)
                }
            };
            w.expect("over")?;
            let window = w.duration()?;
            let slower_than = match w.expect("slower") {
                Some(from) => {
                    w.expect("than")?;
                    let d = w.duration()?;
                    let clause = from.join(d.span);
                    Some((d, clause))
                }
                None => None,
            };
            let min_calls = match w.expect("min_calls") {
                Some(_) => Some(w.int()?),
                None => None,
            };
            FuseSetting::Trip(Trip {
                metric: Spanned::new(metric, m.span),
                op: Spanned::new(op, o.span),
                threshold,
                window,
                slower_than,
                min_calls,
                span,
            })
        }
        "classify" => {
            let c = w.key()?;
            let class = match c.node {
                "business" => ErrorClass::Business,
                "system" => ErrorClass::System,
                _ => return None,
            };
            FuseSetting::Classify(Classify {
                class: Spanned::new(class, c.span),
                items: classify_items(w)?,
            })
        }
        "recover" => {
            let recover = match w.key()?.node {
                "manual" => Recover::Manual,
                "after" => {
                    let after = w.duration()?;
                    w.expect("probe")?;
                    Recover::After {
                        after,
                        probes: w.int()?,
                    }
                }
                _ => return None,
            };
            FuseSetting::Recover { recover }
        }
        "reject" => {
            w.expect("with")?;
            FuseSetting::RejectWith {
                reject: w.reject()?,
            }
        }
        _ => return None,
    })
}

/// The items of a `classify` (and of a retry's `on`): every word left.
pub(crate) fn classify_items(w: &mut Words<'_>) -> Option<Vec<ClassifyItem>> {
    let mut items = Vec::new();
    while let Some(k) = w.key() {
        items.push(match k.node {
            "status" => {
                let mut codes = Vec::new();
                while let Some((from, to, span)) = w.range() {
                    codes.push(StatusRange { from, to, span });
                }
                ClassifyItem::Status { codes }
            }
            "grpc_status" => {
                let mut codes = Vec::new();
                while let Some(name) = w.name() {
                    codes.push(name);
                }
                ClassifyItem::Grpc { codes }
            }
            "connect_failure" => ClassifyItem::ConnectFailure,
            "timeout" => ClassifyItem::Timeout,
            "reset" => ClassifyItem::Reset,
            _ => return None,
        });
    }
    Some(items)
}

/// The codes of classify items for the range and gRPC name checks.
pub(crate) fn classify_values(items: Vec<ClassifyItem>, out: &mut Values) {
    for item in items {
        let codes = match item {
            ClassifyItem::Status { codes } => codes,
            ClassifyItem::Grpc { codes } => {
                out.grpc_codes.extend(codes.into_iter().map(|c| (c, false)));
                continue;
            }
            _ => continue,
        };
        for r in codes {
            out.statuses.push(r.from.clone());
            if let Some(to) = r.to {
                out.statuses.push(to.clone());
                out.ranges.push((r.from, to, r.span));
            }
        }
    }
}

impl<'a> Fuse<'a> {
    /// The rule as a fuse, if it is one.
    pub fn of(rule: &Rule<'a>) -> Option<Self> {
        (rule.imp.wire() == pb::RuleKind::Fuse).then(|| Self::from(rule.def))
    }

    fn from(def: &'a RuleDef) -> Self {
        Fuse {
            name: &def.name,
            settings: super::decode(def, decode),
        }
    }

    /// Every `trip when`, in order.
    pub fn trips(&self) -> impl Iterator<Item = &Trip> {
        self.settings.iter().filter_map(|s| match s {
            FuseSetting::Trip(t) => Some(t),
            _ => None,
        })
    }
}

impl TripMetric {
    pub const fn is_ratio(self) -> bool {
        matches!(
            self,
            TripMetric::BusinessErrorRatio
                | TripMetric::SystemErrorRatio
                | TripMetric::ErrorRatio
                | TripMetric::SlowCallRatio
        )
    }

    /// Counts slow calls (and so needs `slower than D`).
    pub const fn is_slow(self) -> bool {
        matches!(self, TripMetric::SlowCalls | TripMetric::SlowCallRatio)
    }
}

impl FuseEff {
    pub fn of(f: Fuse<'_>) -> Self {
        let mut e = FuseEff {
            trips: Vec::new(),
            business: None,
            system: None,
            recover: RecoverEff::Manual,
            reject: REJECT,
            reject_grpc: pb::RuleKind::Fuse.reject_grpc(),
        };
        for s in f.settings.into_iter().rev() {
            // Reversed so that the first occurrence is applied last and wins.
            match s {
                FuseSetting::Trip(t) => e.trips.insert(0, t),
                FuseSetting::Classify(c) => match c.class.node {
                    ErrorClass::Business => e.business = Some(c.items),
                    ErrorClass::System => e.system = Some(c.items),
                },
                FuseSetting::Recover { recover, .. } => {
                    e.recover = match recover {
                        Recover::Manual => RecoverEff::Manual,
                        Recover::After { after, probes } => RecoverEff::After {
                            after_ms: millis(&after.node),
                            probes: probes.node,
                        },
                    };
                }
                FuseSetting::RejectWith { reject, .. } => match reject {
                    Reject::Status(status) => e.reject = status.node,
                    Reject::Grpc(_) => {
                        e.reject_grpc = reject.grpc().unwrap_or(pb::RuleKind::Fuse.reject_grpc());
                    }
                },
            }
        }
        e
    }
}

impl RecoverEff {
    pub fn describe(&self) -> String {
        match self {
            RecoverEff::Manual => "recover manual".to_string(),
            RecoverEff::After { after_ms, probes } => {
                format!("recover after {} probe {probes}", fmt_millis(*after_ms))
            }
        }
    }
}

pub(crate) fn class(items: &[ClassifyItem]) -> pb::ErrorClass {
    let mut c = pb::ErrorClass::default();
    for item in items {
        match item {
            ClassifyItem::Status { codes } => {
                for r in codes {
                    let from = u32_of(r.from.node);
                    c.status.push(pb::StatusRange {
                        from,
                        to: r.to.as_ref().map_or(from, |t| u32_of(t.node)),
                    });
                }
            }
            ClassifyItem::Grpc { codes } => {
                let known = codes
                    .iter()
                    .filter_map(|n| gov_proto::grpc::from_name(&n.node));
                for code in known {
                    if !c.grpc_status.contains(&(code as i32)) {
                        c.grpc_status.push(code as i32);
                    }
                }
            }
            ClassifyItem::ConnectFailure => c.connect_failure = true,
            ClassifyItem::Timeout => c.timeout = true,
            ClassifyItem::Reset => c.reset = true,
        }
    }
    c
}

fn trip_text(t: &pb::Trip) -> String {
    let metric = match t.metric() {
        pb::TripMetric::Errors => "errors",
        pb::TripMetric::ErrorRatio => "error_ratio",
        pb::TripMetric::BusinessErrors => "business_errors",
        pb::TripMetric::BusinessErrorRatio => "business_error_ratio",
        pb::TripMetric::SystemErrors => "system_errors",
        pb::TripMetric::SystemErrorRatio => "system_error_ratio",
        pb::TripMetric::SlowCalls => "slow_calls",
        pb::TripMetric::SlowCallRatio => "slow_call_ratio",
    };
    let op = if t.op() == pb::CompareOp::Ge {
        ">="
    } else {
        ">"
    };
    let threshold = if metric.ends_with("ratio") {
        fmt_milli_percent(i64::from(t.ratio_milli_percent))
    } else {
        t.count.to_string()
    };
    let mut s = format!("{metric} {op} {threshold} over {}", fmt_ms(t.window_ms));
    if t.slow_ms != 0 {
        let _ = write!(s, " slower than {}", fmt_ms(t.slow_ms));
    }
    if t.min_calls != 0 {
        let _ = write!(s, " min_calls {}", t.min_calls);
    }
    s
}

pub(crate) fn class_text(c: &pb::ErrorClass) -> String {
    let mut parts = Vec::new();
    if !c.status.is_empty() {
        let codes: Vec<String> = c
            .status
            .iter()
            .map(|r| {
                if r.to == 0 || r.to == r.from {
                    r.from.to_string()
                } else {
                    format!("{}..{}", r.from, r.to)
                }
            })
            .collect();
        parts.push(format!("status {}", codes.join(" ")));
    }
    if !c.grpc_status.is_empty() {
        let names: Vec<&str> = c.grpc_status().map(gov_proto::grpc::name).collect();
        parts.push(format!("grpc_status {}", names.join(" ")));
    }
    for (on, word) in [
        (c.connect_failure, "connect_failure"),
        (c.timeout, "timeout"),
        (c.reset, "reset"),
    ] {
        if on {
            parts.push(word.to_string());
        }
    }
    parts.join(" ")
}

// === impl Kind ===

impl super::Kind for Kind {
    fn wire(&self) -> pb::RuleKind {
        pb::RuleKind::Fuse
    }

    fn missing(&self, rule: &RuleDef) -> Option<(&'static str, &'static str)> {
        let has = Fuse::from(rule).trips().next().is_some();
        (!has).then_some((
            "`trip when`",
            "add a condition such as `trip when error_ratio > 50% over 1m min_calls 20`",
        ))
    }

    fn setting_key(&self, setting: &Setting) -> Option<&'static str> {
        match decode(&mut Words::of(setting))? {
            // A fuse trips on any of its conditions.
            FuseSetting::Trip(_) => None,
            FuseSetting::Classify(c) => Some(match c.class.node {
                ErrorClass::Business => "classify business",
                ErrorClass::System => "classify system",
            }),
            FuseSetting::Recover { .. } => Some("recover"),
            FuseSetting::RejectWith { reject } => Some(reject.key()),
        }
    }

    fn values(&self, rule: &RuleDef, text: &dyn Fn(Span) -> String, out: &mut Values) {
        use Bound::{NotNegative, Positive};
        for s in Fuse::from(rule).settings {
            match s {
                FuseSetting::Trip(t) => {
                    out.bound_duration("over", &t.window, Positive);
                    if let Some((slower, _)) = &t.slower_than {
                        out.bound_duration("slower than", slower, Positive);
                        out.large("slower than", Large::Duration(slower.clone()));
                    }
                    if let Some(m) = &t.min_calls {
                        out.bound("min_calls", m.node, m.span, Positive);
                    }
                    if let Threshold::Count(n) = t.threshold.node {
                        let bound = match t.op.node {
                            CompareOp::Gt => NotNegative,
                            CompareOp::Ge => Positive,
                        };
                        let what = text(t.metric.span.join(t.op.span));
                        out.bound(&what, n, t.threshold.span, bound);
                    }
                    out.large("over", Large::Duration(t.window));
                }
                FuseSetting::Recover {
                    recover: Recover::After { after, probes },
                    ..
                } => {
                    out.bound_duration("recover after", &after, Positive);
                    out.bound("probe", probes.node, probes.span, Positive);
                    out.large("recover after", Large::Duration(after));
                    out.large("probe", Large::Count(probes));
                }
                FuseSetting::RejectWith { reject, .. } => reject.values(out),
                FuseSetting::Classify(c) => classify_values(c.items, out),
                FuseSetting::Recover { .. } => {}
            }
        }
    }

    fn conflict(
        &self,
        a: &RuleDef,
        b: &RuleDef,
        _text: &dyn Fn(Span) -> String,
    ) -> Option<(String, &'static str)> {
        let x = FuseEff::of(Fuse::from(a));
        let y = FuseEff::of(Fuse::from(b));
        let help = "merge the trip conditions into one fuse";
        if x.recover != y.recover {
            return Some((
                format!("`{}` vs `{}`", x.recover.describe(), y.recover.describe()),
                help,
            ));
        }
        if x.reject != y.reject {
            return Some((
                format!("`reject with {}` vs `reject with {}`", x.reject, y.reject),
                help,
            ));
        }
        None
    }

    fn lower(&self, rule: &RuleDef, l: &dyn LowerCx) -> pb::rule::Spec {
        let e = FuseEff::of(Fuse::from(rule));
        let trips = e
            .trips
            .iter()
            .map(|t| {
                let (count, ratio) = match t.threshold.node {
                    Threshold::Count(n) => (unsigned(n), 0),
                    Threshold::Percent(p) => (0, u32_of(p.milli)),
                };
                pb::Trip {
                    metric: match t.metric.node {
                        TripMetric::Errors => pb::TripMetric::Errors,
                        TripMetric::ErrorRatio => pb::TripMetric::ErrorRatio,
                        TripMetric::BusinessErrors => pb::TripMetric::BusinessErrors,
                        TripMetric::BusinessErrorRatio => pb::TripMetric::BusinessErrorRatio,
                        TripMetric::SystemErrors => pb::TripMetric::SystemErrors,
                        TripMetric::SystemErrorRatio => pb::TripMetric::SystemErrorRatio,
                        TripMetric::SlowCalls => pb::TripMetric::SlowCalls,
                        TripMetric::SlowCallRatio => pb::TripMetric::SlowCallRatio,
                    } as i32,
                    op: match t.op.node {
                        CompareOp::Gt => pb::CompareOp::Gt,
                        CompareOp::Ge => pb::CompareOp::Ge,
                    } as i32,
                    count,
                    ratio_milli_percent: ratio,
                    window_ms: unsigned(millis(&t.window.node)),
                    min_calls: t.min_calls.as_ref().map_or(0, |m| unsigned(m.node)),
                    source: Some(l.source(t.span)),
                    // On an error metric it is refused (`gov::slower-than`).
                    slow_ms: match &t.slower_than {
                        Some((d, _)) if t.metric.node.is_slow() => unsigned(millis(&d.node)),
                        _ => 0,
                    },
                }
            })
            .collect();
        let business = e
            .business
            .as_deref()
            .map_or_else(pb::Fuse::default_business, class);
        let system = e
            .system
            .as_deref()
            .map_or_else(pb::Fuse::default_system, class);
        pb::rule::Spec::Fuse(pb::Fuse {
            trips,
            business: Some(business),
            system: Some(system),
            recover: Some(pb::Recovery {
                kind: Some(match e.recover {
                    RecoverEff::Manual => pb::recovery::Kind::Manual(true),
                    RecoverEff::After { after_ms, probes } => {
                        pb::recovery::Kind::After(pb::AutoRecovery {
                            after_ms: unsigned(after_ms),
                            probes: u32_of(probes),
                        })
                    }
                }),
            }),
            reject_status: u32_of(e.reject),
            reject_grpc_status: e.reject_grpc as i32,
        })
    }

    fn fields(&self, spec: &pb::rule::Spec, f: &mut Vec<(String, String)>) {
        let pb::rule::Spec::Fuse(x) = spec else {
            return;
        };
        for (i, trip) in x.trips.iter().enumerate() {
            push(f, &format!("trip {}", i + 1), trip_text(trip));
        }
        if let Some(c) = &x.business {
            push(f, "classify business", class_text(c));
        }
        if let Some(c) = &x.system {
            push(f, "classify system", class_text(c));
        }
        let recover = match x.recover.as_ref().and_then(|r| r.kind.as_ref()) {
            None | Some(pb::recovery::Kind::Manual(_)) => "manual".to_string(),
            Some(pb::recovery::Kind::After(a)) => {
                format!("after {} probe {}", fmt_ms(a.after_ms), a.probes)
            }
        };
        push(f, "recover", recover);
        push(f, "reject with", x.reject_status.to_string());
        push(
            f,
            "reject with grpc_status",
            gov_proto::grpc::name(x.reject_grpc_status()).to_string(),
        );
    }

    fn sources(&self, spec: &mut pb::rule::Spec, f: &mut dyn FnMut(&mut Option<pb::SourceRef>)) {
        if let pb::rule::Spec::Fuse(x) = spec {
            for trip in &mut x.trips {
                f(&mut trip.source);
            }
        }
    }

    #[cfg(test)]
    fn decodes(&self, setting: &Setting) -> bool {
        let mut w = Words::of(setting);
        decode(&mut w).is_some() && w.done()
    }
}
