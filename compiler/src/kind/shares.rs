//! Every `share by consumer` of a rule, whichever its kind (a bulkhead's
//! or a limit's), for the checks that read every share the same way.

use gov_lang::ast::{Ident, MatchExpr};

use super::Rule;
use super::bulkhead::{Bulkhead, BulkheadSetting};
use super::limit::{Limit, LimitSetting};
use super::share::Share;

/// A `share by consumer` of a bulkhead or a limit, for the checks that
/// read every share the same way.
pub(crate) struct RuleShare<'a> {
    /// `bulkhead` or `limit`.
    pub kind: &'static str,
    pub name: &'a Ident,
    pub on: &'a MatchExpr,
    pub share: Share,
}

/// The shares `rule` declares (a bulkhead's or a limit's; one unless a
/// share is written twice, which is `gov::duplicate-setting`).
pub(crate) fn of<'a>(rule: &Rule<'a>) -> Vec<RuleShare<'a>> {
    let shares = |kind, name, on, shares: Vec<Share>| {
        shares
            .into_iter()
            .map(|share| RuleShare {
                kind,
                name,
                on,
                share,
            })
            .collect()
    };
    if let Some(b) = Bulkhead::of(rule) {
        let found = b.settings.into_iter().filter_map(|s| match s {
            BulkheadSetting::Share(share) => Some(share),
            _ => None,
        });
        return shares("bulkhead", b.name, b.on, found.collect());
    }
    if let Some(l) = Limit::of(rule) {
        let found = l.settings.into_iter().filter_map(|s| match s {
            LimitSetting::Share(share) => Some(share),
            _ => None,
        });
        return shares("limit", l.name, l.on, found.collect());
    }
    Vec::new()
}
