//! `bulkhead NAME on EXPR { ... }`: caps the calls in flight for its
//! calls; a call that finds no permit waits at most `max_wait`, then is
//! rejected (408 unless `reject with` says otherwise).
//!
//! ```gov
//! bulkhead slow_calls on slow {
//!   max_concurrent 10
//!   max_wait 10ms
//!   queue 50
//!   timeout 2s
//!   reject with 408
//! }
//! bulkhead per_instance on calls to inventory {
//!   per instance
//!   max_concurrent 20
//!   max_wait 1s
//! }
//! bulkhead sized on slow {
//!   max_concurrent adaptive min 4 max 64
//! }
//! bulkhead fair on slow {
//!   max_concurrent 10
//!   max_wait 50ms
//!   share by consumer { crm 3 web 1 default 1 }
//! }
//! bulkhead drained on slow {
//!   max_concurrent 10
//!   max_wait 200ms
//!   queue codel target 5ms interval 100ms
//! }
//! ```
//!
//! `queue fifo | lifo [interval D] | codel target D interval D` lowers to
//! `Bulkhead.queue` (absent for the default FIFO); `queue N` stays the
//! bound on waiters, so both may be written.
//!
//! `max_concurrent adaptive min N max M` lowers to `max_concurrent M` (the
//! ceiling an agent that knows no adaptive limit enforces) and
//! `adaptive { min: N, max: M }`.

use gov_lang::ast::{Duration, Ident, MatchExpr, RuleDef, Setting, Span, Spanned};
use gov_proto::v1 as pb;

use super::keys::{KeySetting, KeysEff};
use super::share::Share;
use super::{Bound, Large, LowerCx, Reject, Rule, Values, Words};
use crate::units::{fmt_ms, millis, push, u32_of, unsigned};

/// The default rejection status, beside the kind's word in gov-proto
/// (`RuleKind::reject_status`; the compiler writes it).
pub(crate) const REJECT: i64 = pb::RuleKind::Bulkhead.reject_status() as i64;

#[derive(Clone, Debug)]
pub(crate) enum BulkheadSetting {
    /// `max_concurrent N`
    MaxConcurrent { value: Spanned<i64> },
    /// `max_concurrent adaptive min N max M`
    Adaptive { adaptive: Adaptive },
    /// `max_wait D`: how long a call waits for a permit before rejection.
    MaxWait { value: Spanned<Duration> },
    /// `queue N`: at most N calls wait at once; more are rejected at once.
    Queue { value: Spanned<i64> },
    /// `queue fifo | lifo [interval D] | codel target D interval D`
    Discipline { discipline: Discipline },
    /// `timeout D`: per-call timeout once admitted.
    Timeout { value: Spanned<Duration> },
    /// `reject with STATUS` (default 408).
    RejectWith { reject: Reject },
    /// `per operation` | `per instance` | `per instance path`
    Per {
        key: Spanned<BulkheadKey>,
        span: Span,
    },
    /// `isolation semaphore` | `isolation pool`
    Isolation { mode: Spanned<Isolation> },
    /// `max_keys N` | `overflow share|reject`
    Keys(KeySetting),
    /// `share by consumer { NAME WEIGHT... }`
    Share(Share),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BulkheadKey {
    /// One bulkhead for the whole match (server side, per operation).
    Operation,
    /// One per upstream instance (client side).
    Instance,
    /// One per upstream instance and request path (client side).
    InstancePath,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isolation {
    Semaphore,
    Pool,
}

/// How waiting calls are served (`queue codel ...`, `queue lifo`).
#[derive(Clone, Debug)]
pub(crate) enum Discipline {
    Fifo,
    /// `queue lifo [interval D]` (100ms unless written).
    Lifo {
        interval: Option<Spanned<Duration>>,
    },
    /// `queue codel target D interval D`
    Codel {
        target: Spanned<Duration>,
        interval: Spanned<Duration>,
    },
}

/// The interval of `queue lifo` when none is written.
pub(crate) const LIFO_INTERVAL_MS: u64 = 100;

/// `max_concurrent adaptive min N max M`: the bounds of an adaptive limit.
#[derive(Clone, Debug)]
pub(crate) struct Adaptive {
    pub min: Spanned<i64>,
    pub max: Spanned<i64>,
}

/// A bulkhead with its settings decoded.
pub(crate) struct Bulkhead<'a> {
    pub name: &'a Ident,
    pub on: &'a MatchExpr,
    pub settings: Vec<BulkheadSetting>,
}

/// The effective settings: what is written, with defaults applied. When a
/// setting is given twice (an error of its own), the first wins.
pub(crate) struct BulkheadEff {
    /// A fixed `max_concurrent N` (`None` with `adaptive`).
    pub max_concurrent: Option<(i64, Span)>,
    pub adaptive: Option<Adaptive>,
    /// Default 0: fail fast.
    pub max_wait_ms: i64,
    pub max_wait_span: Option<Span>,
    pub queue: Option<i64>,
    /// `None`: FIFO, not written.
    pub discipline: Option<Discipline>,
    pub timeout_ms: Option<i64>,
    pub reject: i64,
    pub reject_grpc: pb::GrpcCode,
    pub per: BulkheadKey,
    pub isolation: Isolation,
    pub keys: KeysEff,
    pub share: Option<Share>,
}

/// The kind.
pub(crate) struct Kind;

// === Decoding ===

fn decode(w: &mut Words<'_>) -> Option<BulkheadSetting> {
    use BulkheadSetting as S;
    let span = w.span;
    Some(match w.key()?.node {
        "max_concurrent" => match w.expect("adaptive") {
            Some(_) => {
                w.expect("min")?;
                let min = w.int()?;
                w.expect("max")?;
                let max = w.int()?;
                S::Adaptive {
                    adaptive: Adaptive { min, max },
                }
            }
            None => S::MaxConcurrent { value: w.int()? },
        },
        "max_wait" => S::MaxWait {
            value: w.duration()?,
        },
        "queue" => {
            if w.expect("fifo").is_some() {
                S::Discipline {
                    discipline: Discipline::Fifo,
                }
            } else if w.expect("lifo").is_some() {
                let interval = match w.expect("interval") {
                    Some(_) => Some(w.duration()?),
                    None => None,
                };
                S::Discipline {
                    discipline: Discipline::Lifo { interval },
                }
            } else if w.expect("codel").is_some() {
                w.expect("target")?;
                let target = w.duration()?;
                w.expect("interval")?;
                let interval = w.duration()?;
                S::Discipline {
                    discipline: Discipline::Codel { target, interval },
                }
            } else {
                S::Queue { value: w.int()? }
            }
        }
        "timeout" => S::Timeout {
            value: w.duration()?,
        },
        "reject" => {
            w.expect("with")?;
            S::RejectWith {
                reject: w.reject()?,
            }
        }
        "per" => {
            let first = w.key()?;
            let key = match first.node {
                "operation" => Spanned::new(BulkheadKey::Operation, first.span),
                "instance" => match w.expect("path") {
                    Some(path) => Spanned::new(BulkheadKey::InstancePath, first.span.join(path)),
                    None => Spanned::new(BulkheadKey::Instance, first.span),
                },
                _ => return None,
            };
            S::Per { key, span }
        }
        "isolation" => {
            let m = w.key()?;
            let mode = match m.node {
                "semaphore" => Isolation::Semaphore,
                "pool" => Isolation::Pool,
                _ => return None,
            };
            S::Isolation {
                mode: Spanned::new(mode, m.span),
            }
        }
        "share" => S::Share(Share::decode(w)?),
        key => S::Keys(KeySetting::decode(key, w)?),
    })
}

impl<'a> Bulkhead<'a> {
    /// The rule as a bulkhead, if it is one.
    pub fn of(rule: &Rule<'a>) -> Option<Self> {
        (rule.imp.wire() == pb::RuleKind::Bulkhead).then(|| Self::from(rule.def))
    }

    fn from(def: &'a RuleDef) -> Self {
        Bulkhead {
            name: &def.name,
            on: &def.on,
            settings: super::decode(def, decode),
        }
    }
}

impl BulkheadEff {
    pub fn of(b: &Bulkhead<'_>) -> Self {
        let mut e = BulkheadEff {
            max_concurrent: None,
            adaptive: None,
            max_wait_ms: 0,
            max_wait_span: None,
            queue: None,
            discipline: None,
            timeout_ms: None,
            reject: REJECT,
            reject_grpc: pb::RuleKind::Bulkhead.reject_grpc(),
            per: BulkheadKey::Operation,
            isolation: Isolation::Semaphore,
            keys: KeysEff::default(),
            share: None,
        };
        for s in b.settings.iter().rev() {
            // Reversed so that the first occurrence is applied last and wins.
            match s {
                BulkheadSetting::MaxConcurrent { value, .. } => {
                    e.max_concurrent = Some((value.node, value.span));
                    e.adaptive = None;
                }
                BulkheadSetting::Adaptive { adaptive } => {
                    e.adaptive = Some(adaptive.clone());
                    e.max_concurrent = None;
                }
                BulkheadSetting::MaxWait { value, .. } => {
                    e.max_wait_ms = millis(&value.node);
                    e.max_wait_span = Some(value.span);
                }
                BulkheadSetting::Queue { value, .. } => e.queue = Some(value.node),
                BulkheadSetting::Discipline { discipline } => {
                    e.discipline = Some(discipline.clone());
                }
                BulkheadSetting::Timeout { value, .. } => e.timeout_ms = Some(millis(&value.node)),
                BulkheadSetting::RejectWith { reject, .. } => match reject {
                    Reject::Status(status) => e.reject = status.node,
                    Reject::Grpc(_) => {
                        e.reject_grpc = reject
                            .grpc()
                            .unwrap_or(pb::RuleKind::Bulkhead.reject_grpc());
                    }
                },
                BulkheadSetting::Per { key, .. } => e.per = key.node,
                BulkheadSetting::Keys(k) => e.keys.apply(k),
                BulkheadSetting::Isolation { mode, .. } => e.isolation = mode.node,
                BulkheadSetting::Share(share) => e.share = Some(share.clone()),
            }
        }
        e
    }
}

// === impl Kind ===

impl super::Kind for Kind {
    fn wire(&self) -> pb::RuleKind {
        pb::RuleKind::Bulkhead
    }

    fn missing(&self, rule: &RuleDef) -> Option<(&'static str, &'static str)> {
        let b = Bulkhead::from(rule);
        let has = b.settings.iter().any(|s| {
            matches!(
                s,
                BulkheadSetting::MaxConcurrent { .. } | BulkheadSetting::Adaptive { .. }
            )
        });
        (!has).then_some((
            "`max_concurrent`",
            "add `max_concurrent N`: the most calls in flight at once",
        ))
    }

    fn setting_key(&self, setting: &Setting) -> Option<&'static str> {
        Some(match decode(&mut Words::of(setting))? {
            BulkheadSetting::MaxConcurrent { .. } | BulkheadSetting::Adaptive { .. } => {
                "max_concurrent"
            }
            BulkheadSetting::MaxWait { .. } => "max_wait",
            BulkheadSetting::Queue { .. } => "queue",
            BulkheadSetting::Discipline { .. } => "queue discipline",
            BulkheadSetting::Timeout { .. } => "timeout",
            BulkheadSetting::RejectWith { reject } => reject.key(),
            BulkheadSetting::Per { .. } => "per",
            BulkheadSetting::Isolation { .. } => "isolation",
            BulkheadSetting::Keys(k) => k.key(),
            BulkheadSetting::Share(_) => "share",
        })
    }

    fn values(&self, rule: &RuleDef, _text: &dyn Fn(Span) -> String, out: &mut Values) {
        use Bound::{NotNegative, Positive};
        for s in Bulkhead::from(rule).settings {
            match s {
                BulkheadSetting::MaxConcurrent { value, .. } => {
                    out.bound("max_concurrent", value.node, value.span, Positive);
                    out.large("max_concurrent", Large::Count(value));
                }
                BulkheadSetting::Adaptive { adaptive: a } => {
                    let (min, max) = ("max_concurrent adaptive min", "max_concurrent adaptive max");
                    out.bound(min, a.min.node, a.min.span, Positive);
                    out.bound(max, a.max.node, a.max.span, Positive);
                    out.large(min, Large::Count(a.min));
                    out.large(max, Large::Count(a.max));
                }
                BulkheadSetting::MaxWait { value, .. } => {
                    out.bound_duration("max_wait", &value, NotNegative);
                    out.large("max_wait", Large::Duration(value));
                }
                BulkheadSetting::Queue { value, .. } => {
                    out.bound("queue", value.node, value.span, NotNegative);
                    out.large("queue", Large::Count(value));
                }
                BulkheadSetting::Discipline { discipline } => match discipline {
                    Discipline::Fifo | Discipline::Lifo { interval: None } => {}
                    Discipline::Lifo {
                        interval: Some(interval),
                    } => {
                        out.bound_duration("queue lifo interval", &interval, Positive);
                        out.large("queue lifo interval", Large::Duration(interval));
                    }
                    Discipline::Codel { target, interval } => {
                        out.bound_duration("queue codel target", &target, Positive);
                        out.bound_duration("queue codel interval", &interval, Positive);
                        out.large("queue codel target", Large::Duration(target));
                        out.large("queue codel interval", Large::Duration(interval));
                    }
                },
                BulkheadSetting::Timeout { value, .. } => {
                    out.bound_duration("timeout", &value, Positive);
                    out.large("timeout", Large::Duration(value));
                }
                BulkheadSetting::RejectWith { reject, .. } => reject.values(out),
                BulkheadSetting::Keys(k) => k.values(out),
                BulkheadSetting::Share(share) => share.values(out),
                BulkheadSetting::Per { .. } | BulkheadSetting::Isolation { .. } => {}
            }
        }
    }

    fn conflict(
        &self,
        a: &RuleDef,
        b: &RuleDef,
        _text: &dyn Fn(Span) -> String,
    ) -> Option<(String, &'static str)> {
        let x = BulkheadEff::of(&Bulkhead::from(a));
        let y = BulkheadEff::of(&Bulkhead::from(b));
        if x.per != y.per {
            return None;
        }
        let mc = |e: &BulkheadEff| match (e.max_concurrent, &e.adaptive) {
            (Some(m), _) => m.0.to_string(),
            (None, Some(a)) => format!("adaptive min {} max {}", a.min.node, a.max.node),
            (None, None) => "?".to_string(),
        };
        Some((
            format!("`max_concurrent {}` vs `max_concurrent {}`", mc(&x), mc(&y)),
            "merge them into one bulkhead; with two, only the smaller cap takes effect",
        ))
    }

    fn lower(&self, rule: &RuleDef, _l: &dyn LowerCx) -> pb::rule::Spec {
        let e = BulkheadEff::of(&Bulkhead::from(rule));
        let (max_keys, overflow) = e.keys.lower();
        pb::rule::Spec::Bulkhead(pb::Bulkhead {
            max_keys,
            overflow,
            key: match e.per {
                BulkheadKey::Operation => pb::BulkheadKey::Operation,
                BulkheadKey::Instance => pb::BulkheadKey::Instance,
                BulkheadKey::InstancePath => pb::BulkheadKey::InstancePath,
            } as i32,
            max_concurrent: match (e.max_concurrent, &e.adaptive) {
                (Some(m), _) => u32_of(m.0),
                (None, Some(a)) => u32_of(a.max.node),
                (None, None) => 0,
            },
            adaptive: e.adaptive.map(|a| pb::AdaptiveLimit {
                min: u32_of(a.min.node),
                max: u32_of(a.max.node),
            }),
            share: e.share.as_ref().map(Share::lower),
            max_wait_ms: unsigned(e.max_wait_ms),
            max_queue: e.queue.map(u32_of),
            queue: e.discipline.as_ref().map(lower_queue),
            timeout_ms: e.timeout_ms.map_or(0, unsigned),
            reject_status: u32_of(e.reject),
            reject_grpc_status: e.reject_grpc as i32,
            isolation: match e.isolation {
                Isolation::Semaphore => pb::Isolation::Semaphore,
                Isolation::Pool => pb::Isolation::Pool,
            } as i32,
        })
    }

    fn fields(&self, spec: &pb::rule::Spec, f: &mut Vec<(String, String)>) {
        let pb::rule::Spec::Bulkhead(b) = spec else {
            return;
        };
        let key = match b.key() {
            pb::BulkheadKey::Operation => "operation",
            pb::BulkheadKey::Instance => "instance",
            pb::BulkheadKey::InstancePath => "instance path",
        };
        push(f, "per", key.to_string());
        let max_concurrent = match &b.adaptive {
            Some(a) => format!("adaptive {}..{}", a.min, a.max),
            None => b.max_concurrent.to_string(),
        };
        push(f, "max_concurrent", max_concurrent);
        push(f, "max_wait", fmt_ms(b.max_wait_ms));
        if let Some(queue) = b.max_queue {
            push(f, "queue", queue.to_string());
        }
        if let Some(q) = b.queue.as_ref().and_then(|q| q.kind.as_ref()) {
            use pb::queue::Kind;
            let text = match q {
                Kind::Fifo(_) => "fifo".to_string(),
                Kind::Lifo(l) => format!("lifo interval {}", fmt_ms(l.interval_ms)),
                Kind::Codel(c) => format!(
                    "codel target {} interval {}",
                    fmt_ms(c.target_ms),
                    fmt_ms(c.interval_ms)
                ),
            };
            push(f, "queue discipline", text);
        }
        if b.timeout_ms != 0 {
            push(f, "timeout", fmt_ms(b.timeout_ms));
        }
        push(f, "reject with", b.reject_status.to_string());
        push(
            f,
            "reject with grpc_status",
            gov_proto::grpc::name(b.reject_grpc_status()).to_string(),
        );
        let isolation = if b.isolation() == pb::Isolation::Pool {
            "pool"
        } else {
            "semaphore"
        };
        push(f, "isolation", isolation.to_string());
        super::keys::fields(f, b.max_keys, b.overflow());
        if let Some(share) = &b.share {
            push(f, "share by consumer", Share::field(share));
        }
    }

    #[cfg(test)]
    fn decodes(&self, setting: &Setting) -> bool {
        let mut w = Words::of(setting);
        decode(&mut w).is_some() && w.done()
    }
}

/// A discipline on the wire (`queue fifo` is written too: it says so).
fn lower_queue(d: &Discipline) -> pb::Queue {
    use pb::queue::Kind;
    let ms = |d: &Spanned<Duration>| unsigned(millis(&d.node));
    pb::Queue {
        kind: Some(match d {
            Discipline::Fifo => Kind::Fifo(true),
            Discipline::Lifo { interval } => Kind::Lifo(pb::QueueLifo {
                interval_ms: interval.as_ref().map_or(LIFO_INTERVAL_MS, ms),
            }),
            Discipline::Codel { target, interval } => Kind::Codel(pb::QueueCodel {
                target_ms: ms(target),
                interval_ms: ms(interval),
            }),
        }),
    }
}
