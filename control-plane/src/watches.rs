//! Watch streams per caller: one token opens at most
//! `--max-watches-per-token` at once. Each stream holds a copy of the
//! cluster view in flight; 500 streams of one viewer took govd to 2-3 GB
//! (issue 28).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The Watch streams open, by the caller's name (the token's name).
#[derive(Debug, Default)]
pub struct Watches {
    open: Mutex<HashMap<String, usize>>,
    refused: AtomicU64,
}

/// One open stream; given back when dropped (the stream ended).
#[derive(Debug)]
pub struct WatchSlot {
    watches: Arc<Watches>,
    caller: String,
}

// === impl Watches ===

impl Watches {
    /// A slot for one more stream of `caller`, unless it holds `max`.
    pub fn open(self: &Arc<Self>, caller: &str, max: usize) -> Option<WatchSlot> {
        let mut open = self.lock();
        let n = open.entry(caller.to_owned()).or_insert(0);
        if *n >= max {
            drop(open);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *n += 1;
        Some(WatchSlot {
            watches: self.clone(),
            caller: caller.to_owned(),
        })
    }

    /// `govd_watch_streams` and `govd_watch_refusals_total`.
    pub fn render(&self, enc: &mut gov_common::prom::Encoder) {
        enc.family(
            "govd_watch_streams",
            "gauge",
            "Watch streams open now (TUIs), all tokens together.",
        );
        let open: usize = self.lock().values().sum();
        enc.sample("govd_watch_streams", &[], open as u64);
        enc.family(
            "govd_watch_refusals_total",
            "counter",
            "Watch streams refused because their token had --max-watches-per-token open.",
        );
        let refused = self.refused.load(Ordering::Relaxed);
        enc.sample("govd_watch_refusals_total", &[], refused);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.watches.lock();
        if let Some(n) = open.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_holds_at_most_its_cap_and_a_closed_stream_frees_a_slot() {
        let watches = Arc::new(Watches::default());
        let a = watches.open("board", 2).unwrap();
        let _b = watches.open("board", 2).unwrap();
        assert!(watches.open("board", 2).is_none());
        // Another token has its own slots.
        assert!(watches.open("alice", 2).is_some());
        drop(a);
        assert!(watches.open("board", 2).is_some());
        assert_eq!(watches.refused.load(Ordering::Relaxed), 1);
    }
}
