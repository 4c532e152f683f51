//! A limit's settings as written (one `LimitSetting` per line of its
//! block) and their decoding from the words of a setting.

use gov_lang::ast::{Duration, Size, Span, Spanned};

use crate::kind::keys::KeySetting;
use crate::kind::share::Share;
use crate::kind::{Reject, Words};

#[derive(Clone, Debug)]
pub(crate) enum LimitSetting {
    /// `calls N per D [burst B]`
    Calls {
        amount: Spanned<i64>,
        window: Spanned<Duration>,
        burst: Option<Spanned<i64>>,
        span: Span,
    },
    /// `algorithm fixed window|sliding window|token bucket`
    Algorithm { algorithm: Algorithm, span: Span },
    /// `bytes SIZE per D` (request + response bytes)
    Bytes {
        amount: Spanned<Size>,
        window: Spanned<Duration>,
        span: Span,
    },
    /// `per all|domain|service|consumer`: whose calls share one counter;
    /// `per PART, PART...` (`LimitKey::Parts`): one counter per distinct
    /// combination of the parts' values.
    Per {
        key: Spanned<LimitKey>,
        parts: Vec<Spanned<KeyPart>>,
        span: Span,
    },
    /// `action reject` | `action shape max_delay D`
    Action { action: LimitAction, span: Span },
    /// `reject with STATUS` (default 429)
    RejectWith { reject: Reject },
    /// `release after D` | `release manual`
    Release { release: Release },
    /// `scope local` | `scope cluster [sync exact [timeout D] [fallback F] | sync batch D]`
    Scope { scope: LimitScope, span: Span },
    /// `max_keys N` | `overflow share|reject`
    Keys(KeySetting),
    /// `headers always` | `headers on reject`: whether admitted calls carry
    /// the RateLimit headers too.
    Headers { always: bool },
    /// `scale with warmup`: the amounts times the instance's slow-start
    /// weight while it ramps.
    WarmupScale { span: Span },
    /// `share by consumer { NAME WEIGHT... }`: the calls of each window
    /// shared between consumers by weight (a local limit without a key).
    Share(Share),
}

/// How calls are counted (`algorithm ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algorithm {
    FixedWindow,
    SlidingWindow,
    TokenBucket,
}

impl Algorithm {
    pub fn words(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed window",
            Algorithm::SlidingWindow => "sliding window",
            Algorithm::TokenBucket => "token bucket",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LimitKey {
    All,
    Domain,
    Service,
    Consumer,
    /// Keys on request attributes, or several parts: see the setting's parts.
    Parts,
}

/// One part of a key (`per header "x-tenant", consumer`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyPart {
    Service,
    Consumer,
    Header(String),
    /// gRPC metadata: a header of a gRPC call.
    Metadata(String),
    Query(String),
    /// A path segment the match captures (`path prefix "/t/" segment "t"`).
    Segment(String),
    /// A claim of the verified token (`consumer from jwt`).
    Claim(String),
}

impl KeyPart {
    /// The part as written.
    pub fn describe(&self) -> String {
        let q = |w: &str, v: &str| format!("{w} \"{v}\"");
        match self {
            KeyPart::Service => "service".into(),
            KeyPart::Consumer => "consumer".into(),
            KeyPart::Header(v) => q("header", v),
            KeyPart::Metadata(v) => q("metadata", v),
            KeyPart::Query(v) => q("query", v),
            KeyPart::Segment(v) => q("segment", v),
            KeyPart::Claim(v) => q("claim", v),
        }
    }
}

/// The most parts a key has (as the agents read it).
pub(crate) const MAX_KEY_PARTS: usize = 4;

#[derive(Clone, Debug)]
pub(crate) enum LimitAction {
    Reject,
    Shape { max_delay: Spanned<Duration> },
}

#[derive(Clone, Debug)]
pub(crate) enum Release {
    After { after: Spanned<Duration> },
    Manual,
}

#[derive(Clone, Debug)]
pub(crate) enum LimitScope {
    Local,
    /// `sync` is optional in the grammar so that the compiler can say the
    /// choice must be declared.
    Cluster {
        sync: Option<ClusterSync>,
    },
}

#[derive(Clone, Debug)]
pub(crate) enum ClusterSync {
    /// `sync exact [timeout D] [fallback local|reject|allow]`
    Exact {
        timeout: Option<Spanned<Duration>>,
        fallback: Option<Fallback>,
    },
    Batch {
        every: Spanned<Duration>,
    },
}

/// What decides a `sync exact` call the store did not answer in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fallback {
    Local,
    Reject,
    Allow,
}

impl Fallback {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Fallback::Local => "local",
            Fallback::Reject => "reject",
            Fallback::Allow => "allow",
        }
    }
}

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
        "per" => decode_per(w, span)?,
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
        "scope" => decode_scope(w, span)?,
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

/// `per all`, `per domain` or the parts of a key (`per header "x-tenant", consumer`).
fn decode_per(w: &mut Words<'_>, span: Span) -> Option<LimitSetting> {
    use LimitSetting as S;
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
    Some(S::Per {
        key: Spanned::new(key, first.span),
        parts,
        span,
    })
}

/// `scope local`, `scope cluster [sync exact [timeout D] [fallback F] | sync batch D]`.
fn decode_scope(w: &mut Words<'_>, span: Span) -> Option<LimitSetting> {
    use LimitSetting as S;
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
    Some(S::Scope { scope, span })
}
