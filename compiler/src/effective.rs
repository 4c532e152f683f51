//! The effective settings of a rule: what is written, with defaults
//! applied. Shared by the checks that compare rules and by the lowering.
//!
//! When a setting is given twice (an error of its own), the first wins.

use gov_lang::ast::{
    Bulkhead, BulkheadKey, BulkheadSetting, ClassifyItem, ClusterSync, ErrorClass, Fuse,
    FuseSetting, Isolation, Limit, LimitAction, LimitKey, LimitScope, LimitSetting, Recover,
    Release, Span, Trip,
};
use gov_proto::compiled;

use crate::units::{bytes, fmt_millis, millis};

// The defaults are gov-proto's, written once for the compiler and for
// hand-written configs; agents never fill them in.
pub(crate) const BULKHEAD_REJECT: i64 = compiled::BULKHEAD_REJECT_STATUS as i64;
pub(crate) const LIMIT_REJECT: i64 = compiled::LIMIT_REJECT_STATUS as i64;
pub(crate) const FUSE_REJECT: i64 = compiled::FUSE_REJECT_STATUS as i64;

pub(crate) struct BulkheadEff {
    pub max_concurrent: Option<(i64, Span)>,
    /// Default 0: fail fast.
    pub max_wait_ms: i64,
    pub max_wait_span: Option<Span>,
    pub queue: Option<i64>,
    pub timeout_ms: Option<i64>,
    pub reject: i64,
    pub per: BulkheadKey,
    pub isolation: Isolation,
}

/// `amount per window`, in calls or bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counter {
    pub amount: i64,
    pub window_ms: i64,
    pub span: Span,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Scope {
    Local,
    ClusterExact,
    ClusterBatch(i64),
    ClusterUndeclared,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ActionEff {
    Reject,
    Shape(i64),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ReleaseEff {
    /// No latching: the counter resets every window.
    Window,
    After(i64),
    Manual,
}

pub(crate) struct LimitEff {
    pub calls: Option<Counter>,
    pub bytes: Option<Counter>,
    pub per: LimitKey,
    pub action: ActionEff,
    pub reject: i64,
    pub release: ReleaseEff,
    pub scope: Scope,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RecoverEff {
    Manual,
    After { after_ms: i64, probes: i64 },
}

pub(crate) struct FuseEff<'a> {
    pub trips: Vec<&'a Trip>,
    /// `None`: the default classification applies.
    pub business: Option<&'a [ClassifyItem]>,
    pub system: Option<&'a [ClassifyItem]>,
    pub recover: RecoverEff,
    pub reject: i64,
}

impl BulkheadEff {
    pub fn of(b: &Bulkhead) -> Self {
        let mut e = BulkheadEff {
            max_concurrent: None,
            max_wait_ms: 0,
            max_wait_span: None,
            queue: None,
            timeout_ms: None,
            reject: BULKHEAD_REJECT,
            per: BulkheadKey::Operation,
            isolation: Isolation::Semaphore,
        };
        for s in b.settings.iter().rev() {
            // Reversed so that the first occurrence is applied last and wins.
            match s {
                BulkheadSetting::MaxConcurrent { value, .. } => {
                    e.max_concurrent = Some((value.node, value.span));
                }
                BulkheadSetting::MaxWait { value, .. } => {
                    e.max_wait_ms = millis(&value.node);
                    e.max_wait_span = Some(value.span);
                }
                BulkheadSetting::Queue { value, .. } => e.queue = Some(value.node),
                BulkheadSetting::Timeout { value, .. } => e.timeout_ms = Some(millis(&value.node)),
                BulkheadSetting::RejectWith { status, .. } => e.reject = status.node,
                BulkheadSetting::Per { key, .. } => e.per = key.node,
                BulkheadSetting::Isolation { mode, .. } => e.isolation = mode.node,
            }
        }
        e
    }
}

impl LimitEff {
    pub fn of(l: &Limit) -> Self {
        let mut e = LimitEff {
            calls: None,
            bytes: None,
            per: LimitKey::All,
            action: ActionEff::Reject,
            reject: LIMIT_REJECT,
            release: ReleaseEff::Window,
            scope: Scope::Local,
        };
        for s in l.settings.iter().rev() {
            match s {
                LimitSetting::Calls { rate, span } => {
                    e.calls = Some(Counter {
                        amount: rate.amount.node,
                        window_ms: millis(&rate.window.node),
                        span: *span,
                    });
                }
                LimitSetting::Bytes { rate, span } => {
                    e.bytes = Some(Counter {
                        amount: bytes(&rate.amount.node),
                        window_ms: millis(&rate.window.node),
                        span: *span,
                    });
                }
                LimitSetting::Per { key, .. } => e.per = key.node,
                LimitSetting::Action { action, .. } => {
                    e.action = match action {
                        LimitAction::Reject { .. } => ActionEff::Reject,
                        LimitAction::Shape { max_delay, .. } => {
                            ActionEff::Shape(millis(&max_delay.node))
                        }
                    };
                }
                LimitSetting::RejectWith { status, .. } => e.reject = status.node,
                LimitSetting::Release { release, .. } => {
                    e.release = match release {
                        Release::After { after, .. } => ReleaseEff::After(millis(&after.node)),
                        Release::Manual { .. } => ReleaseEff::Manual,
                    };
                }
                LimitSetting::Scope { scope, .. } => {
                    e.scope = match scope {
                        LimitScope::Local { .. } => Scope::Local,
                        LimitScope::Cluster { sync: None, .. } => Scope::ClusterUndeclared,
                        LimitScope::Cluster {
                            sync: Some(ClusterSync::Exact { .. }),
                            ..
                        } => Scope::ClusterExact,
                        LimitScope::Cluster {
                            sync: Some(ClusterSync::Batch { every, .. }),
                            ..
                        } => Scope::ClusterBatch(millis(&every.node)),
                    };
                }
            }
        }
        e
    }
}

impl<'a> FuseEff<'a> {
    pub fn of(f: &'a Fuse) -> Self {
        let mut e = FuseEff {
            trips: Vec::new(),
            business: None,
            system: None,
            recover: RecoverEff::Manual,
            reject: FUSE_REJECT,
        };
        for s in f.settings.iter().rev() {
            match s {
                FuseSetting::Trip(t) => e.trips.insert(0, t),
                FuseSetting::Classify(c) => match c.class.node {
                    ErrorClass::Business => e.business = Some(&c.items),
                    ErrorClass::System => e.system = Some(&c.items),
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
                FuseSetting::RejectWith { status, .. } => e.reject = status.node,
            }
        }
        e
    }
}

impl ActionEff {
    pub fn describe(&self) -> String {
        match self {
            ActionEff::Reject => "action reject".to_string(),
            ActionEff::Shape(ms) => format!("action shape max_delay {}", fmt_millis(*ms)),
        }
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

impl Scope {
    pub fn is_cluster(&self) -> bool {
        !matches!(self, Scope::Local)
    }
}
