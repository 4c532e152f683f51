//! `share by consumer { crm 3  web 1  default 1 }`: a bulkhead's permits,
//! or a limit's calls per window, shared between the consumers of its calls
//! by weight (docs/language.md, "Fair share"). `default` weighs every consumer the share does not name,
//! and calls without one (1 unless written). Checked by
//! `gov::share-weights`, `gov::share-without-consumer` and
//! `gov::lint::share-unknown-consumer`.
//!
//! ```gov
//! bulkhead slow_calls on slow {
//!   max_concurrent 10
//!   max_wait 50ms
//!   share by consumer { crm 3 web 1 default 1 }
//! }
//! ```

use gov_lang::ast::{Span, Spanned};
use gov_proto::v1 as pb;

use super::{Bound, Large, Values, Words};
use crate::units::u32_of;

/// The most consumers one share names (the agents refuse more).
pub(crate) const MAX_CONSUMERS: usize = 64;

/// The `default` weight when the share does not write one.
pub(crate) const DEFAULT_WEIGHT: i64 = 1;

/// `share by consumer { ... }` as written.
#[derive(Clone, Debug)]
pub(crate) struct Share {
    /// Each consumer and its weight, in the order written (`default` too).
    pub weights: Vec<(Spanned<String>, Spanned<i64>)>,
    /// The whole setting.
    pub span: Span,
}

impl Share {
    /// Decodes the rest of a setting that starts with `share`.
    pub(crate) fn decode(w: &mut Words<'_>) -> Option<Self> {
        let span = w.span;
        w.expect("by")?;
        w.expect("consumer")?;
        w.expect("{")?;
        let mut weights = Vec::new();
        while w.expect("}").is_none() {
            let name = match w.name() {
                Some(n) => n,
                None => w.string()?,
            };
            weights.push((name, w.int()?));
        }
        Some(Share { weights, span })
    }

    /// Whether `name` is the `default` class (written as a bare word).
    pub(crate) fn is_default(name: &str) -> bool {
        name == "default"
    }

    /// The consumers it names (without `default`).
    pub(crate) fn consumers(&self) -> impl Iterator<Item = &Spanned<String>> {
        self.weights
            .iter()
            .map(|(n, _)| n)
            .filter(|n| !Self::is_default(&n.node))
    }

    /// Hands its weights to `gov::non-positive` and `gov::too-large`.
    pub(crate) fn values(&self, out: &mut Values) {
        for (name, weight) in &self.weights {
            let what = format!("share weight of {}", name.node);
            out.bound(&what, weight.node, weight.span, Bound::Positive);
            out.large(&what, Large::Count(weight.clone()));
        }
    }

    /// The wire's `FairShare` (the first of a consumer named twice, which is
    /// `gov::share-weights`).
    pub(crate) fn lower(&self) -> pb::FairShare {
        let mut share = pb::FairShare {
            weights: Vec::new(),
            default_weight: 0,
        };
        for (name, weight) in &self.weights {
            if Self::is_default(&name.node) {
                if share.default_weight == 0 {
                    share.default_weight = u32_of(weight.node);
                }
            } else if !share.weights.iter().any(|w| w.consumer == name.node) {
                share.weights.push(pb::ShareWeight {
                    consumer: name.node.clone(),
                    weight: u32_of(weight.node),
                });
            }
        }
        if share.default_weight == 0 {
            share.default_weight = u32_of(DEFAULT_WEIGHT);
        }
        share
    }

    /// How a plan shows it: `crm 3, web 1, default 1`.
    pub(crate) fn field(s: &pb::FairShare) -> String {
        let mut parts: Vec<String> = s
            .weights
            .iter()
            .map(|w| format!("{} {}", w.consumer, w.weight))
            .collect();
        parts.push(format!("default {}", s.default_weight));
        parts.join(", ")
    }
}
