//! The rejection counts of a rule ([`Rejections`]) and the reasons they count
//! ([`RejectReason`]), read the same way by every layer that sums, shows or
//! compares them (the agent's stats and `/metrics`, govd's view and canary,
//! `govc status`, the demo's summary, the TUI's history).
//!
//! A reason is declared once, in `control.proto`: a `uint64` field of
//! `Rejections` and a `RejectReason` value of the same name and number,
//! naming the kind of rule that rejects for it (`reason_kind`). The build
//! generates what follows from the two ([`REASONS`], [`NAMES`],
//! [`LABELS`], [`Rejections::by_reason`], [`Rejections::add`],
//! [`Rejections::from_counts`], [`RejectReason::ALL`], and the engine's
//! [`Reason`]) and refuses to build when they disagree, so no reader can
//! leave a new reason's count out.

use crate::v1::{RejectReason, Rejections, RuleKind};

include!(concat!(env!("OUT_DIR"), "/reasons.rs"));

impl Rejections {
    /// Every reason's count, summed.
    pub fn total(&self) -> u64 {
        self.by_reason()
            .iter()
            .fold(0, |sum, (_, n)| sum.saturating_add(*n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10, 20, 30, ... for the reasons in order.
    fn counts() -> [u64; REASONS] {
        std::array::from_fn(|i| 10 * (i as u64 + 1))
    }

    #[test]
    fn every_reason_is_named_summed_and_added() {
        let r = Rejections::from_counts(counts());
        assert_eq!(r.bulkhead_full, 10);
        assert_eq!(r.limit_bytes, 40);
        let names: Vec<&str> = r.by_reason().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, NAMES);
        assert_eq!(
            &NAMES[..3],
            ["bulkhead_full", "bulkhead_timeout", "limit_calls"]
        );
        let total: u64 = counts().iter().sum();
        assert_eq!(r.total(), total);
        let mut sum = r;
        sum.add(&r);
        assert_eq!(sum.total(), 2 * total);
        assert_eq!(sum.timeout, 2 * r.timeout);
        let mut top = Rejections {
            fuse_open: u64::MAX,
            ..Rejections::default()
        };
        top.add(&r);
        assert_eq!(top.fuse_open, u64::MAX, "saturates");
    }

    #[test]
    fn each_reason_indexes_its_own_count() {
        let r = Rejections::from_counts(counts());
        for (i, reason) in RejectReason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), Some(i));
            assert_eq!(r.by_reason()[i], (reason.name(), counts()[i]));
            let wire = format!("REJECT_REASON_{}", reason.name().to_uppercase());
            assert_eq!(wire, reason.as_str_name());
            assert_eq!(LABELS[i], reason.name().replace('_', " "));
        }
        assert_eq!(RejectReason::Unspecified.index(), None);
    }
}
