//! A limit's settings as written: one `LimitSetting` per line of its block.

use gov_lang::ast::{Span, Spanned};

use super::{
    Algorithm, ClusterSync, Fallback, KeyPart, LimitAction, LimitKey, LimitScope, LimitSetting,
    Release,
};
use crate::kind::Words;
use crate::kind::keys::KeySetting;
use crate::kind::share::Share;

pub(super) fn decode(w: &mut Words<'_>) -> Option<LimitSetting> {
    use LimitSetting as S;
    let span = w.span;
    Some(match w.key()?.node {
        "calls" => {
            let amount = w.int()?;
            w.expect("per")?;
            let window = w.duration()?;
            let burst = match w.expect("burst") {
                Some(_) => Some(w.int()?),
                None => None,
            };
            S::Calls {
                amount,
                window,
                burst,
                span,
            }
        }
        "algorithm" => {
            let algorithm = match w.key()?.node {
                "fixed" => {
                    w.expect("window")?;
                    Algorithm::FixedWindow
                }
                "sliding" => {
                    w.expect("window")?;
                    Algorithm::SlidingWindow
                }
                "token" => {
                    w.expect("bucket")?;
                    Algorithm::TokenBucket
                }
                _ => return None,
            };
            S::Algorithm { algorithm, span }
        }
        "bytes" => {
            let amount = w.size()?;
            w.expect("per")?;
            S::Bytes {
                amount,
                window: w.duration()?,
                span,
            }
        }
        "per" => {
            let mut parts = Vec::new();
            let first = w.key()?;
            let key = match first.node {
                "all" => LimitKey::All,
                "domain" => LimitKey::Domain,
                _ => {
                    let mut k = first.clone();
                    loop {
                        let named: fn(String) -> KeyPart = match k.node {
                            "service" | "consumer" => {
                                let part = if k.node == "service" {
                                    KeyPart::Service
                                } else {
                                    KeyPart::Consumer
                                };
                                parts.push(Spanned::new(part, k.span));
                                if w.expect(",").is_none() {
                                    break;
                                }
                                k = w.key()?;
                                continue;
                            }
                            "header" => KeyPart::Header,
                            "metadata" => KeyPart::Metadata,
                            "query" => KeyPart::Query,
                            "segment" => KeyPart::Segment,
                            "claim" => KeyPart::Claim,
                            _ => return None,
                        };
                        let v = w.string()?;
                        let at = Span::new(k.span.start, v.span.end);
                        parts.push(Spanned::new(named(v.node), at));
                        if w.expect(",").is_none() {
                            break;
                        }
                        k = w.key()?;
                    }
                    match parts.as_slice() {
                        [p] if p.node == KeyPart::Service => LimitKey::Service,
                        [p] if p.node == KeyPart::Consumer => LimitKey::Consumer,
                        _ => LimitKey::Parts,
                    }
                }
            };
            if key != LimitKey::Parts {
                parts.clear();
            }
            S::Per {
                key: Spanned::new(key, first.span),
                parts,
                span,
            }
        }
        "action" => {
            let action = match w.key()?.node {
                "reject" => LimitAction::Reject,
                "shape" => {
                    w.expect("max_delay")?;
                    LimitAction::Shape {
                        max_delay: w.duration()?,
                    }
                }
                _ => return None,
            };
            S::Action { action, span }
        }
        "reject" => {
            w.expect("with")?;
            S::RejectWith {
                reject: w.reject()?,
            }
        }
        "release" => {
            let release = match w.key()?.node {
                "after" => Release::After {
                    after: w.duration()?,
                },
                "manual" => Release::Manual,
                _ => return None,
            };
            S::Release { release }
        }
        "scope" => {
            let scope = match w.key()?.node {
                "local" => LimitScope::Local,
                "cluster" if w.expect("sync").is_some() => {
                    let sync = match w.key()?.node {
                        "exact" => {
                            let timeout = match w.expect("timeout") {
                                Some(_) => Some(w.duration()?),
                                None => None,
                            };
                            let fallback = match w.expect("fallback") {
                                Some(_) => Some(match w.key()?.node {
                                    "local" => Fallback::Local,
                                    "reject" => Fallback::Reject,
                                    "allow" => Fallback::Allow,
                                    _ => return None,
                                }),
                                None => None,
                            };
                            ClusterSync::Exact { timeout, fallback }
                        }
                        "batch" => ClusterSync::Batch {
                            every: w.duration()?,
                        },
                        _ => return None,
                    };
                    LimitScope::Cluster { sync: Some(sync) }
                }
                "cluster" => LimitScope::Cluster { sync: None },
                _ => return None,
            };
            S::Scope { scope, span }
        }
        "headers" => {
            let always = match w.key()?.node {
                "always" => true,
                "on" => {
                    w.expect("reject")?;
                    false
                }
                _ => return None,
            };
            S::Headers { always }
        }
        "scale" => {
            w.expect("with")?;
            w.expect("warmup")?;
            S::WarmupScale { span }
        }
        "share" => S::Share(Share::decode(w)?),
        key => S::Keys(KeySetting::decode(key, w)?),
    })
}
