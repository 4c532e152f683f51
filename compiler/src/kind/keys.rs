//! `max_keys N` and `overflow share|reject`: the key table of a keyed limit
//! (`per consumer`, `per service`) or bulkhead (`per instance [path]`),
//! shared by both kinds. Checked by `gov::key-cap`.
//!
//! ```gov
//! limit per_consumer on orders {
//!   calls 100 per 1m
//!   per consumer
//!   max_keys 20000
//!   overflow reject
//! }
//! ```

use gov_lang::ast::{Span, Spanned};
use gov_proto::v1 as pb;

use super::{Bound, Values, Words};
use crate::units::{push, u32_of};

/// The most keys one rule may track (the agents refuse more).
pub(crate) const MAX_MAX_KEYS: i64 = gov_proto::compiled::MAX_KEYS_PER_RULE as i64;

/// One key-table setting.
#[derive(Clone, Debug)]
pub(crate) enum KeySetting {
    /// `max_keys N`
    MaxKeys { value: Spanned<i64>, span: Span },
    /// `overflow share|reject`
    Overflow { reject: bool, span: Span },
}

impl KeySetting {
    /// Decodes the rest of a setting that starts with `key`; `None` when it
    /// is no key-table setting.
    pub(crate) fn decode(key: &str, w: &mut Words<'_>) -> Option<Self> {
        let span = w.span;
        Some(match key {
            "max_keys" => KeySetting::MaxKeys {
                value: w.int()?,
                span,
            },
            "overflow" => KeySetting::Overflow {
                reject: match w.key()?.node {
                    "share" => false,
                    "reject" => true,
                    _ => return None,
                },
                span,
            },
            _ => return None,
        })
    }

    pub(crate) fn key(&self) -> &'static str {
        match self {
            KeySetting::MaxKeys { .. } => "max_keys",
            KeySetting::Overflow { .. } => "overflow",
        }
    }

    pub(crate) fn span(&self) -> Span {
        match self {
            KeySetting::MaxKeys { span, .. } | KeySetting::Overflow { span, .. } => *span,
        }
    }

    pub(crate) fn values(&self, out: &mut Values) {
        if let KeySetting::MaxKeys { value, .. } = self {
            out.bound("max_keys", value.node, value.span, Bound::Positive);
        }
    }
}

/// The effective key table: `max_keys` (`None`: the agent's flag) and
/// whether past it new keys are refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeysEff {
    pub max_keys: Option<i64>,
    pub reject: bool,
}

impl KeysEff {
    /// Applies one setting (settings are applied last to first).
    pub(crate) fn apply(&mut self, s: &KeySetting) {
        match s {
            KeySetting::MaxKeys { value, .. } => self.max_keys = Some(value.node),
            KeySetting::Overflow { reject, .. } => self.reject = *reject,
        }
    }

    /// `(max_keys, overflow)` on the wire.
    pub(crate) fn lower(&self) -> (u32, i32) {
        let overflow = if self.reject {
            pb::KeyOverflow::Reject
        } else {
            pb::KeyOverflow::Share
        };
        (self.max_keys.map_or(0, u32_of), overflow as i32)
    }
}

/// The plan's fields of a key table, only when the policy sets one (so
/// that a plan without them reads as before).
pub(crate) fn fields(f: &mut Vec<(String, String)>, max_keys: u32, overflow: pb::KeyOverflow) {
    if max_keys > 0 {
        push(f, "max_keys", max_keys.to_string());
    }
    if overflow == pb::KeyOverflow::Reject {
        push(f, "overflow", "reject".to_string());
    }
}
