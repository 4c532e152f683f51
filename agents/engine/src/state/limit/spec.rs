//! What a limit does ([`LimitSpec`]), converted from its wire `Limit`:
//! every value checked, nothing filled in.

use super::attrs::{KeyPart, MAX_KEY_PARTS, MAX_VALUE};
use crate::state::keys::KeyCap;
use std::time::Duration;

use gov_proto::v1::{self as proto, GrpcCode};
use http::{HeaderName, StatusCode};

pub use crate::cluster::Fallback;
use crate::config::invalid::{Ctx, InvalidConfig};
use crate::state::bulkhead::share::{self, ShareSpec};

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

/// How a limit counts its calls (bytes are always counted in fixed windows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Algorithm {
    /// `amount` per window, reset at each window's start.
    #[default]
    FixedWindow,
    /// The previous window's count weighted by the part of it still inside
    /// a window ending now, plus this window's count.
    SlidingWindow,
    /// GCRA: one call every `window / amount`, at most `burst` at once.
    TokenBucket { burst: u64 },
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
/// has a [`ClusterStore`](crate::ClusterStore) (see `state/limit.rs`); without one,
/// [`Engine::apply_target`](crate::Engine::apply_target) refuses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitScope {
    Local,
    ClusterExact(ExactSync),
    ClusterBatch(Duration),
}

/// How long a `sync exact` call waits for the store, and what decides it
/// when the store does not answer in time (or is down).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactSync {
    pub timeout: Duration,
    pub fallback: Fallback,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub calls: Option<RateSpec>,
    /// How `calls` are counted.
    pub algorithm: Algorithm,
    pub bytes: Option<RateSpec>,
    pub key: LimitKey,
    pub action: LimitAction,
    pub reject_status: StatusCode,
    /// The answer to a gRPC call it rejects.
    pub reject_grpc: GrpcCode,
    /// `None`: not latched; counters reset every window.
    pub release: Option<ReleaseSpec>,
    pub scope: LimitScope,
    /// With a key (`per consumer`, `per service`): how many keys it tracks.
    pub keys: KeyCap,
    /// `headers always`: admitted calls carry the RateLimit headers too.
    pub headers_always: bool,
    /// `scale with warmup`: local calls counting scaled by the instance's
    /// slow-start weight while it ramps.
    pub warmup_scale: bool,
    /// Keys on request attributes (`per header "x-tenant", consumer`):
    /// 1..=[`MAX_KEY_PARTS`] parts, and `key` is `All`; empty otherwise.
    pub parts: Box<[KeyPart]>,
    /// `share by consumer { ... }`: the calls of each window shared between
    /// consumers by weight (`super::share`); only without a key and local.
    pub share: Option<ShareSpec>,
    /// The config declares criticality: a sheddable call leaves a tenth of
    /// the window to the others (a limit without a key; set by the config's
    /// conversion, not read from the rule).
    pub by_class: bool,
}

impl LimitSpec {
    /// One counter for every call: no key.
    pub(crate) fn unkeyed(&self) -> bool {
        self.parts.is_empty() && matches!(self.key, LimitKey::All | LimitKey::Domain)
    }

    /// Inbound to a case-insensitive service: segment prefixes folded to
    /// lower case, as the path they are read from is.
    pub(crate) fn fold_case(&mut self) {
        for part in self.parts.iter_mut() {
            if let KeyPart::Segment { prefixes, .. } = part {
                for p in prefixes.iter_mut() {
                    *p = p.to_lowercase().into();
                }
            }
        }
    }
}

/// A limit's spec from the wire.
pub(crate) fn spec(ctx: &Ctx<'_>, l: &proto::Limit) -> Result<LimitSpec, InvalidConfig> {
    let calls = l
        .calls
        .as_ref()
        .map(|r| rate(ctx, "calls", r))
        .transpose()?;
    let bytes = l
        .bytes
        .as_ref()
        .map(|r| rate(ctx, "bytes", r))
        .transpose()?;
    if calls.is_none() && bytes.is_none() {
        return Err(ctx.err("neither `calls` nor `bytes` is set"));
    }
    let action = match ctx.known::<proto::LimitAction>("action", l.action)? {
        proto::LimitAction::Reject => LimitAction::Reject,
        proto::LimitAction::Shape => LimitAction::Shape {
            max_delay: ctx.positive_ms("max_delay_ms", l.max_delay_ms)?,
        },
    };
    let release = match l.release.as_ref().and_then(|r| r.kind.as_ref()) {
        None => None,
        Some(proto::release::Kind::AfterMs(ms)) => Some(ReleaseSpec::After(
            ctx.positive_ms("release.after_ms", *ms)?,
        )),
        Some(proto::release::Kind::Manual(_)) => Some(ReleaseSpec::Manual),
    };
    let scope = match (
        ctx.known::<proto::LimitScope>("scope", l.scope)?,
        ctx.known::<proto::ClusterSync>("sync", l.sync)?,
    ) {
        (proto::LimitScope::Local, _) => LimitScope::Local,
        (proto::LimitScope::Cluster, proto::ClusterSync::Exact) => {
            LimitScope::ClusterExact(ExactSync {
                timeout: ctx.positive_ms("sync_timeout_ms", l.sync_timeout_ms)?,
                fallback: match ctx.known::<proto::ClusterFallback>("fallback", l.fallback)? {
                    proto::ClusterFallback::Local => Fallback::Local,
                    proto::ClusterFallback::Reject => Fallback::Reject,
                    proto::ClusterFallback::Allow => Fallback::Allow,
                },
            })
        }
        (proto::LimitScope::Cluster, proto::ClusterSync::Batch) => {
            LimitScope::ClusterBatch(ctx.positive_ms("sync_batch_ms", l.sync_batch_ms)?)
        }
    };
    let algorithm = algorithm(ctx, l, calls.as_ref())?;
    if l.warmup_scale && (calls.is_none() || scope != LimitScope::Local) {
        return Err(ctx.err(
            "`warmup_scale` scales one instance's calls: it needs `calls` and `scope local` (a cluster limit's amount is shared by every instance)",
        ));
    }
    let share = match &l.share {
        None => None,
        Some(_) if calls.is_none() => {
            return Err(ctx.err("`share` shares calls, but `calls` is not set"));
        }
        Some(_) if scope != LimitScope::Local => {
            return Err(ctx.err(
                "`share` applies to a `scope local` limit only (its counts are one agent's)",
            ));
        }
        Some(_)
            if !l.key_parts.is_empty()
                || !matches!(
                    ctx.known::<proto::LimitKey>("key", l.key)?,
                    proto::LimitKey::All | proto::LimitKey::Domain
                ) =>
        {
            return Err(ctx.err(
                "`share` applies to a limit without a key (`per all`): it shares one counter",
            ));
        }
        Some(s) => Some(share::spec(ctx, s)?),
    };
    Ok(LimitSpec {
        calls,
        algorithm,
        bytes,
        key: match ctx.known::<proto::LimitKey>("key", l.key)? {
            proto::LimitKey::All => LimitKey::All,
            proto::LimitKey::Domain => LimitKey::Domain,
            proto::LimitKey::Service => LimitKey::Service,
            proto::LimitKey::Consumer => LimitKey::Consumer,
        },
        action,
        reject_status: ctx.status(l.reject_status)?,
        reject_grpc: ctx.grpc(l.reject_grpc_status)?,
        release,
        scope,
        keys: crate::state::keys::cap(ctx, l.max_keys, l.overflow)?,
        headers_always: l.ratelimit_headers_always,
        warmup_scale: l.warmup_scale,
        parts: parts(ctx, l)?,
        share,
        by_class: false,
    })
}

/// The parts of a key on request attributes, each checked.
fn parts(ctx: &Ctx<'_>, l: &proto::Limit) -> Result<Box<[KeyPart]>, InvalidConfig> {
    use proto::limit_key_part::Kind;
    if l.key_parts.is_empty() {
        return Ok(Box::default());
    }
    if l.key_parts.len() > MAX_KEY_PARTS {
        return Err(ctx.err(format!(
            "`key_parts` has {} parts, more than {MAX_KEY_PARTS}",
            l.key_parts.len()
        )));
    }
    if l.key != proto::LimitKey::All as i32 {
        return Err(ctx.err("`key_parts` is set, so `key` must be `LIMIT_KEY_ALL`"));
    }
    fn name<'v>(ctx: &Ctx<'_>, what: &str, v: &'v str) -> Result<&'v str, InvalidConfig> {
        if v.is_empty() || v.len() > MAX_VALUE {
            Err(ctx.err(format!(
                "a key's {what} name is empty or longer than {MAX_VALUE} bytes"
            )))
        } else {
            Ok(v)
        }
    }
    let header = |v: &str| {
        HeaderName::from_bytes(name(ctx, "header", v)?.as_bytes())
            .ok()
            .filter(|h| h.as_str() == v)
            .ok_or_else(|| ctx.err(format!("key header `{v}` is not a lower-case header name")))
    };
    l.key_parts
        .iter()
        .map(|p| {
            Ok(match p.kind.as_ref() {
                Some(Kind::Key(k)) => match ctx.known::<proto::LimitKey>("key_parts.key", *k)? {
                    proto::LimitKey::Service => KeyPart::Service,
                    proto::LimitKey::Consumer => KeyPart::Consumer,
                    _ => {
                        return Err(
                            ctx.err("a key part is `service` or `consumer`, not `all` or `domain`")
                        );
                    }
                },
                Some(Kind::Header(h)) => KeyPart::Header(header(h)?),
                Some(Kind::Query(q)) => KeyPart::Query(name(ctx, "query parameter", q)?.into()),
                Some(Kind::Claim(c)) => KeyPart::Claim(name(ctx, "claim", c)?.into()),
                Some(Kind::Segment(s)) => {
                    let mut prefixes: Vec<Box<str>> = Vec::new();
                    for p in &s.prefixes {
                        if !p.starts_with('/') {
                            return Err(
                                ctx.err(format!("segment prefix `{p}` does not start with `/`"))
                            );
                        }
                        prefixes.push(p.as_str().into());
                    }
                    if prefixes.is_empty() {
                        return Err(ctx.err(format!("segment `{}` has no prefix", s.name)));
                    }
                    // The longest a path starts with is the one found first.
                    prefixes.sort_by_key(|p| std::cmp::Reverse(p.len()));
                    KeyPart::Segment {
                        name: name(ctx, "segment", &s.name)?.into(),
                        prefixes: prefixes.into(),
                    }
                }
                None => {
                    return Err(ctx.err("a key part has no kind: upgrade the agent"));
                }
            })
        })
        .collect()
}

fn rate(ctx: &Ctx<'_>, field: &str, r: &proto::Rate) -> Result<RateSpec, InvalidConfig> {
    if r.amount == 0 {
        return Err(ctx.err(format!("`{field}.amount` must be > 0")));
    }
    Ok(RateSpec {
        amount: r.amount,
        window: ctx.positive_ms(&format!("{field}.window_ms"), r.window_ms)?,
    })
}

/// The calls algorithm: a token bucket's burst is 1..=amount; the other
/// algorithms have no burst; an algorithm other than the fixed window needs
/// a calls rate. Every algorithm is leased under `sync batch`.
fn algorithm(
    ctx: &Ctx<'_>,
    l: &proto::Limit,
    calls: Option<&RateSpec>,
) -> Result<Algorithm, InvalidConfig> {
    let algorithm = match ctx.known::<proto::LimitAlgorithm>("algorithm", l.algorithm)? {
        proto::LimitAlgorithm::FixedWindow => Algorithm::FixedWindow,
        proto::LimitAlgorithm::SlidingWindow => Algorithm::SlidingWindow,
        proto::LimitAlgorithm::TokenBucket => Algorithm::TokenBucket { burst: l.burst },
    };
    match (algorithm, calls) {
        (Algorithm::FixedWindow, _) if l.burst == 0 => return Ok(algorithm),
        (Algorithm::TokenBucket { .. }, None) | (Algorithm::SlidingWindow, None) => {
            return Err(ctx.err(
                "`algorithm` counts calls, but `calls` is not set (bytes are counted in fixed windows)",
            ));
        }
        (Algorithm::TokenBucket { burst }, Some(rate)) if burst == 0 || burst > rate.amount => {
            return Err(ctx.err(format!(
                "`burst` must be 1..={} (`calls.amount`) with a token bucket, not {burst}",
                rate.amount
            )));
        }
        (Algorithm::TokenBucket { .. }, _) => {}
        _ if l.burst != 0 => {
            return Err(ctx.err("`burst` is set, but only a token bucket has one"));
        }
        _ => {}
    }
    Ok(algorithm)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share needs `calls`, `scope local` and a limit without a key.
    #[test]
    fn a_share_is_of_one_local_counter_of_calls() {
        let ctx = Ctx::new("svc/l");
        let ok = proto::Limit {
            calls: Some(proto::Rate {
                amount: 10,
                window_ms: 1000,
            }),
            reject_status: 429,
            reject_grpc_status: GrpcCode::ResourceExhausted as i32,
            share: Some(proto::FairShare {
                weights: vec![proto::ShareWeight {
                    consumer: "crm".into(),
                    weight: 3,
                }],
                default_weight: 1,
            }),
            ..proto::Limit::default()
        };
        let s = spec(&ctx, &ok).expect("valid");
        assert_eq!(s.share.map(|s| s.weights.len()), Some(1));
        let bytes = Some(proto::Rate {
            amount: 10,
            window_ms: 1000,
        });
        for bad in [
            proto::Limit {
                calls: None,
                bytes,
                ..ok.clone()
            },
            proto::Limit {
                scope: proto::LimitScope::Cluster as i32,
                sync_batch_ms: 100,
                sync: proto::ClusterSync::Batch as i32,
                ..ok.clone()
            },
            proto::Limit {
                key: proto::LimitKey::Consumer as i32,
                ..ok.clone()
            },
            proto::Limit {
                key_parts: vec![proto::LimitKeyPart {
                    kind: Some(proto::limit_key_part::Kind::Header("x-t".into())),
                }],
                ..ok.clone()
            },
            proto::Limit {
                share: Some(proto::FairShare {
                    weights: vec![],
                    default_weight: 0,
                }),
                ..ok.clone()
            },
        ] {
            assert!(spec(&ctx, &bad).is_err(), "{bad:?}");
        }
    }
}
