//! The words users read for the wire's enums, written once: the TUI, `govc`,
//! the engine's errors and the plan all take them from here. The rule kinds
//! are named here once: their word, the list of them ([`RuleKind::RULES`]),
//! the kind of each `Rule.spec` ([`Spec::kind`]) and the compiler's values
//! for what a hand-written spec leaves out ([`Spec::fill`]). A new kind
//! touches `config.proto` and this file, nothing else in gov-proto.

use crate::compiled::{
    BULKHEAD_REJECT_GRPC, BULKHEAD_REJECT_STATUS, FUSE_REJECT_GRPC, FUSE_REJECT_STATUS,
    LIMIT_REJECT_GRPC, LIMIT_REJECT_STATUS, business_errors, manual_recovery, system_errors,
};
use crate::v1::{GrpcCode, Phase, ReleaseKind, RuleKind, SyncState, rule::Spec};

impl RuleKind {
    /// The kinds a `Rule` can be (its `spec`), in the order of the oneof.
    /// The one list of rule kinds: what loops over every kind (tests,
    /// generated docs) takes it from here.
    pub const RULES: [RuleKind; 3] = [RuleKind::Bulkhead, RuleKind::Limit, RuleKind::Fuse];

    /// The keyword of the kind in `.gov` text (`bulkhead`, `limit`, ...);
    /// `service` for a service's own settings, `-` when unspecified.
    pub fn word(self) -> &'static str {
        match self {
            RuleKind::Bulkhead => "bulkhead",
            RuleKind::Limit => "limit",
            RuleKind::Fuse => "fuse",
            RuleKind::Match => "match",
            RuleKind::Warmup => "warmup",
            RuleKind::Shutdown => "shutdown",
            RuleKind::Service => "service",
            RuleKind::Unspecified => "-",
        }
    }
}

impl Spec {
    /// The kind of rule this spec makes.
    pub fn kind(&self) -> RuleKind {
        match self {
            Spec::Bulkhead(_) => RuleKind::Bulkhead,
            Spec::Limit(_) => RuleKind::Limit,
            Spec::Fuse(_) => RuleKind::Fuse,
        }
    }

    /// Writes the compiler's value into every setting of this spec a
    /// hand-written config left out (zero or absent), and keeps every
    /// written one: the per-kind part of [`crate::compiled::fill`].
    pub(crate) fn fill(&mut self) {
        let status = |s: &mut u32, value: u32| {
            if *s == 0 {
                *s = value;
            }
        };
        let grpc = |s: &mut i32, value: GrpcCode| {
            if *s == GrpcCode::Ok as i32 {
                *s = value as i32;
            }
        };
        match self {
            Spec::Bulkhead(b) => {
                status(&mut b.reject_status, BULKHEAD_REJECT_STATUS);
                grpc(&mut b.reject_grpc_status, BULKHEAD_REJECT_GRPC);
            }
            Spec::Limit(l) => {
                status(&mut l.reject_status, LIMIT_REJECT_STATUS);
                grpc(&mut l.reject_grpc_status, LIMIT_REJECT_GRPC);
            }
            Spec::Fuse(f) => {
                status(&mut f.reject_status, FUSE_REJECT_STATUS);
                grpc(&mut f.reject_grpc_status, FUSE_REJECT_GRPC);
                f.business.get_or_insert_with(business_errors);
                f.system.get_or_insert_with(system_errors);
                f.recover.get_or_insert_with(manual_recovery);
                for class in [&mut f.business, &mut f.system].into_iter().flatten() {
                    for range in &mut class.status {
                        if range.to == 0 {
                            range.to = range.from;
                        }
                    }
                }
            }
        }
    }
}

impl ReleaseKind {
    /// `fuse` or `limit`, as in `govc release fuse RULE`.
    pub fn word(self) -> &'static str {
        match self {
            ReleaseKind::Fuse => RuleKind::Fuse.word(),
            ReleaseKind::Limit => RuleKind::Limit.word(),
        }
    }
}

impl Phase {
    /// `STARTING`, `WARMING`, `READY`, `DRAINING`, `STOPPED`; `-` when unknown.
    /// The same words in `govc status`, the TUI and the demo's summary.
    pub fn word(self) -> &'static str {
        match self {
            Phase::Unspecified => "-",
            Phase::Starting => "STARTING",
            Phase::Warming => "WARMING",
            Phase::Ready => "READY",
            Phase::Draining => "DRAINING",
            Phase::Stopped => "STOPPED",
        }
    }
}

impl SyncState {
    /// `SYNCED`, `STALE`, `NACKED`, `DISCONNECTED`; `UNKNOWN` when unset. The words
    /// of `istioctl proxy-status`, in `govc`, the TUI and govd's `/metrics`.
    pub fn word(self) -> &'static str {
        match self {
            SyncState::Synced => "SYNCED",
            SyncState::Stale => "STALE",
            SyncState::Nacked => "NACKED",
            SyncState::Disconnected => "DISCONNECTED",
            SyncState::Unspecified => "UNKNOWN",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RuleKind::RULES` lists every kind of `Rule.spec`, in the oneof's
    /// order: a new kind's spec goes here, beside its word.
    #[test]
    fn every_rule_kind_has_its_spec() {
        use crate::v1::{Bulkhead, Fuse, Limit, Rule};
        let specs = [
            Spec::Bulkhead(Bulkhead::default()),
            Spec::Limit(Limit::default()),
            Spec::Fuse(Fuse::default()),
        ];
        let kinds: Vec<RuleKind> = specs.iter().map(Spec::kind).collect();
        assert_eq!(kinds, RuleKind::RULES);
        assert_eq!(Rule::default().kind(), RuleKind::Unspecified);
    }

    #[test]
    fn every_kind_has_a_distinct_word() {
        // 4 is reserved (the old unproducible timeout kind).
        let words: Vec<&str> = (0..=16)
            .filter_map(|n| RuleKind::try_from(n).ok())
            .map(RuleKind::word)
            .collect();
        assert_eq!(words.len(), 8);
        let mut unique = words.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), words.len(), "{words:?}");
    }
}
