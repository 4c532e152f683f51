//! The rejection counts of a rule ([`Rejections`]), read the same way by
//! every layer that sums, shows or compares them (govd's view and canary,
//! `govc status`, the demo's summary, the TUI's history).
//!
//! Each function takes the message apart without `..`: a reason added to
//! the message does not compile until it is named here, so no reader
//! silently leaves its count out.

use crate::v1::Rejections;

/// How many reasons a rule's calls are rejected for.
pub const REASONS: usize = 6;

impl Rejections {
    /// Each count with its reason's name (the names of `/metrics` and the
    /// decision log), in the message's order.
    pub fn by_reason(&self) -> [(&'static str, u64); REASONS] {
        let Rejections {
            bulkhead_full,
            bulkhead_timeout,
            limit_calls,
            limit_bytes,
            fuse_open,
            timeout,
        } = *self;
        [
            ("bulkhead_full", bulkhead_full),
            ("bulkhead_timeout", bulkhead_timeout),
            ("limit_calls", limit_calls),
            ("limit_bytes", limit_bytes),
            ("fuse_open", fuse_open),
            ("timeout", timeout),
        ]
    }

    /// Every reason's count, summed.
    pub fn total(&self) -> u64 {
        self.by_reason()
            .iter()
            .fold(0, |sum, (_, n)| sum.saturating_add(*n))
    }

    /// Adds `other`'s counts, reason by reason.
    pub fn add(&mut self, other: &Rejections) {
        let Rejections {
            bulkhead_full,
            bulkhead_timeout,
            limit_calls,
            limit_bytes,
            fuse_open,
            timeout,
        } = *other;
        self.bulkhead_full = self.bulkhead_full.saturating_add(bulkhead_full);
        self.bulkhead_timeout = self.bulkhead_timeout.saturating_add(bulkhead_timeout);
        self.limit_calls = self.limit_calls.saturating_add(limit_calls);
        self.limit_bytes = self.limit_bytes.saturating_add(limit_bytes);
        self.fuse_open = self.fuse_open.saturating_add(fuse_open);
        self.timeout = self.timeout.saturating_add(timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_named_summed_and_added() {
        let r = Rejections {
            bulkhead_full: 1,
            bulkhead_timeout: 2,
            limit_calls: 3,
            limit_bytes: 4,
            fuse_open: 5,
            timeout: 6,
        };
        let names: Vec<&str> = r.by_reason().iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "bulkhead_full",
                "bulkhead_timeout",
                "limit_calls",
                "limit_bytes",
                "fuse_open",
                "timeout"
            ]
        );
        assert_eq!(r.total(), 21);
        let mut sum = r;
        sum.add(&r);
        assert_eq!(sum.total(), 42);
        assert_eq!(sum.timeout, 12);
        let mut top = Rejections {
            fuse_open: u64::MAX,
            ..Rejections::default()
        };
        top.add(&r);
        assert_eq!(top.fuse_open, u64::MAX, "saturates");
    }
}
