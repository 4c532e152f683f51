//! The compiled config as the engine uses it, converted once from the wire
//! type (`gov_proto::v1::TargetConfig`) at the edge.
//!
//! Everything the hot path needs is decided here, once per config: rules get
//! dense indices ([`RuleId`]), match expressions become `Cond` trees in a
//! `Router`, durations become [`Duration`]s, status
//! codes [`StatusCode`]s and header names [`HeaderName`]s. Bad wire data is a
//! typed [`InvalidConfig`] that names the rule at fault, so the agent can NACK
//! it with the rule and keep its previous config. Nothing is filled in: the
//! compiler writes every value (`gov_proto::compiled`), and a config without
//! one, or with a kind, mode or enum value this agent does not know, is
//! refused.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as proto;
use http::{HeaderName, HeaderValue, Method, StatusCode};

use crate::route::{Cond, Router};

/// A validated, compiled `TargetConfig`.
#[derive(Debug)]
pub struct CompiledConfig {
    /// The service these rules protect.
    pub service: Arc<str>,
    /// Its domain (the key of `per domain` limits). Empty: none.
    pub domain: Arc<str>,
    /// The content hash the compiler set (empty for hand-made configs).
    pub version: Arc<str>,
    /// The header carrying the caller's identity.
    pub consumer_header: HeaderName,
    /// Every rule; `RuleId(i)` is `rules[i]`.
    pub rules: Vec<Rule>,
    pub(crate) inbound: Router,
    pub(crate) outbound: Router,
}

/// A dense index into [`CompiledConfig::rules`], valid for one config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u32);

/// One enforced rule.
#[derive(Debug)]
pub struct Rule {
    /// `service/rule`.
    pub name: Arc<str>,
    /// Where it was written.
    pub source: SourceRef,
    /// Which listener it applies to.
    pub direction: Direction,
    /// What it does.
    pub spec: RuleSpec,
    pub(crate) on: Cond,
}

/// Where a rule was written in the `.gov` sources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceRef {
    pub file: Arc<str>,
    pub line: u32,
    pub column: u32,
    pub snippet: Arc<str>,
}

/// Inbound (server side) or outbound (client side, `calls to X`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// The kind of a rule, for stats and commands: the wire's enum (kinds are
/// named once, in gov-proto, with their word, [`RuleKind::word`]).
pub use proto::RuleKind;

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
/// 0..=639 plus transport failures.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Classifier {
    pub(crate) statuses: [u64; 10],
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
}

/// Why a `TargetConfig` cannot be enforced.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum InvalidConfig {
    #[error("rule `{rule}`: {problem}")]
    #[diagnostic(
        code(gov::agent::invalid_rule),
        help("recompile the policy with `govc compile`; the compiler never emits this")
    )]
    Rule {
        /// `service/rule`.
        rule: String,
        /// Lowercase, no trailing period.
        problem: String,
    },
    #[error("rule `{rule}` is defined twice")]
    #[diagnostic(
        code(gov::agent::duplicate_rule),
        help("rule names must be unique per service")
    )]
    Duplicate { rule: String },
    #[error(
        "rule `{rule}`: `scope cluster` needs a shared counter store (Redis) and this agent has none: start it with `--redis URL`"
    )]
    #[diagnostic(
        code(gov::agent::no_cluster_store),
        help(
            "start the agent with `--redis URL` (or `GOV_REDIS`), or make the limit `scope local`"
        )
    )]
    NoClusterStore { rule: String },
    #[error("consumer header `{header}` is not a valid header name")]
    #[diagnostic(code(gov::agent::consumer_header))]
    ConsumerHeader { header: String },
    #[error("the config names no consumer header (`consumer_header` is empty)")]
    #[diagnostic(
        code(gov::agent::no_consumer_header),
        help(
            "compile the policy with `govc compile`: it always writes one (`x-gov-consumer` unless the service says `consumer from header`)"
        )
    )]
    NoConsumerHeader,
    #[error("the config has {count} rules, more than the agent supports ({max})")]
    #[diagnostic(code(gov::agent::too_many_rules))]
    TooManyRules { count: usize, max: usize },
}

impl InvalidConfig {
    /// The rule at fault (`service/rule`), for a NACK.
    pub fn rule(&self) -> Option<&str> {
        match self {
            InvalidConfig::Rule { rule, .. }
            | InvalidConfig::Duplicate { rule }
            | InvalidConfig::NoClusterStore { rule } => Some(rule),
            InvalidConfig::ConsumerHeader { .. }
            | InvalidConfig::NoConsumerHeader
            | InvalidConfig::TooManyRules { .. } => None,
        }
    }
}

/// Most rules one config may hold (rule ids are `u32`, and nobody writes more).
pub const MAX_RULES: usize = 1 << 20;

// === impl CompiledConfig ===

impl CompiledConfig {
    /// A config with no rules (everything is admitted).
    pub fn empty(service: &str) -> Self {
        Self {
            service: service.into(),
            domain: "".into(),
            version: "".into(),
            consumer_header: HeaderName::from_static(gov_proto::compiled::CONSUMER_HEADER),
            rules: Vec::new(),
            inbound: Router::default(),
            outbound: Router::default(),
        }
    }

    /// The rule called `name` (`service/rule`).
    pub fn rule_id(&self, name: &str) -> Option<RuleId> {
        self.rules
            .iter()
            .position(|r| &*r.name == name)
            .and_then(|i| u32::try_from(i).ok())
            .map(RuleId)
    }

    /// The rule with this id.
    pub fn rule(&self, id: RuleId) -> Option<&Rule> {
        self.rules.get(id.0 as usize)
    }
}

impl TryFrom<&proto::TargetConfig> for CompiledConfig {
    type Error = InvalidConfig;

    fn try_from(t: &proto::TargetConfig) -> Result<Self, InvalidConfig> {
        if t.consumer_header.is_empty() {
            return Err(InvalidConfig::NoConsumerHeader);
        }
        let consumer_header = HeaderName::from_bytes(
            t.consumer_header.to_ascii_lowercase().as_bytes(),
        )
        .map_err(|_| InvalidConfig::ConsumerHeader {
            header: t.consumer_header.clone(),
        })?;

        if t.rules.len() > MAX_RULES {
            return Err(InvalidConfig::TooManyRules {
                count: t.rules.len(),
                max: MAX_RULES,
            });
        }
        let rules = t.rules.iter().map(rule).collect::<Result<Vec<_>, _>>()?;
        let mut seen = HashSet::new();
        for r in &rules {
            if !seen.insert(r.name.clone()) {
                return Err(InvalidConfig::Duplicate {
                    rule: r.name.to_string(),
                });
            }
        }

        let inbound = Router::new(&rules, Direction::Inbound);
        let outbound = Router::new(&rules, Direction::Outbound);
        Ok(Self {
            service: t.service.as_str().into(),
            domain: t.domain.as_str().into(),
            version: t.version.as_str().into(),
            consumer_header,
            rules,
            inbound,
            outbound,
        })
    }
}

impl TryFrom<proto::TargetConfig> for CompiledConfig {
    type Error = InvalidConfig;

    fn try_from(t: proto::TargetConfig) -> Result<Self, InvalidConfig> {
        Self::try_from(&t)
    }
}

/// Names the rule in every error.
struct Ctx<'a> {
    rule: &'a str,
}

impl<'a> Ctx<'a> {
    fn new(rule: &'a str) -> Self {
        Self { rule }
    }

    fn err(&self, problem: impl Into<String>) -> InvalidConfig {
        InvalidConfig::Rule {
            rule: self.rule.to_string(),
            problem: problem.into(),
        }
    }

    /// The header of `r` with its `spec`.
    fn rule(&self, r: &proto::Rule, spec: RuleSpec) -> Result<Rule, InvalidConfig> {
        if self.rule.is_empty() {
            return Err(self.err("the rule has no name"));
        }
        match proto::Mode::try_from(r.mode) {
            Ok(proto::Mode::Enforce) => {}
            Ok(proto::Mode::Unspecified) => return Err(self.err("`mode` is missing")),
            Err(_) => {
                return Err(self.err(format!(
                    "mode {} is unknown to this agent (upgrade the agent, or apply the rule with mode enforce)",
                    r.mode
                )));
            }
        }
        let on = r.on.as_ref().ok_or_else(|| self.err("`on` is missing"))?;
        let on = self.cond(on, 0)?;
        let source = r
            .source
            .as_ref()
            .map(|s| SourceRef {
                file: s.file.as_str().into(),
                line: s.line,
                column: s.column,
                snippet: s.snippet.as_str().into(),
            })
            .unwrap_or_default();
        let direction = match proto::Direction::try_from(r.direction) {
            Ok(proto::Direction::Inbound) => Direction::Inbound,
            Ok(proto::Direction::Outbound) => Direction::Outbound,
            Err(_) => return Err(self.err(format!("direction {} is unknown", r.direction))),
        };
        Ok(Rule {
            name: self.rule.into(),
            source,
            direction,
            spec,
            on,
        })
    }

    fn cond(&self, e: &proto::MatchExpr, depth: usize) -> Result<Cond, InvalidConfig> {
        use proto::match_expr::Kind;
        // Deeply nested wire data must not overflow the stack.
        if depth > 64 {
            return Err(self.err("the match expression is nested deeper than 64 levels"));
        }
        let kind = e
            .kind
            .as_ref()
            .ok_or_else(|| self.err("a match expression is empty"))?;
        Ok(match kind {
            Kind::Path(p) => {
                if !p.value.starts_with('/') {
                    return Err(self.err(format!("path `{}` does not start with `/`", p.value)));
                }
                match self.known::<proto::PathKind>("path.kind", p.kind)? {
                    proto::PathKind::Exact => Cond::PathExact(p.value.as_str().into()),
                    proto::PathKind::Prefix => Cond::PathPrefix(p.value.as_str().into()),
                }
            }
            Kind::Method(m) => Cond::Method(
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| self.err(format!("`{m}` is not an HTTP method")))?,
            ),
            Kind::Header(h) => Cond::Header(
                HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes())
                    .map_err(|_| self.err(format!("`{}` is not a header name", h.name)))?,
                HeaderValue::from_str(&h.value)
                    .map_err(|_| self.err(format!("`{}` is not a header value", h.value)))?,
            ),
            Kind::Consumer(c) => Cond::Consumer(c.as_str().into()),
            Kind::CallsTo(s) => Cond::CallsTo(s.as_str().into()),
            Kind::Any(_) => Cond::Any,
            Kind::And(list) | Kind::Or(list) => {
                if list.exprs.is_empty() {
                    return Err(self.err("an `and`/`or` list is empty"));
                }
                let items = list
                    .exprs
                    .iter()
                    .map(|e| self.cond(e, depth + 1))
                    .collect::<Result<Vec<_>, _>>()?
                    .into_boxed_slice();
                if matches!(kind, Kind::And(_)) {
                    Cond::And(items)
                } else {
                    Cond::Or(items)
                }
            }
        })
    }

    /// An enum value this agent knows: an unknown one (from a newer
    /// compiler) is refused, never read as the enum's first value.
    fn known<E: TryFrom<i32>>(&self, field: &str, value: i32) -> Result<E, InvalidConfig> {
        E::try_from(value)
            .map_err(|_| self.err(format!("`{field}` {value} is unknown to this agent")))
    }

    fn positive_ms(&self, field: &str, ms: u64) -> Result<Duration, InvalidConfig> {
        if ms == 0 {
            return Err(self.err(format!("`{field}` must be > 0")));
        }
        Ok(Duration::from_millis(ms))
    }

    fn status(&self, code: u32) -> Result<StatusCode, InvalidConfig> {
        if code == 0 {
            return Err(self.err("`reject_status` is missing"));
        }
        u16::try_from(code)
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .filter(|s| s.as_u16() >= 200)
            .ok_or_else(|| self.err(format!("`reject_status` {code} is not an HTTP status")))
    }

    fn rate(&self, field: &str, r: &proto::Rate) -> Result<RateSpec, InvalidConfig> {
        if r.amount == 0 {
            return Err(self.err(format!("`{field}.amount` must be > 0")));
        }
        Ok(RateSpec {
            amount: r.amount,
            window: self.positive_ms(&format!("{field}.window_ms"), r.window_ms)?,
        })
    }
}

/// One wire rule: its kind's spec, then the shared header. The one place
/// that turns a `oneof spec` into a [`RuleSpec`].
fn rule(r: &proto::Rule) -> Result<Rule, InvalidConfig> {
    use proto::rule::Spec;
    let ctx = Ctx::new(&r.name);
    let spec = match &r.spec {
        Some(Spec::Bulkhead(b)) => RuleSpec::Bulkhead(bulkhead(&ctx, b)?),
        Some(Spec::Limit(l)) => RuleSpec::Limit(limit(&ctx, l)?),
        Some(Spec::Fuse(f)) => RuleSpec::Fuse(fuse(&ctx, f)?),
        None => {
            return Err(ctx.err(
                "the rule has no spec: its kind is missing, or one this agent does not know (upgrade the agent)",
            ));
        }
    };
    ctx.rule(r, spec)
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
    })
}

fn limit(ctx: &Ctx<'_>, l: &proto::Limit) -> Result<LimitSpec, InvalidConfig> {
    let calls = l.calls.as_ref().map(|r| ctx.rate("calls", r)).transpose()?;
    let bytes = l.bytes.as_ref().map(|r| ctx.rate("bytes", r)).transpose()?;
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
    out.connect_failure = c.connect_failure;
    out.timeout = c.timeout;
    out.reset = c.reset;
    Ok(out)
}
