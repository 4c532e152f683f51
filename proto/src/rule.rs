//! What every layer asks of a rule without matching on its kind: the kind
//! (read from the `spec` oneof, [`Spec::kind`] in `words.rs`), the kind's
//! settings when a layer does care, and a rule of a config by name.

use crate::v1::{Bulkhead, Fuse, Limit, Rule, RuleKind, TargetConfig, rule::Spec};

impl Rule {
    /// The kind of rule; `Unspecified` when no spec is set (a kind this
    /// build does not know decodes that way, and agents refuse it).
    pub fn kind(&self) -> RuleKind {
        self.spec.as_ref().map_or(RuleKind::Unspecified, Spec::kind)
    }

    /// The bulkhead settings, when the rule is a bulkhead.
    pub fn bulkhead(&self) -> Option<&Bulkhead> {
        match &self.spec {
            Some(Spec::Bulkhead(b)) => Some(b),
            _ => None,
        }
    }

    /// The limit settings, when the rule is a limit.
    pub fn limit(&self) -> Option<&Limit> {
        match &self.spec {
            Some(Spec::Limit(l)) => Some(l),
            _ => None,
        }
    }

    /// The fuse settings, when the rule is a fuse.
    pub fn fuse(&self) -> Option<&Fuse> {
        match &self.spec {
            Some(Spec::Fuse(f)) => Some(f),
            _ => None,
        }
    }
}

impl TargetConfig {
    /// The rule called `name` (`service/rule`).
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }
}
