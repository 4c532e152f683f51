//! Why a wire config cannot be enforced ([`InvalidConfig`]), and the
//! checks every rule's conversion shares, each naming the rule at fault.

use std::time::Duration;

use http::StatusCode;

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
    #[error("the config's consumer source is unusable: {problem}")]
    #[diagnostic(
        code(gov::agent::consumer_source),
        help(
            "compile the policy with `govc compile`: it writes every field of `consumer from jwt`"
        )
    )]
    ConsumerSource { problem: String },
    #[error("the config's `paths` is {value}, a path dialect this agent does not know")]
    #[diagnostic(
        code(gov::agent::unknown_paths),
        help("upgrade the agent, or compile the policy without `paths`")
    )]
    Paths { value: i32 },
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
            | InvalidConfig::ConsumerSource { .. }
            | InvalidConfig::Paths { .. }
            | InvalidConfig::TooManyRules { .. } => None,
        }
    }
}

/// Names the rule in every error.
pub(crate) struct Ctx<'a> {
    pub(crate) rule: &'a str,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(rule: &'a str) -> Self {
        Self { rule }
    }

    pub(crate) fn err(&self, problem: impl Into<String>) -> InvalidConfig {
        InvalidConfig::Rule {
            rule: self.rule.to_string(),
            problem: problem.into(),
        }
    }

    /// An enum value this agent knows: an unknown one (from a newer
    /// compiler) is refused, never read as the enum's first value.
    pub(crate) fn known<E: TryFrom<i32>>(
        &self,
        field: &str,
        value: i32,
    ) -> Result<E, InvalidConfig> {
        E::try_from(value)
            .map_err(|_| self.err(format!("`{field}` {value} is unknown to this agent")))
    }

    pub(crate) fn positive_ms(&self, field: &str, ms: u64) -> Result<Duration, InvalidConfig> {
        if ms == 0 {
            return Err(self.err(format!("`{field}` must be > 0")));
        }
        Ok(Duration::from_millis(ms))
    }

    /// A rejection's gRPC code: `OK` (zero) stands for a missing one.
    pub(crate) fn grpc(&self, code: i32) -> Result<gov_proto::v1::GrpcCode, InvalidConfig> {
        if code == 0 {
            return Err(self.err("`reject_grpc_status` is missing"));
        }
        u32::try_from(code)
            .ok()
            .and_then(gov_proto::grpc::from_number)
            .ok_or_else(|| {
                self.err(format!(
                    "`reject_grpc_status` {code} is not a grpc status code"
                ))
            })
    }

    pub(crate) fn status(&self, code: u32) -> Result<StatusCode, InvalidConfig> {
        if code == 0 {
            return Err(self.err("`reject_status` is missing"));
        }
        u16::try_from(code)
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .filter(|s| s.as_u16() >= 200)
            .ok_or_else(|| self.err(format!("`reject_status` {code} is not an HTTP status")))
    }
}
