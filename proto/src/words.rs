//! The words users read for the wire's enums, written once: the TUI, `govc`,
//! the engine's errors and the plan all take them from here.

use crate::v1::{Phase, ReleaseKind, RuleKind};

impl RuleKind {
    /// The keyword of the kind in `.gov` text (`bulkhead`, `limit`, ...);
    /// `service` for a service's own settings, `-` when unspecified.
    pub fn word(self) -> &'static str {
        match self {
            RuleKind::Bulkhead => "bulkhead",
            RuleKind::Limit => "limit",
            RuleKind::Fuse => "fuse",
            RuleKind::Match => "match",
            RuleKind::Warmup => "warmup",
            RuleKind::Shutdown => "shutdown",
            RuleKind::Service => "service",
            RuleKind::Unspecified => "-",
        }
    }
}

impl ReleaseKind {
    /// `fuse` or `limit`, as in `govc release fuse RULE`.
    pub fn word(self) -> &'static str {
        match self {
            ReleaseKind::Fuse => RuleKind::Fuse.word(),
            ReleaseKind::Limit => RuleKind::Limit.word(),
        }
    }
}

impl Phase {
    /// `STARTING`, `WARMING`, `READY`, `DRAINING`, `STOPPED`; `-` when unknown.
    /// The same words in `govc status`, the TUI and the demo's summary.
    pub fn word(self) -> &'static str {
        match self {
            Phase::Unspecified => "-",
            Phase::Starting => "STARTING",
            Phase::Warming => "WARMING",
            Phase::Ready => "READY",
            Phase::Draining => "DRAINING",
            Phase::Stopped => "STOPPED",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_distinct_word() {
        // 4 is reserved (the old unproducible timeout kind).
        let words: Vec<&str> = (0..=16)
            .filter_map(|n| RuleKind::try_from(n).ok())
            .map(RuleKind::word)
            .collect();
        assert_eq!(words.len(), 8);
        let mut unique = words.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), words.len(), "{words:?}");
    }
}
