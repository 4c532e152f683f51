//! The words users read for the wire's enums, written once: the TUI, `govc`,
//! the engine's errors and the plan all take them from here. The rule
//! kinds' words, their list ([`RuleKind::RULES`]), the kind of each
//! `Rule.spec` ([`Spec::kind`]) and each kind's default refusal
//! ([`RuleKind::reject_status`], [`RuleKind::reject_grpc`]) are generated
//! by the build from `config.proto`, where a kind is declared. The other
//! defaults (a fuse's classes and recovery, a retry's outcomes), which the
//! compiler writes into every config, are here, with the same values for
//! what a hand-written spec leaves out ([`Spec::fill`]). A new kind touches
//! `config.proto` and nothing else in gov-proto, unless it has defaults
//! beyond its refusal.

use crate::v1::{
    ClusterSync, ErrorClass, Fuse, GrpcCode, LimitScope, Phase, Recovery, ReleaseKind, Retry,
    RuleKind, StatusRange, SyncState, recovery, rule::Spec,
};

include!(concat!(env!("OUT_DIR"), "/kinds.rs"));

/// Writes `kind`'s default refusal into a hand-written spec's zero ones.
fn fill_reject(kind: RuleKind, status: &mut u32, grpc: &mut i32) {
    if *status == 0 {
        *status = kind.reject_status();
    }
    if *grpc == GrpcCode::Ok as i32 {
        *grpc = kind.reject_grpc() as i32;
    }
}

impl Fuse {
    /// A fuse's business errors when it classifies none: status 500..=599.
    pub fn default_business() -> ErrorClass {
        ErrorClass {
            status: vec![StatusRange { from: 500, to: 599 }],
            ..ErrorClass::default()
        }
    }

    /// A fuse's system errors when it classifies none: connect failure,
    /// timeout and reset.
    pub fn default_system() -> ErrorClass {
        ErrorClass {
            connect_failure: true,
            timeout: true,
            reset: true,
            ..ErrorClass::default()
        }
    }

    /// A fuse's recovery when it says none: an operator releases it.
    pub fn default_recovery() -> Recovery {
        Recovery {
            kind: Some(recovery::Kind::Manual(true)),
        }
    }
}

impl Retry {
    /// The retried outcomes when a retry rule names none: connect failure,
    /// reset, status 502 and 503, and gRPC UNAVAILABLE.
    pub fn default_on() -> ErrorClass {
        ErrorClass {
            status: vec![StatusRange { from: 502, to: 503 }],
            connect_failure: true,
            reset: true,
            grpc_status: vec![GrpcCode::Unavailable as i32],
            ..ErrorClass::default()
        }
    }

    /// The first backoff and its cap when a retry rule says none: 25 ms up
    /// to 250 ms, with jitter (Envoy's defaults).
    pub const DEFAULT_BACKOFF_MS: (u64, u64) = (25, 250);

    /// The methods retried when a retry rule names none: the idempotent
    /// ones of RFC 9110 section 9.2.2 but TRACE.
    pub const DEFAULT_METHODS: [&str; 5] = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"];

    /// The most bytes of a request body a retried call holds to send again.
    pub const MAX_BUFFERED_BODY: u64 = 64 * 1024;
}

impl Spec {
    /// Writes the compiler's value into every setting of this spec a
    /// hand-written config left out (zero or absent), and keeps every
    /// written one: the per-kind part of [`crate::compiled::fill`]. The
    /// refusal of every kind that has one comes from config.proto; a kind
    /// with other defaults has its arm here.
    pub(crate) fn fill(&mut self) {
        self.fill_reject();
        match self {
            Spec::Limit(l)
                if l.scope() == LimitScope::Cluster
                    && l.sync() == ClusterSync::Exact
                    && l.sync_timeout_ms == 0 =>
            {
                l.sync_timeout_ms = crate::compiled::SYNC_EXACT_TIMEOUT_MS;
            }
            Spec::Retry(r) => {
                r.on.get_or_insert_with(Retry::default_on);
                if r.backoff_ms == 0 {
                    (r.backoff_ms, r.backoff_max_ms) = Retry::DEFAULT_BACKOFF_MS;
                    r.jitter = true;
                }
                if r.methods.is_empty() {
                    r.methods = Retry::DEFAULT_METHODS.map(String::from).to_vec();
                }
            }
            Spec::Fuse(f) => {
                f.business.get_or_insert_with(Fuse::default_business);
                f.system.get_or_insert_with(Fuse::default_system);
                f.recover.get_or_insert_with(Fuse::default_recovery);
                for class in [&mut f.business, &mut f.system].into_iter().flatten() {
                    for range in &mut class.status {
                        if range.to == 0 {
                            range.to = range.from;
                        }
                    }
                }
            }
            // A kind whose only default is its refusal (above), or a spec
            // that already has its values.
            _ => {}
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
    /// Every state an agent can be in (all but `Unspecified`): what govd's
    /// `/metrics` counts, so that a new state cannot be left out.
    pub const STATES: [SyncState; 5] = [
        SyncState::Synced,
        SyncState::Unsaved,
        SyncState::Stale,
        SyncState::Nacked,
        SyncState::Disconnected,
    ];

    /// `SYNCED`, `UNSAVED`, `STALE`, `NACKED`, `DISCONNECTED`; `UNKNOWN` when
    /// unset. The words of `istioctl proxy-status` (and `UNSAVED`: enforced, not
    /// saved), in `govc`, the TUI and govd's `/metrics`.
    pub fn word(self) -> &'static str {
        match self {
            SyncState::Synced => "SYNCED",
            SyncState::Unsaved => "UNSAVED",
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

    /// The generated lists follow the oneof, and the words and refusals
    /// the kinds had when they were written by hand.
    #[test]
    fn the_generated_kinds_are_the_oneofs() {
        use crate::v1::{Bulkhead, Fuse, Limit, Retry, Rule};
        let specs = [
            Spec::Bulkhead(Bulkhead::default()),
            Spec::Limit(Limit::default()),
            Spec::Fuse(Fuse::default()),
            Spec::Retry(Retry::default()),
        ];
        let kinds: Vec<RuleKind> = specs.iter().map(Spec::kind).collect();
        assert_eq!(kinds[..], RuleKind::RULES[..kinds.len()]);
        assert_eq!(Rule::default().kind(), RuleKind::Unspecified);
        let words: Vec<&str> = kinds.iter().map(|k| k.word()).collect();
        assert_eq!(words, ["bulkhead", "limit", "fuse", "retry"]);
        assert_eq!(RuleKind::Service.word(), "service");
        assert_eq!(RuleKind::Unspecified.word(), "-");
        let refusals: Vec<(u32, GrpcCode)> = kinds
            .iter()
            .map(|k| (k.reject_status(), k.reject_grpc()))
            .collect();
        assert_eq!(
            refusals,
            [
                (408, GrpcCode::Unavailable),
                (429, GrpcCode::ResourceExhausted),
                (503, GrpcCode::Unavailable),
                (0, GrpcCode::Ok),
            ]
        );
    }

    #[test]
    fn every_kind_has_a_distinct_word() {
        // 4 is reserved (the old unproducible timeout kind).
        let words: Vec<&str> = (0..=64)
            .filter_map(|n| RuleKind::try_from(n).ok())
            .map(RuleKind::word)
            .collect();
        assert!(words.len() >= 9, "{words:?}");
        let mut unique = words.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), words.len(), "{words:?}");
    }

    /// A kind refuses with both a status and a code, or with neither
    /// (a retry rule); what is not a rule refuses nothing.
    #[test]
    fn every_rule_kind_has_reject_defaults() {
        for kind in RuleKind::RULES {
            let status = kind.reject_status();
            assert!(
                status == 0 || (400..=599).contains(&status),
                "{}",
                kind.word()
            );
            assert_eq!(
                status == 0,
                kind.reject_grpc() == GrpcCode::Ok,
                "{}",
                kind.word()
            );
        }
        assert_eq!(RuleKind::Match.reject_status(), 0);
        assert_eq!(RuleKind::Service.reject_grpc(), GrpcCode::Ok);
    }
}
