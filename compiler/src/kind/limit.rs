//! `limit NAME on EXPR { ... }`: counts calls and bytes per window; calls
//! over the limit are rejected (429 unless `reject with` says otherwise)
//! or, outbound, shaped. An exceeded limit with `release` latches until
//! released.
//!
//! ```gov
//! limit crm_supplier on supplier {
//!   calls 100 per 1s
//!   bytes 10MiB per 1m
//!   per consumer
//!   release after 2h
//!   scope cluster sync batch 100ms
//! }
//! ```

use gov_lang::ast::{Ident, MatchExpr, RuleDef, Setting, Span};
use gov_proto::v1 as pb;

use super::keys::KeysEff;
use super::share::Share;
use super::{Bound, Large, LowerCx, Rule, Values, Words};
use crate::units::{bytes, fmt_bytes, fmt_millis, fmt_ms, push, u32_of, unsigned};
use gov_proto::compiled::SYNC_EXACT_TIMEOUT_MS;

mod effective;
mod setting;

use setting::decode;
pub(crate) use setting::{
    Algorithm, ClusterSync, Fallback, KeyPart, LimitAction, LimitKey, LimitScope, LimitSetting,
    MAX_KEY_PARTS, Release,
};

/// The default rejection status, beside the kind's word in gov-proto
/// (`RuleKind::reject_status`; the compiler writes it).
pub(crate) const REJECT: i64 = pb::RuleKind::Limit.reject_status() as i64;

/// The burst of a token bucket nobody declared: 5% of the amount, and at
/// least 10 calls (or the amount, if smaller). An overloaded limit admits
/// at most `amount * T + burst` in a run of T windows: 1.02x from 2.5
/// windows on; traffic well under the rate, arriving at random, is not
/// refused for coming in small clumps (docs/language.md, "Algorithms").
pub(crate) fn default_burst(amount: i64) -> i64 {
    let amount = amount.max(1);
    ((amount + 19) / 20).max(amount.min(10))
}

/// A limit with its settings decoded.
pub(crate) struct Limit<'a> {
    pub name: &'a Ident,
    pub on: &'a MatchExpr,
    pub settings: Vec<LimitSetting>,
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
    ClusterExact { timeout_ms: i64, fallback: Fallback },
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

/// The effective settings: what is written, with defaults applied. When a
/// setting is given twice (an error of its own), the first wins.
pub(crate) struct LimitEff {
    pub calls: Option<Counter>,
    /// The algorithm with defaults applied: the token bucket (a fixed
    /// window for bytes alone).
    pub algorithm: Algorithm,
    /// The token bucket's burst (declared or [`default_burst`]); 0 otherwise.
    pub burst: i64,
    pub bytes: Option<Counter>,
    pub per: LimitKey,
    /// With `LimitKey::Parts`: the parts, in order.
    pub parts: Vec<KeyPart>,
    pub action: ActionEff,
    pub reject: i64,
    pub reject_grpc: pb::GrpcCode,
    pub release: ReleaseEff,
    pub scope: Scope,
    pub keys: KeysEff,
    /// `headers always`: admitted calls carry the RateLimit headers too.
    pub headers_always: bool,
    /// `scale with warmup`, where written.
    pub warmup_scale: Option<Span>,
    /// `share by consumer { ... }`, where written.
    pub share: Option<Share>,
}

/// The kind.
pub(crate) struct Kind;

impl<'a> Limit<'a> {
    /// The rule as a limit, if it is one.
    pub fn of(rule: &Rule<'a>) -> Option<Self> {
        (rule.imp.wire() == pb::RuleKind::Limit).then(|| Self::from(rule.def))
    }

    fn from(def: &'a RuleDef) -> Self {
        Limit {
            name: &def.name,
            on: &def.on,
            settings: super::decode(def, decode),
        }
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

impl Scope {
    pub fn is_cluster(&self) -> bool {
        !matches!(self, Scope::Local)
    }
}

// === impl Kind ===

impl super::Kind for Kind {
    fn wire(&self) -> pb::RuleKind {
        pb::RuleKind::Limit
    }

    fn missing(&self, rule: &RuleDef) -> Option<(&'static str, &'static str)> {
        let l = Limit::from(rule);
        let has = l
            .settings
            .iter()
            .any(|s| matches!(s, LimitSetting::Calls { .. } | LimitSetting::Bytes { .. }));
        (!has).then_some((
            "`calls` or `bytes`",
            "add `calls N per D`, `bytes SIZE per D`, or both",
        ))
    }

    fn setting_key(&self, setting: &Setting) -> Option<&'static str> {
        Some(match decode(&mut Words::of(setting))? {
            LimitSetting::Calls { .. } => "calls",
            LimitSetting::Algorithm { .. } => "algorithm",
            LimitSetting::Bytes { .. } => "bytes",
            LimitSetting::Per { .. } => "per",
            LimitSetting::Action { .. } => "action",
            LimitSetting::RejectWith { reject } => reject.key(),
            LimitSetting::Release { .. } => "release",
            LimitSetting::Scope { .. } => "scope",
            LimitSetting::Keys(k) => k.key(),
            LimitSetting::Headers { .. } => "headers",
            LimitSetting::WarmupScale { .. } => "scale with warmup",
            LimitSetting::Share(_) => "share",
        })
    }

    fn values(&self, rule: &RuleDef, _text: &dyn Fn(Span) -> String, out: &mut Values) {
        use Bound::Positive;
        for s in Limit::from(rule).settings {
            match s {
                LimitSetting::Calls {
                    amount,
                    window,
                    burst,
                    ..
                } => {
                    if let Some(b) = burst {
                        out.bound("burst", b.node, b.span, Positive);
                    }
                    out.bound("calls", amount.node, amount.span, Positive);
                    out.bound_duration("calls ... per", &window, Positive);
                    out.large("window", Large::Duration(window));
                }
                LimitSetting::Bytes { amount, window, .. } => {
                    out.bound("bytes", bytes(&amount.node), amount.span, Positive);
                    out.bound_duration("bytes ... per", &window, Positive);
                    out.large("bytes", Large::Size(amount));
                    out.large("window", Large::Duration(window));
                }
                LimitSetting::Action {
                    action: LimitAction::Shape { max_delay },
                    ..
                } => {
                    out.bound_duration("max_delay", &max_delay, Positive);
                    out.large("max_delay", Large::Duration(max_delay));
                }
                LimitSetting::Release {
                    release: Release::After { after },
                    ..
                } => {
                    out.bound_duration("release after", &after, Positive);
                    out.large("release after", Large::Duration(after));
                }
                LimitSetting::Scope {
                    scope:
                        LimitScope::Cluster {
                            sync: Some(ClusterSync::Batch { every }),
                        },
                    ..
                } => out.bound_duration("sync batch", &every, Positive),
                LimitSetting::Scope {
                    scope:
                        LimitScope::Cluster {
                            sync:
                                Some(ClusterSync::Exact {
                                    timeout: Some(timeout),
                                    ..
                                }),
                        },
                    ..
                } => {
                    out.bound_duration("sync exact timeout", &timeout, Positive);
                    out.large("sync exact timeout", Large::Duration(timeout));
                }
                LimitSetting::RejectWith { reject, .. } => reject.values(out),
                LimitSetting::Keys(k) => k.values(out),
                LimitSetting::Share(share) => share.values(out),
                _ => {}
            }
        }
    }

    fn conflict(
        &self,
        a: &RuleDef,
        b: &RuleDef,
        text: &dyn Fn(Span) -> String,
    ) -> Option<(String, &'static str)> {
        let x = LimitEff::of(&Limit::from(a));
        let y = LimitEff::of(&Limit::from(b));
        if x.per != y.per || x.parts != y.parts || x.scope.is_cluster() != y.scope.is_cluster() {
            return None;
        }
        let help = "merge them into one limit, or count over different windows";
        if let (Some(c), Some(d)) = (x.calls, y.calls)
            && c.window_ms == d.window_ms
        {
            return Some((format!("`{}` vs `{}`", text(c.span), text(d.span)), help));
        }
        if let (Some(c), Some(d)) = (x.bytes, y.bytes)
            && c.window_ms == d.window_ms
        {
            return Some((format!("`{}` vs `{}`", text(c.span), text(d.span)), help));
        }
        if x.action != y.action {
            return Some((
                format!("`{}` vs `{}`", x.action.describe(), y.action.describe()),
                "calls over a limit are either rejected or shaped; choose one",
            ));
        }
        None
    }

    fn lower(&self, rule: &RuleDef, l: &dyn LowerCx) -> pb::rule::Spec {
        let e = LimitEff::of(&Limit::from(rule));
        let rate = |c: Counter| pb::Rate {
            amount: unsigned(c.amount),
            window_ms: unsigned(c.window_ms),
        };
        let (scope, sync, batch) = match e.scope {
            Scope::Local => (pb::LimitScope::Local, pb::ClusterSync::Exact, 0),
            Scope::ClusterExact { .. } | Scope::ClusterUndeclared => {
                (pb::LimitScope::Cluster, pb::ClusterSync::Exact, 0)
            }
            Scope::ClusterBatch(ms) => (pb::LimitScope::Cluster, pb::ClusterSync::Batch, ms),
        };
        let (timeout, fallback) = match e.scope {
            Scope::ClusterExact {
                timeout_ms,
                fallback,
            } => (unsigned(timeout_ms), fallback),
            Scope::ClusterUndeclared => (SYNC_EXACT_TIMEOUT_MS, Fallback::Local),
            _ => (0, Fallback::Local),
        };
        let (max_keys, overflow) = e.keys.lower();
        pb::rule::Spec::Limit(pb::Limit {
            max_keys,
            overflow,
            algorithm: match e.algorithm {
                Algorithm::FixedWindow => pb::LimitAlgorithm::FixedWindow,
                Algorithm::SlidingWindow => pb::LimitAlgorithm::SlidingWindow,
                Algorithm::TokenBucket => pb::LimitAlgorithm::TokenBucket,
            } as i32,
            burst: unsigned(e.burst),
            ratelimit_headers_always: e.headers_always,
            warmup_scale: e.warmup_scale.is_some(),
            share: e.share.as_ref().map(Share::lower),
            calls: e.calls.map(rate),
            bytes: e.bytes.map(rate),
            key: match e.per {
                LimitKey::All | LimitKey::Parts => pb::LimitKey::All,
                LimitKey::Domain => pb::LimitKey::Domain,
                LimitKey::Service => pb::LimitKey::Service,
                LimitKey::Consumer => pb::LimitKey::Consumer,
            } as i32,
            key_parts: e.parts.iter().map(|p| lower_part(p, &rule.on, l)).collect(),
            action: match e.action {
                ActionEff::Reject => pb::LimitAction::Reject,
                ActionEff::Shape(_) => pb::LimitAction::Shape,
            } as i32,
            max_delay_ms: match e.action {
                ActionEff::Shape(ms) => unsigned(ms),
                ActionEff::Reject => 0,
            },
            reject_status: u32_of(e.reject),
            reject_grpc_status: e.reject_grpc as i32,
            release: match e.release {
                ReleaseEff::Window => None,
                ReleaseEff::After(ms) => Some(pb::Release {
                    kind: Some(pb::release::Kind::AfterMs(unsigned(ms))),
                }),
                ReleaseEff::Manual => Some(pb::Release {
                    kind: Some(pb::release::Kind::Manual(true)),
                }),
            },
            scope: scope as i32,
            sync: sync as i32,
            sync_batch_ms: unsigned(batch),
            sync_timeout_ms: timeout,
            fallback: match fallback {
                Fallback::Local => pb::ClusterFallback::Local,
                Fallback::Reject => pb::ClusterFallback::Reject,
                Fallback::Allow => pb::ClusterFallback::Allow,
            } as i32,
        })
    }

    fn fields(&self, spec: &pb::rule::Spec, f: &mut Vec<(String, String)>) {
        let pb::rule::Spec::Limit(l) = spec else {
            return;
        };
        if let Some(c) = &l.calls {
            push(
                f,
                "calls",
                format!("{} per {}", c.amount, fmt_ms(c.window_ms)),
            );
            let algorithm = match l.algorithm() {
                pb::LimitAlgorithm::FixedWindow => "fixed window".to_string(),
                pb::LimitAlgorithm::SlidingWindow => "sliding window".to_string(),
                pb::LimitAlgorithm::TokenBucket => format!("token bucket burst {}", l.burst),
            };
            push(f, "algorithm", algorithm);
        }
        if let Some(b) = &l.bytes {
            push(
                f,
                "bytes",
                format!(
                    "{} per {}",
                    fmt_bytes(i64::try_from(b.amount).unwrap_or(i64::MAX)),
                    fmt_ms(b.window_ms)
                ),
            );
        }
        let per = if l.key_parts.is_empty() {
            format!("{:?}", l.key()).to_lowercase()
        } else {
            l.key_parts
                .iter()
                .map(describe_part)
                .collect::<Vec<_>>()
                .join(", ")
        };
        push(f, "per", per);
        let action = match l.action() {
            pb::LimitAction::Reject => "reject".to_string(),
            pb::LimitAction::Shape => format!("shape max_delay {}", fmt_ms(l.max_delay_ms)),
        };
        push(f, "action", action);
        push(f, "reject with", l.reject_status.to_string());
        push(
            f,
            "reject with grpc_status",
            gov_proto::grpc::name(l.reject_grpc_status()).to_string(),
        );
        let release = match l.release.as_ref().and_then(|r| r.kind.as_ref()) {
            None => "every window".to_string(),
            Some(pb::release::Kind::AfterMs(ms)) => format!("after {}", fmt_ms(*ms)),
            Some(pb::release::Kind::Manual(_)) => "manual".to_string(),
        };
        push(f, "release", release);
        let headers = if l.ratelimit_headers_always {
            "always"
        } else {
            "on reject"
        };
        push(f, "headers", headers.to_string());
        let scope = match (l.scope(), l.sync()) {
            (pb::LimitScope::Local, _) => "local".to_string(),
            (pb::LimitScope::Cluster, pb::ClusterSync::Exact) => {
                let fallback = match l.fallback() {
                    pb::ClusterFallback::Local => Fallback::Local,
                    pb::ClusterFallback::Reject => Fallback::Reject,
                    pb::ClusterFallback::Allow => Fallback::Allow,
                };
                format!(
                    "cluster sync exact timeout {} fallback {}",
                    fmt_ms(l.sync_timeout_ms),
                    fallback.word()
                )
            }
            (pb::LimitScope::Cluster, pb::ClusterSync::Batch) => {
                format!("cluster sync batch {}", fmt_ms(l.sync_batch_ms))
            }
        };
        push(f, "scope", scope);
        super::keys::fields(f, l.max_keys, l.overflow());
        if l.warmup_scale {
            push(f, "scale with warmup", "yes".to_string());
        }
        if let Some(share) = &l.share {
            push(f, "share by consumer", Share::field(share));
        }
    }

    #[cfg(test)]
    fn decodes(&self, setting: &Setting) -> bool {
        let mut w = Words::of(setting);
        decode(&mut w).is_some() && w.done()
    }
}

/// One key part on the wire: gRPC metadata is a header (HTTP/2 carries
/// it so), a segment the prefixes of the match that capture it.
fn lower_part(p: &KeyPart, on: &MatchExpr, l: &dyn LowerCx) -> pb::LimitKeyPart {
    use pb::limit_key_part::Kind as K;
    let kind = match p {
        KeyPart::Service => K::Key(pb::LimitKey::Service as i32),
        KeyPart::Consumer => K::Key(pb::LimitKey::Consumer as i32),
        KeyPart::Header(h) | KeyPart::Metadata(h) => K::Header(h.to_ascii_lowercase()),
        KeyPart::Query(q) => K::Query(q.clone()),
        KeyPart::Claim(c) => K::Claim(c.clone()),
        KeyPart::Segment(name) => K::Segment(pb::PathSegment {
            name: name.clone(),
            prefixes: l
                .captures(on)
                .into_iter()
                .filter(|(n, _)| n == name)
                .map(|(_, prefix)| prefix)
                .collect(),
        }),
    };
    pb::LimitKeyPart { kind: Some(kind) }
}

/// A wire key part as a plan shows it.
fn describe_part(p: &pb::LimitKeyPart) -> String {
    use pb::limit_key_part::Kind as K;
    match &p.kind {
        Some(K::Key(k)) => match pb::LimitKey::try_from(*k) {
            Ok(pb::LimitKey::Service) => "service".into(),
            Ok(pb::LimitKey::Consumer) => "consumer".into(),
            _ => "?".into(),
        },
        Some(K::Header(h)) => format!("header \"{h}\""),
        Some(K::Query(q)) => format!("query \"{q}\""),
        Some(K::Segment(s)) => format!("segment \"{}\"", s.name),
        Some(K::Claim(c)) => format!("claim \"{c}\""),
        None => "?".into(),
    }
}
