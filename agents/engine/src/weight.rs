//! The instance's slow-start weight, as the agent's warmup ramp sets it
//! ([`crate::Engine::set_warmup_weight`]): limits with `scale with warmup`
//! admit their calls amount times it (Sentinel's cold factor), at least one
//! call per window.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Full weight, in thousandths of a percent (as `Lifecycle` reports it).
pub const FULL_WEIGHT: u32 = 100_000;

/// One engine's weight, shared by its limits. Full until told otherwise.
#[derive(Clone, Debug)]
pub(crate) struct Weight(Arc<AtomicU32>);

impl Default for Weight {
    fn default() -> Self {
        Self(Arc::new(AtomicU32::new(FULL_WEIGHT)))
    }
}

impl Weight {
    pub(crate) fn set(&self, milli_percent: u32) {
        self.0.store(milli_percent.min(FULL_WEIGHT), Relaxed);
    }

    #[inline]
    pub(crate) fn get(&self) -> u32 {
        self.0.load(Relaxed)
    }
}

/// `amount` at `weight`: rounded down, at least 1 (a ramping instance is
/// never refused everything).
#[inline]
pub(crate) fn scaled(amount: u64, weight: u32) -> u64 {
    if weight >= FULL_WEIGHT {
        return amount;
    }
    let scaled = u128::from(amount) * u128::from(weight) / u128::from(FULL_WEIGHT);
    u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_down_to_one_and_never_above_the_amount() {
        assert_eq!(scaled(100, 25_000), 25);
        assert_eq!(scaled(100, 0), 1);
        assert_eq!(scaled(3, 10_000), 1);
        assert_eq!(scaled(100, FULL_WEIGHT), 100);
        assert_eq!(
            scaled(u64::MAX, 99_999),
            u64::MAX / 100_000 * 99_999 + (u64::MAX % 100_000) * 99_999 / 100_000
        );
        let w = Weight::default();
        w.set(500_000);
        assert_eq!(w.get(), FULL_WEIGHT);
    }
}
