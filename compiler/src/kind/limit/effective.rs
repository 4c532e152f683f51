//! A limit's effective values: its settings with defaults applied and
//! repeats resolved (the first of each wins).

use gov_proto::compiled::SYNC_EXACT_TIMEOUT_MS;
use gov_proto::v1 as pb;

use super::{
    ActionEff, Algorithm, ClusterSync, Counter, Fallback, Limit, LimitAction, LimitEff, LimitKey,
    LimitScope, LimitSetting, REJECT, Release, ReleaseEff, Scope, default_burst,
};
use crate::kind::Reject;
use crate::kind::keys::KeysEff;
use crate::units::{bytes, millis};

impl LimitEff {
    pub fn of(l: &Limit<'_>) -> Self {
        let mut e = LimitEff {
            calls: None,
            algorithm: Algorithm::TokenBucket,
            burst: 0,
            bytes: None,
            per: LimitKey::All,
            parts: Vec::new(),
            action: ActionEff::Reject,
            reject: REJECT,
            reject_grpc: pb::RuleKind::Limit.reject_grpc(),
            release: ReleaseEff::Window,
            scope: Scope::Local,
            keys: KeysEff::default(),
            headers_always: false,
            warmup_scale: None,
            share: None,
        };
        for s in l.settings.iter().rev() {
            // Reversed so that the first occurrence is applied last and wins.
            match s {
                LimitSetting::Algorithm { .. } => {}
                LimitSetting::Calls {
                    amount,
                    window,
                    span,
                    ..
                } => {
                    e.calls = Some(Counter {
                        amount: amount.node,
                        window_ms: millis(&window.node),
                        span: *span,
                    });
                }
                LimitSetting::Bytes {
                    amount,
                    window,
                    span,
                } => {
                    e.bytes = Some(Counter {
                        amount: bytes(&amount.node),
                        window_ms: millis(&window.node),
                        span: *span,
                    });
                }
                LimitSetting::Per { key, parts, .. } => {
                    e.per = key.node;
                    e.parts = parts.iter().map(|p| p.node.clone()).collect();
                }
                LimitSetting::Action { action, .. } => {
                    e.action = match action {
                        LimitAction::Reject => ActionEff::Reject,
                        LimitAction::Shape { max_delay } => {
                            ActionEff::Shape(millis(&max_delay.node))
                        }
                    };
                }
                LimitSetting::RejectWith { reject, .. } => match reject {
                    Reject::Status(status) => e.reject = status.node,
                    Reject::Grpc(_) => {
                        e.reject_grpc = reject.grpc().unwrap_or(pb::RuleKind::Limit.reject_grpc());
                    }
                },
                LimitSetting::Release { release, .. } => {
                    e.release = match release {
                        Release::After { after } => ReleaseEff::After(millis(&after.node)),
                        Release::Manual => ReleaseEff::Manual,
                    };
                }
                LimitSetting::Scope { scope, .. } => {
                    e.scope = match scope {
                        LimitScope::Local => Scope::Local,
                        LimitScope::Cluster { sync: None } => Scope::ClusterUndeclared,
                        LimitScope::Cluster {
                            sync: Some(ClusterSync::Exact { timeout, fallback }),
                        } => Scope::ClusterExact {
                            timeout_ms: timeout.as_ref().map_or(
                                i64::try_from(SYNC_EXACT_TIMEOUT_MS).unwrap_or(i64::MAX),
                                |t| millis(&t.node),
                            ),
                            fallback: fallback.unwrap_or(Fallback::Local),
                        },
                        LimitScope::Cluster {
                            sync: Some(ClusterSync::Batch { every }),
                        } => Scope::ClusterBatch(millis(&every.node)),
                    };
                }
                LimitSetting::Keys(k) => e.keys.apply(k),
                LimitSetting::Headers { always, .. } => e.headers_always = *always,
                LimitSetting::WarmupScale { span } => e.warmup_scale = Some(*span),
                LimitSetting::Share(share) => e.share = Some(share.clone()),
            }
        }
        (e.algorithm, e.burst) = algorithm_of(l, &e);
        e
    }
}

/// The declared algorithm and burst (the first of each), or the defaults:
/// a token bucket of [`default_burst`] in every scope (`sync batch` leases
/// every algorithm), a fixed window for bytes alone.
fn algorithm_of(l: &Limit<'_>, e: &LimitEff) -> (Algorithm, i64) {
    let declared = l.settings.iter().find_map(|s| match s {
        LimitSetting::Algorithm { algorithm, .. } => Some(*algorithm),
        _ => None,
    });
    let burst = l.settings.iter().find_map(|s| match s {
        LimitSetting::Calls { burst, .. } => Some(burst.as_ref().map(|b| b.node)),
        _ => None,
    });
    let algorithm = match (declared, burst) {
        (Some(a), _) => a,
        (None, Some(Some(_))) => Algorithm::TokenBucket,
        _ if e.calls.is_none() => Algorithm::FixedWindow,
        _ => Algorithm::TokenBucket,
    };
    let burst = match algorithm {
        Algorithm::TokenBucket => burst
            .flatten()
            .unwrap_or_else(|| default_burst(e.calls.map_or(1, |c| c.amount))),
        _ => 0,
    };
    (algorithm, burst)
}
