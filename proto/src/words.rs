//! The words users read for the wire's enums, written once: the TUI, `govc`,
//! the engine's errors and the plan all take them from here. The rule kinds
//! are named here once: their word, the list of them ([`RuleKind::RULES`]),
//! the kind of each `Rule.spec` ([`Spec::kind`]), each kind's defaults
//! ([`RuleKind::reject_status`], [`RuleKind::reject_grpc`], a fuse's
//! classes and recovery), which the compiler writes into every config, and
//! the same values for what a hand-written spec leaves out ([`Spec::fill`]).
//! A new kind touches `config.proto` and this file, nothing else in
//! gov-proto.

use crate::v1::{
    ClusterSync, ErrorClass, Fuse, GrpcCode, LimitScope, Phase, Recovery, ReleaseKind, Retry,
    RuleKind, StatusRange, SyncState, recovery, rule::Spec,
};

impl RuleKind {
    /// The kinds a `Rule` can be (its `spec`), in the order of the oneof.
    /// The one list of rule kinds: what loops over every kind (tests,
    /// generated docs) takes it from here.
    pub const RULES: [RuleKind; 4] = [
        RuleKind::Bulkhead,
        RuleKind::Limit,
        RuleKind::Fuse,
        RuleKind::Retry,
    ];

    /// The keyword of the kind in `.gov` text (`bulkhead`, `limit`, ...);
    /// `service` for a service's own settings, `-` when unspecified.
    pub fn word(self) -> &'static str {
        match self {
            RuleKind::Bulkhead => "bulkhead",
            RuleKind::Limit => "limit",
            RuleKind::Fuse => "fuse",
            RuleKind::Retry => "retry",
            RuleKind::Match => "match",
            RuleKind::Warmup => "warmup",
            RuleKind::Shutdown => "shutdown",
            RuleKind::Service => "service",
            RuleKind::Unspecified => "-",
        }
    }

    /// The HTTP status a rule of this kind refuses a call with when its
    /// text names none (`reject with`); 0 for what refuses nothing.
    pub const fn reject_status(self) -> u32 {
        match self {
            // 408 Request Timeout: no permit came within `max_wait`.
            RuleKind::Bulkhead => 408,
            // 429 Too Many Requests.
            RuleKind::Limit => 429,
            // 503 Service Unavailable.
            RuleKind::Fuse => 503,
            // A retry rule refuses no call: a retry its budget cannot pay
            // is not sent, and the call ends with its attempt's outcome.
            RuleKind::Retry
            | RuleKind::Match
            | RuleKind::Warmup
            | RuleKind::Shutdown
            | RuleKind::Service
            | RuleKind::Unspecified => 0,
        }
    }

    /// The gRPC code a rule of this kind refuses a gRPC call with when its
    /// text names none; `OK` for what refuses nothing.
    pub const fn reject_grpc(self) -> GrpcCode {
        match self {
            // Retryable, as a full server's answer is.
            RuleKind::Bulkhead => GrpcCode::Unavailable,
            // A quota.
            RuleKind::Limit => GrpcCode::ResourceExhausted,
            RuleKind::Fuse => GrpcCode::Unavailable,
            RuleKind::Retry
            | RuleKind::Match
            | RuleKind::Warmup
            | RuleKind::Shutdown
            | RuleKind::Service
            | RuleKind::Unspecified => GrpcCode::Ok,
        }
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
    /// The kind of rule this spec makes.
    pub fn kind(&self) -> RuleKind {
        match self {
            Spec::Bulkhead(_) => RuleKind::Bulkhead,
            Spec::Limit(_) => RuleKind::Limit,
            Spec::Fuse(_) => RuleKind::Fuse,
            Spec::Retry(_) => RuleKind::Retry,
        }
    }

    /// Writes the compiler's value into every setting of this spec a
    /// hand-written config left out (zero or absent), and keeps every
    /// written one: the per-kind part of [`crate::compiled::fill`].
    pub(crate) fn fill(&mut self) {
        let kind = self.kind();
        let reject = |s: &mut u32, g: &mut i32| {
            if *s == 0 {
                *s = kind.reject_status();
            }
            if *g == GrpcCode::Ok as i32 {
                *g = kind.reject_grpc() as i32;
            }
        };
        match self {
            Spec::Bulkhead(b) => reject(&mut b.reject_status, &mut b.reject_grpc_status),
            Spec::Limit(l) => {
                reject(&mut l.reject_status, &mut l.reject_grpc_status);
                if l.scope() == LimitScope::Cluster
                    && l.sync() == ClusterSync::Exact
                    && l.sync_timeout_ms == 0
                {
                    l.sync_timeout_ms = crate::compiled::SYNC_EXACT_TIMEOUT_MS;
                }
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
                reject(&mut f.reject_status, &mut f.reject_grpc_status);
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

    /// `RuleKind::RULES` lists every kind of `Rule.spec`, in the oneof's
    /// order: a new kind's spec goes here, beside its word.
    #[test]
    fn every_rule_kind_has_its_spec() {
        use crate::v1::{Bulkhead, Fuse, Limit, Retry, Rule};
        let specs = [
            Spec::Bulkhead(Bulkhead::default()),
            Spec::Limit(Limit::default()),
            Spec::Fuse(Fuse::default()),
            Spec::Retry(Retry::default()),
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
        assert_eq!(words.len(), 9);
        let mut unique = words.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), words.len(), "{words:?}");
    }

    /// Every rule kind that refuses calls refuses with a status and a code
    /// of its own choosing (the compiler writes them; `Spec::fill` gives
    /// them to hand-written configs); what is not a rule, or a retry rule,
    /// refuses nothing.
    #[test]
    fn every_rule_kind_has_reject_defaults() {
        for kind in RuleKind::RULES
            .into_iter()
            .filter(|k| *k != RuleKind::Retry)
        {
            assert!(
                (400..=599).contains(&kind.reject_status()),
                "{}",
                kind.word()
            );
            assert_ne!(kind.reject_grpc(), GrpcCode::Ok, "{}", kind.word());
        }
        assert_eq!(RuleKind::Match.reject_status(), 0);
        assert_eq!(RuleKind::Service.reject_grpc(), GrpcCode::Ok);
        assert_eq!(RuleKind::Retry.reject_status(), 0);
    }
}
