//! The semantic checks and lints, one per file (the model is ruff: one rule,
//! one file, one doc, one fixture).
//!
//! Every check reads the resolved `Ctx` and pushes diagnostics; none stops
//! the others, so `check` reports every mistake at once. Each module's doc
//! says what it catches, why it matters, an example and the fix; the same
//! text is in `docs/checks.md`.

use crate::diagnostic::Diagnostic;
use crate::resolve::Ctx;

pub mod adaptive_over_workers;
pub mod adaptive_range;
pub mod algorithm_mismatch;
pub mod bulkhead_over_workers;
pub mod burst_above_rate;
pub mod cluster_limit_inconsistent;
pub mod cluster_sync;
pub mod codel_target;
pub mod conflicting_paths;
pub mod conflicting_rules;
pub mod consumers_before_ready;
pub mod criticality_unused;
pub mod drain_after_stop;
pub mod duplicate_match;
pub mod duplicate_registry;
pub mod duplicate_rule;
pub mod duplicate_service;
pub mod duplicate_setting;
pub mod expired_rule;
pub mod fixed_wait;
pub mod fuse_counts_retries;
pub mod grpc_name;
pub mod grpc_status;
pub mod invalid_outlier;
pub mod invalid_peer;
pub mod key_attribute;
pub mod key_cap;
pub mod latch_outlives_rule;
pub mod limit_share_scope;
pub mod match_cycle;
pub mod missing_field;
pub mod mixed_direction;
pub mod non_positive;
pub mod outlier_not_called;
pub mod path_not_normal;
pub mod per_instance_inbound;
pub mod percent_range;
pub mod queueing_bulkhead;
pub mod retry_amplification;
pub mod retry_budget;
pub mod retry_inbound;
pub mod retry_non_idempotent;
pub mod retry_outlasts_timeout;
pub mod shadow_exact;
pub mod shape_inbound;
pub mod share_unknown_consumer;
pub mod share_weights;
pub mod share_with_queue;
pub mod share_without_consumer;
pub mod shutdown_wait;
pub mod slow_above_timeout;
pub mod slow_within_latency;
pub mod slower_than;
pub mod status_code;
pub mod threshold_kind;
pub mod too_large;
pub mod unknown_match;
pub mod unknown_method;
pub mod unknown_paths;
pub mod unknown_registry;
pub mod unknown_service;
pub mod unreachable_min_calls;
pub mod unverified_consumer;
pub mod warmup_scale_cluster;
pub mod warmup_without_ramp;

/// Every stable code, errors then lints. Each has a fixture
/// (`tests/fixtures/<name>.gov`) and an entry in `docs/checks.md`.
pub const CODES: &[&str] = &[
    "gov::unknown-match",
    "gov::unknown-service",
    "gov::unknown-registry",
    "gov::unknown-method",
    "gov::unknown-paths",
    "gov::conflicting-paths",
    "gov::unknown-grpc-status",
    "gov::invalid-grpc-name",
    "gov::path-not-normal",
    "gov::invalid-peer",
    "gov::duplicate-service",
    "gov::duplicate-registry",
    "gov::duplicate-match",
    "gov::duplicate-rule",
    "gov::duplicate-setting",
    "gov::missing-field",
    "gov::non-positive",
    "gov::too-large",
    "gov::key-cap",
    "gov::key-attribute",
    "gov::percent-out-of-range",
    "gov::threshold-kind",
    "gov::slower-than",
    "gov::invalid-status",
    "gov::cluster-sync-undeclared",
    "gov::shape-on-inbound",
    "gov::warmup-scale-cluster",
    "gov::burst-above-rate",
    "gov::algorithm-mismatch",
    "gov::shadow-exact-limit",
    "gov::per-instance-on-inbound",
    "gov::retry-without-budget",
    "gov::retry-on-inbound",
    "gov::mixed-direction",
    "gov::match-cycle",
    "gov::conflicting-rules",
    "gov::invalid-outlier",
    "gov::adaptive-range",
    "gov::adaptive-over-workers",
    "gov::share-weights",
    "gov::limit-share-scope",
    "gov::share-without-consumer",
    "gov::share-with-queue",
    "gov::lint::bulkhead-over-workers",
    "gov::lint::queueing-bulkhead",
    "gov::codel-target",
    "gov::lint::criticality-unused",
    "gov::lint::shutdown-wait",
    "gov::lint::fixed-wait",
    "gov::lint::drain-after-stop",
    "gov::lint::consumers-before-ready",
    "gov::lint::unreachable-min-calls",
    "gov::lint::slow-above-timeout",
    "gov::lint::slow-within-latency",
    "gov::lint::cluster-limit-inconsistent",
    "gov::lint::unverified-consumer",
    "gov::lint::expired-rule",
    "gov::lint::latch-outlives-rule",
    "gov::lint::warmup-without-ramp",
    "gov::lint::retry-amplification",
    "gov::lint::retry-outlasts-timeout",
    "gov::lint::retry-non-idempotent",
    "gov::lint::fuse-counts-retries",
    "gov::lint::outlier-not-called",
    "gov::lint::share-unknown-consumer",
];

/// A check: reads the context, reports what it finds.
type Check = fn(&Ctx<'_>, &mut Vec<Diagnostic>);

/// Errors first, then lints; each list in a fixed order.
const CHECKS: &[Check] = &[
    duplicate_registry::check,
    duplicate_service::check,
    duplicate_match::check,
    duplicate_rule::check,
    duplicate_setting::check,
    unknown_registry::check,
    unknown_service::check,
    unknown_match::check,
    match_cycle::check,
    unknown_method::check,
    unknown_paths::check,
    conflicting_paths::check,
    grpc_status::check,
    grpc_name::check,
    path_not_normal::check,
    invalid_peer::check,
    missing_field::check,
    non_positive::check,
    too_large::check,
    key_cap::check,
    key_attribute::check,
    percent_range::check,
    threshold_kind::check,
    slower_than::check,
    status_code::check,
    cluster_sync::check,
    mixed_direction::check,
    shape_inbound::check,
    warmup_scale_cluster::check,
    burst_above_rate::check,
    algorithm_mismatch::check,
    shadow_exact::check,
    per_instance_inbound::check,
    retry_budget::check,
    retry_inbound::check,
    conflicting_rules::check,
    invalid_outlier::check,
    adaptive_range::check,
    adaptive_over_workers::check,
    share_weights::check,
    limit_share_scope::check,
    share_without_consumer::check,
    share_with_queue::check,
    bulkhead_over_workers::check,
    queueing_bulkhead::check,
    codel_target::check,
    criticality_unused::check,
    shutdown_wait::check,
    fixed_wait::check,
    drain_after_stop::check,
    consumers_before_ready::check,
    unreachable_min_calls::check,
    slow_above_timeout::check,
    slow_within_latency::check,
    cluster_limit_inconsistent::check,
    unverified_consumer::check,
    expired_rule::check,
    latch_outlives_rule::check,
    warmup_without_ramp::check,
    retry_amplification::check,
    retry_outlasts_timeout::check,
    retry_non_idempotent::check,
    fuse_counts_retries::check,
    outlier_not_called::check,
    share_unknown_consumer::check,
];

/// Runs every check.
pub(crate) fn run(cx: &Ctx<'_>, out: &mut Vec<Diagnostic>) {
    for check in CHECKS {
        check(cx, out);
    }
}
