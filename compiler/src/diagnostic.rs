//! The diagnostics of the compiler: one enum over small structs.
//!
//! Each struct lives in the check that produces it (`check/*.rs`) and has a
//! stable code, a lowercase message, a label on the exact text, a help line,
//! and the source with its file name. Lints are warnings
//! (`severity(Warning)`); everything else is an error.

use miette::{Diagnostic as _, Severity};
use thiserror::Error;

use crate::check::{
    adaptive_over_workers, adaptive_range, algorithm_mismatch, bulkhead_over_workers,
    burst_above_rate, cluster_limit_inconsistent, cluster_sync, codel_target, conflicting_paths,
    conflicting_rules, consumers_before_ready, criticality_unused, drain_after_stop,
    duplicate_match, duplicate_registry, duplicate_rule, duplicate_service, duplicate_setting,
    expired_rule, fixed_wait, fuse_counts_retries, grpc_name, grpc_status, invalid_outlier,
    invalid_peer, key_attribute, key_cap, latch_outlives_rule, limit_share_scope, match_cycle,
    missing_field, mixed_direction, non_positive, outlier_not_called, path_not_normal,
    per_instance_inbound, percent_range, queueing_bulkhead, retry_amplification, retry_budget,
    retry_inbound, retry_non_idempotent, retry_outlasts_timeout, shadow_exact, shape_inbound,
    share_unknown_consumer, share_weights, share_with_queue, share_without_consumer, shutdown_wait,
    slow_above_timeout, slow_within_latency, slower_than, status_code, threshold_kind, too_large,
    unknown_match, unknown_method, unknown_paths, unknown_registry, unknown_service,
    unreachable_min_calls, unverified_consumer, warmup_scale_cluster, warmup_without_ramp,
};
use crate::resolve::Src;

macro_rules! diagnostics {
    ($($(#[$doc:meta])* $variant:ident($ty:ty),)*) => {
        /// Every diagnostic `check` can report: syntax errors, semantic
        /// errors and lint warnings.
        #[derive(Debug, Error, miette::Diagnostic)]
        pub enum Diagnostic {
            /// A file did not parse.
            #[error(transparent)]
            #[diagnostic(transparent)]
            Syntax(Box<gov_lang::SyntaxError>),
            $(
                $(#[$doc])*
                #[error(transparent)]
                #[diagnostic(transparent)]
                $variant($ty),
            )*
        }

        impl Diagnostic {
            /// The file a semantic diagnostic points into (`None` for syntax errors).
            pub(crate) fn src(&self) -> Option<&Src> {
                match self {
                    Diagnostic::Syntax(_) => None,
                    $(Diagnostic::$variant(d) => Some(&d.src),)*
                }
            }
        }

        $(
            impl From<$ty> for Diagnostic {
                fn from(d: $ty) -> Self {
                    Diagnostic::$variant(d)
                }
            }
        )*
    };
}

diagnostics! {
    UnknownMatch(unknown_match::UnknownMatch),
    UnknownService(unknown_service::UnknownService),
    UnknownRegistry(unknown_registry::UnknownRegistry),
    UnknownMethod(unknown_method::UnknownMethod),
    UnknownPaths(unknown_paths::UnknownPaths),
    ConflictingPaths(conflicting_paths::ConflictingPaths),
    UnknownGrpcStatus(grpc_status::UnknownGrpcStatus),
    InvalidGrpcName(grpc_name::InvalidGrpcName),
    PathNotNormal(path_not_normal::PathNotNormal),
    InvalidPeer(invalid_peer::InvalidPeer),
    DuplicateService(duplicate_service::DuplicateService),
    DuplicateRegistry(duplicate_registry::DuplicateRegistry),
    DuplicateMatch(duplicate_match::DuplicateMatch),
    DuplicateRule(duplicate_rule::DuplicateRule),
    DuplicateSetting(duplicate_setting::DuplicateSetting),
    MissingField(missing_field::MissingField),
    NonPositive(non_positive::NonPositive),
    TooLarge(too_large::TooLarge),
    KeyCapUnkeyed(key_cap::Unkeyed),
    KeyCapTooMany(key_cap::TooManyKeys),
    KeyAttribute(key_attribute::KeyAttribute),
    PercentOutOfRange(percent_range::PercentOutOfRange),
    ThresholdKind(threshold_kind::ThresholdKind),
    SlowerThan(slower_than::SlowerThan),
    InvalidStatus(status_code::InvalidStatus),
    ClusterSyncUndeclared(cluster_sync::ClusterSyncUndeclared),
    ShapeOnInbound(shape_inbound::ShapeOnInbound),
    WarmupScaleCluster(warmup_scale_cluster::WarmupScaleCluster),
    BurstAboveRate(burst_above_rate::BurstAboveRate),
    AlgorithmMismatch(algorithm_mismatch::AlgorithmMismatch),
    ShadowExactLimit(shadow_exact::ShadowExactLimit),
    PerInstanceOnInbound(per_instance_inbound::PerInstanceOnInbound),
    RetryWithoutBudget(retry_budget::RetryWithoutBudget),
    RetryOnInbound(retry_inbound::RetryOnInbound),
    MixedDirection(mixed_direction::MixedDirection),
    MatchCycle(match_cycle::MatchCycle),
    ConflictingRules(conflicting_rules::ConflictingRules),
    InvalidOutlier(invalid_outlier::InvalidOutlier),
    AdaptiveRange(adaptive_range::AdaptiveRange),
    AdaptiveOverWorkers(adaptive_over_workers::AdaptiveOverWorkers),
    ShareWeights(share_weights::ShareWeights),
    LimitShareScope(limit_share_scope::LimitShareScope),
    ShareWithoutConsumer(share_without_consumer::ShareWithoutConsumer),
    ShareWithQueue(share_with_queue::ShareWithQueue),
    BulkheadOverWorkers(bulkhead_over_workers::BulkheadOverWorkers),
    QueueingBulkhead(queueing_bulkhead::QueueingBulkhead),
    CodelTarget(codel_target::CodelTarget),
    CriticalityUnused(criticality_unused::CriticalityUnused),
    RetryAmplification(retry_amplification::RetryAmplification),
    RetryOutlastsTimeout(retry_outlasts_timeout::RetryOutlastsTimeout),
    RetryNonIdempotent(retry_non_idempotent::RetryNonIdempotent),
    FuseCountsRetries(fuse_counts_retries::FuseCountsRetries),
    ShutdownWait(shutdown_wait::ShutdownWait),
    FixedWait(fixed_wait::FixedWait),
    DrainAfterStop(drain_after_stop::DrainAfterStop),
    ConsumersBeforeReady(consumers_before_ready::ConsumersBeforeReady),
    UnreachableMinCalls(unreachable_min_calls::UnreachableMinCalls),
    SlowAboveTimeout(slow_above_timeout::SlowAboveTimeout),
    SlowWithinLatency(slow_within_latency::SlowWithinLatency),
    ClusterLimitInconsistent(cluster_limit_inconsistent::ClusterLimitInconsistent),
    UnverifiedConsumer(unverified_consumer::UnverifiedConsumer),
    ExpiredRule(expired_rule::ExpiredRule),
    LatchOutlivesRule(latch_outlives_rule::LatchOutlivesRule),
    WarmupWithoutRamp(warmup_without_ramp::WarmupWithoutRamp),
    OutlierNotCalled(outlier_not_called::OutlierNotCalled),
    ShareUnknownConsumer(share_unknown_consumer::ShareUnknownConsumer),
}

impl From<gov_lang::SyntaxError> for Diagnostic {
    fn from(e: gov_lang::SyntaxError) -> Self {
        Diagnostic::Syntax(Box::new(e))
    }
}

impl Diagnostic {
    /// Warnings (lints) never block unless the caller asks for it.
    pub fn is_warning(&self) -> bool {
        matches!(self.severity(), Some(Severity::Warning | Severity::Advice))
    }

    pub fn is_error(&self) -> bool {
        !self.is_warning()
    }

    /// Where the diagnostic starts in its file: its first label.
    pub(crate) fn offset(&self) -> usize {
        self.labels()
            .and_then(|labels| labels.map(|l| l.offset()).min())
            .unwrap_or(0)
    }

    /// The stable code, e.g. `gov::unknown-match`.
    pub fn code_str(&self) -> String {
        self.code().map(|c| c.to_string()).unwrap_or_default()
    }
}

/// Every diagnostic of one run, errors and warnings, in a stable order.
#[derive(Debug, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diagnostic::is_error)
    }

    pub fn error_count(&self) -> usize {
        self.0.iter().filter(|d| d.is_error()).count()
    }

    pub fn warning_count(&self) -> usize {
        self.0.iter().filter(|d| d.is_warning()).count()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl std::fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} error(s), {} warning(s)",
            self.error_count(),
            self.warning_count()
        )
    }
}

impl std::error::Error for Diagnostics {}
