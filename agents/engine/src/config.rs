//! The compiled config as the engine uses it, converted once from the wire
//! type (`gov_proto::v1::TargetConfig`) at the edge (the conversion is
//! `config/wire.rs`, the one place that reads the wire's rules).
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

use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as proto;
use http::{HeaderName, StatusCode};

use crate::route::{Cond, Router};
pub use crate::route::{Direction, RuleId};

mod wire;

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
