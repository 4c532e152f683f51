//! `retry NAME on EXPR { ... }`: outbound calls only. An attempt that ends
//! with one of `on`'s outcomes before any byte of its response reached the
//! client is sent again, to another instance when there is one, at most
//! `attempts` times in all, each retry paid from the rule's `budget` (which
//! every retry rule must declare: `gov::retry-without-budget`).
//!
//! ```gov
//! retry checkout_retries on calls to checkout {
//!   attempts 3
//!   on connect_failure reset status 502 503 grpc_status UNAVAILABLE
//!   backoff 25ms max 250ms jitter
//!   per_try_timeout 300ms
//!   budget 20% min 10 per 1s
//!   methods GET HEAD PUT DELETE
//! }
//! ```

use gov_lang::ast::{Duration, Ident, MatchExpr, Percent, RuleDef, Setting, Span, Spanned};
use gov_proto::v1 as pb;

use super::fuse::{ClassifyItem, class, class_text, classify_items, classify_values};
use super::{Bound, Large, LowerCx, Rule, Values, Words};
use crate::units::{fmt_milli_percent, fmt_ms, millis, push, u32_of, unsigned};

#[derive(Clone, Debug)]
pub(crate) enum RetrySetting {
    /// `attempts N`
    Attempts { value: Spanned<i64> },
    /// `on ITEM...`
    On { items: Vec<ClassifyItem> },
    /// `backoff D max D [jitter]`
    Backoff {
        base: Spanned<Duration>,
        max: Spanned<Duration>,
        jitter: bool,
    },
    /// `per_try_timeout D`
    PerTry { value: Spanned<Duration> },
    /// `budget P% min N per D`
    Budget(Budget),
    /// `methods NAME...`
    Methods { names: Vec<Spanned<String>> },
}

/// `budget P% min N per D`
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    pub percent: Spanned<Percent>,
    pub min: Spanned<i64>,
    pub per: Spanned<Duration>,
}

/// A retry rule with its settings decoded.
pub(crate) struct Retry<'a> {
    pub name: &'a Ident,
    pub on: &'a MatchExpr,
    pub settings: Vec<RetrySetting>,
}

/// The attempts when `attempts` is not written: one retry.
pub(crate) const DEFAULT_ATTEMPTS: i64 = 2;

/// The kind.
pub(crate) struct Kind;

fn decode(w: &mut Words<'_>) -> Option<RetrySetting> {
    use RetrySetting as S;
    Some(match w.key()?.node {
        "attempts" => S::Attempts { value: w.int()? },
        "on" => S::On {
            items: classify_items(w)?,
        },
        "backoff" => {
            let base = w.duration()?;
            w.expect("max")?;
            let max = w.duration()?;
            S::Backoff {
                base,
                max,
                jitter: w.expect("jitter").is_some(),
            }
        }
        "per_try_timeout" => S::PerTry {
            value: w.duration()?,
        },
        "budget" => {
            let percent = w.percent()?;
            w.expect("min")?;
            let min = w.int()?;
            w.expect("per")?;
            S::Budget(Budget {
                percent,
                min,
                per: w.duration()?,
            })
        }
        "methods" => {
            let mut names = Vec::new();
            while let Some(n) = w.name() {
                names.push(n);
            }
            S::Methods { names }
        }
        _ => return None,
    })
}

impl<'a> Retry<'a> {
    /// The rule as a retry rule, if it is one.
    pub fn of(rule: &Rule<'a>) -> Option<Self> {
        (rule.imp.wire() == pb::RuleKind::Retry).then(|| Self::from(rule.def))
    }

    fn from(def: &'a RuleDef) -> Self {
        Retry {
            name: &def.name,
            on: &def.on,
            settings: super::decode(def, decode),
        }
    }

    /// Its `budget` (the first when written twice).
    pub fn budget(&self) -> Option<&Budget> {
        self.settings.iter().find_map(|s| match s {
            RetrySetting::Budget(b) => Some(b),
            _ => None,
        })
    }

    /// The spec, every default written out (the first of a setting written
    /// twice wins).
    pub(crate) fn spec(&self) -> pb::Retry {
        let mut r = pb::Retry {
            attempts: u32_of(DEFAULT_ATTEMPTS),
            ..pb::Retry::default()
        };
        let mut on = None;
        for s in self.settings.iter().rev() {
            match s {
                RetrySetting::Attempts { value } => r.attempts = u32_of(value.node),
                RetrySetting::On { items } => on = Some(class(items)),
                RetrySetting::Backoff { base, max, jitter } => {
                    r.backoff_ms = unsigned(millis(&base.node));
                    r.backoff_max_ms = unsigned(millis(&max.node));
                    r.jitter = *jitter;
                }
                RetrySetting::PerTry { value } => {
                    r.per_try_timeout_ms = unsigned(millis(&value.node));
                }
                RetrySetting::Budget(b) => {
                    r.budget = Some(pb::RetryBudget {
                        ratio_milli_percent: u32_of(b.percent.node.milli),
                        min_retries: u32_of(b.min.node),
                        per_ms: unsigned(millis(&b.per.node)),
                    });
                }
                RetrySetting::Methods { names } => {
                    r.methods = names.iter().map(|n| n.node.to_ascii_uppercase()).collect();
                }
            }
        }
        r.on = Some(on.unwrap_or_else(pb::Retry::default_on));
        if r.backoff_ms == 0 && r.backoff_max_ms == 0 {
            (r.backoff_ms, r.backoff_max_ms) = pb::Retry::DEFAULT_BACKOFF_MS;
            r.jitter = true;
        }
        if r.methods.is_empty() {
            r.methods = pb::Retry::DEFAULT_METHODS.map(String::from).to_vec();
        }
        r
    }
}

fn budget_text(b: &pb::RetryBudget) -> String {
    format!(
        "{} min {} per {}",
        fmt_milli_percent(i64::from(b.ratio_milli_percent)),
        b.min_retries,
        fmt_ms(b.per_ms)
    )
}

impl super::Kind for Kind {
    fn wire(&self) -> pb::RuleKind {
        pb::RuleKind::Retry
    }

    /// A retry rule retries on its defaults; the one setting it cannot do
    /// without, `budget`, has its own check (`gov::retry-without-budget`).
    fn missing(&self, _rule: &RuleDef) -> Option<(&'static str, &'static str)> {
        None
    }

    fn setting_key(&self, setting: &Setting) -> Option<&'static str> {
        Some(match decode(&mut Words::of(setting))? {
            RetrySetting::Attempts { .. } => "attempts",
            RetrySetting::On { .. } => "on",
            RetrySetting::Backoff { .. } => "backoff",
            RetrySetting::PerTry { .. } => "per_try_timeout",
            RetrySetting::Budget(_) => "budget",
            RetrySetting::Methods { .. } => "methods",
        })
    }

    fn values(&self, rule: &RuleDef, _text: &dyn Fn(Span) -> String, out: &mut Values) {
        use Bound::{NotNegative, Positive};
        for s in Retry::from(rule).settings {
            match s {
                RetrySetting::Attempts { value } => {
                    out.bound("attempts", value.node, value.span, Positive);
                    out.large("attempts", Large::Count(value));
                }
                RetrySetting::On { items } => classify_values(items, out),
                RetrySetting::Backoff { base, max, .. } => {
                    out.bound_duration("backoff", &base, Positive);
                    out.bound_duration("backoff max", &max, Positive);
                    out.large("backoff", Large::Duration(base));
                    out.large("backoff max", Large::Duration(max));
                }
                RetrySetting::PerTry { value } => {
                    out.bound_duration("per_try_timeout", &value, Positive);
                    out.large("per_try_timeout", Large::Duration(value));
                }
                RetrySetting::Budget(b) => {
                    out.bound("budget min", b.min.node, b.min.span, NotNegative);
                    out.large("budget min", Large::Count(b.min));
                    out.bound_duration("budget per", &b.per, Positive);
                    out.large("budget per", Large::Duration(b.per));
                }
                RetrySetting::Methods { .. } => {}
            }
        }
    }

    fn conflict(
        &self,
        a: &RuleDef,
        b: &RuleDef,
        _text: &dyn Fn(Span) -> String,
    ) -> Option<(String, &'static str)> {
        let (x, y) = (Retry::from(a).spec(), Retry::from(b).spec());
        let help = "one retry rule applies to a call: merge them into one";
        if x.attempts != y.attempts {
            return Some((
                format!("`attempts {}` vs `attempts {}`", x.attempts, y.attempts),
                help,
            ));
        }
        match (&x.budget, &y.budget) {
            (Some(p), Some(q)) if p != q => Some((
                format!("`budget {}` vs `budget {}`", budget_text(p), budget_text(q)),
                help,
            )),
            _ => None,
        }
    }

    fn lower(&self, rule: &RuleDef, _l: &dyn LowerCx) -> pb::rule::Spec {
        pb::rule::Spec::Retry(Retry::from(rule).spec())
    }

    fn fields(&self, spec: &pb::rule::Spec, f: &mut Vec<(String, String)>) {
        let pb::rule::Spec::Retry(x) = spec else {
            return;
        };
        push(f, "attempts", x.attempts.to_string());
        if let Some(on) = &x.on {
            push(f, "on", class_text(on));
        }
        let jitter = if x.jitter { " jitter" } else { "" };
        push(
            f,
            "backoff",
            format!(
                "{} max {}{jitter}",
                fmt_ms(x.backoff_ms),
                fmt_ms(x.backoff_max_ms)
            ),
        );
        let per_try = match x.per_try_timeout_ms {
            0 => "none".to_string(),
            ms => fmt_ms(ms),
        };
        push(f, "per_try_timeout", per_try);
        if let Some(b) = &x.budget {
            push(f, "budget", budget_text(b));
        }
        push(f, "methods", x.methods.join(" "));
    }

    #[cfg(test)]
    fn decodes(&self, setting: &Setting) -> bool {
        let mut w = Words::of(setting);
        decode(&mut w).is_some() && w.done()
    }
}
