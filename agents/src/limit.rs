//! Limits: calls and bytes per window, per key (all, domain, service,
//! consumer), with an optional latch.
//!
//! Calls are counted exactly in a fixed window (one atomic word holds the
//! window number and the count, updated by compare-exchange). Bytes
//! (request + response) are added as the proxy streams them, after
//! admission; a call is refused when the window's bytes have reached the
//! amount. Without `release`, counters simply reset every window. With
//! `release after D` or `release manual`, an exceeded limit *engages*: every
//! call of that key is refused until the timer ends or an operator releases it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{LimitSpec, RateSpec, ReleaseSpec};
use crate::events::{EventKind, Events};
use crate::rejection::RejectReason;
use crate::route::FxBuild;
use crate::stats::Counters;

/// Most keys (consumers, services) one limit tracks; beyond that idle keys
/// are dropped, and if none is idle new keys share the rule's overflow counter.
pub const MAX_KEYS: usize = 4096;

const NOT_ENGAGED: u64 = 0;
const MANUAL: u64 = u64::MAX;

/// The counters of one key.
#[derive(Debug, Default)]
pub(crate) struct LimitCell {
    /// `(window number as u32) << 32 | calls in that window`.
    calls: AtomicU64,
    bytes_window: AtomicU64,
    bytes: AtomicU64,
    /// `NOT_ENGAGED`, `MANUAL`, or engaged until this many ms after the epoch.
    engaged_until: AtomicU64,
    engaged_reason: AtomicU8,
}

/// Which key's counters a call uses.
#[derive(Clone, Debug)]
pub(crate) enum CellRef {
    Single,
    Keyed(Arc<LimitCell>),
}

/// A limit was exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub reason: RejectReason,
    /// Until the current window ends (when the call would fit again), or
    /// until an engaged limit releases itself; `None` for manual release.
    pub wait: Option<Duration>,
    /// Whether the limit is engaged (shaping cannot help).
    pub engaged: bool,
}

#[derive(Debug)]
pub(crate) struct Limit {
    pub(crate) spec: LimitSpec,
    name: Arc<str>,
    events: Events,
    epoch: Instant,
    single: LimitCell,
    keyed: RwLock<HashMap<Box<str>, Arc<LimitCell>, FxBuild>>,
    pub(crate) counters: Counters,
}

fn pack(window: u64, count: u64) -> u64 {
    ((window & 0xffff_ffff) << 32) | count.min(0xffff_ffff)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Limit {
    pub(crate) fn new(spec: LimitSpec, name: Arc<str>, events: Events) -> Self {
        Self {
            spec,
            name,
            events,
            epoch: Instant::now(),
            single: LimitCell::default(),
            keyed: RwLock::default(),
            counters: Counters::default(),
        }
    }

    fn now_ms(&self, now: Instant) -> u64 {
        ms(now.saturating_duration_since(self.epoch))
    }

    /// The counters for `key` (`None`: the rule's single counter).
    pub(crate) fn cell_for(&self, key: Option<&str>) -> CellRef {
        let Some(key) = key else {
            return CellRef::Single;
        };
        if let Ok(map) = self.keyed.read()
            && let Some(cell) = map.get(key)
        {
            return CellRef::Keyed(cell.clone());
        }
        let Ok(mut map) = self.keyed.write() else {
            return CellRef::Single;
        };
        if map.len() >= MAX_KEYS && !map.contains_key(key) {
            let now_ms = self.now_ms(Instant::now());
            map.retain(|_, c| Arc::strong_count(c) > 1 || self.is_engaged(c, now_ms));
            if map.len() >= MAX_KEYS {
                return CellRef::Single;
            }
        }
        CellRef::Keyed(map.entry(key.into()).or_default().clone())
    }

    pub(crate) fn cell<'a>(&'a self, r: &'a CellRef) -> &'a LimitCell {
        match r {
            CellRef::Single => &self.single,
            CellRef::Keyed(c) => c,
        }
    }

    fn is_engaged(&self, cell: &LimitCell, now_ms: u64) -> bool {
        match cell.engaged_until.load(Relaxed) {
            NOT_ENGAGED => false,
            until => until == MANUAL || now_ms < until,
        }
    }

    fn window_left(rate: &RateSpec, now_ms: u64) -> Duration {
        let w = ms(rate.window).max(1);
        Duration::from_millis(w - now_ms % w)
    }

    /// Counts one call against the key's counters, or says why it does not fit.
    pub(crate) fn try_admit(&self, cell: &LimitCell, now: Instant) -> Result<(), Exceeded> {
        let now_ms = self.now_ms(now);
        let until = cell.engaged_until.load(Relaxed);
        if until != NOT_ENGAGED {
            if until == MANUAL || now_ms < until {
                return Err(Exceeded {
                    reason: reason_from(cell.engaged_reason.load(Relaxed)),
                    wait: (until != MANUAL).then(|| Duration::from_millis(until - now_ms)),
                    engaged: true,
                });
            }
            // `release after` has elapsed: whoever sees it first releases.
            if cell
                .engaged_until
                .compare_exchange(until, NOT_ENGAGED, Relaxed, Relaxed)
                .is_ok()
            {
                self.events.emit(
                    EventKind::LimitReleased,
                    &self.name,
                    "released after its `release after` time".into(),
                );
            }
        }
        if let Some(rate) = &self.spec.bytes {
            let window = now_ms / ms(rate.window).max(1);
            let used = if cell.bytes_window.load(Relaxed) == window {
                cell.bytes.load(Relaxed)
            } else {
                0
            };
            if used >= rate.amount {
                return Err(Exceeded {
                    reason: RejectReason::LimitBytes,
                    wait: Some(Self::window_left(rate, now_ms)),
                    engaged: false,
                });
            }
        }
        if let Some(rate) = &self.spec.calls {
            let window = (now_ms / ms(rate.window).max(1)) & 0xffff_ffff;
            let mut current = cell.calls.load(Relaxed);
            loop {
                let count = if current >> 32 == window {
                    current & 0xffff_ffff
                } else {
                    0
                };
                if count >= rate.amount {
                    return Err(Exceeded {
                        reason: RejectReason::LimitCalls,
                        wait: Some(Self::window_left(rate, now_ms)),
                        engaged: false,
                    });
                }
                match cell.calls.compare_exchange_weak(
                    current,
                    pack(window, count + 1),
                    Relaxed,
                    Relaxed,
                ) {
                    Ok(_) => break,
                    Err(actual) => current = actual,
                }
            }
        }
        Ok(())
    }

    /// The call is refused: engage the latch if the limit has one. Returns
    /// the `Retry-After` to send.
    pub(crate) fn refuse(&self, cell: &LimitCell, e: Exceeded, now: Instant) -> Option<Duration> {
        if e.engaged {
            return e.wait;
        }
        let Some(release) = self.spec.release else {
            return e.wait;
        };
        let now_ms = self.now_ms(now);
        let (until, wait) = match release {
            ReleaseSpec::After(d) => (now_ms.saturating_add(ms(d)).max(1), Some(d)),
            ReleaseSpec::Manual => (MANUAL, None),
        };
        cell.engaged_reason.store(e.reason as u8, Relaxed);
        if cell
            .engaged_until
            .compare_exchange(NOT_ENGAGED, until, Relaxed, Relaxed)
            .is_ok()
        {
            let what = match e.reason {
                RejectReason::LimitBytes => "bytes",
                _ => "calls",
            };
            let release = match release {
                ReleaseSpec::After(d) => format!("releases after {}s", d.as_secs()),
                ReleaseSpec::Manual => "until released by an operator".into(),
            };
            self.events.emit(
                EventKind::LimitEngaged,
                &self.name,
                format!("{what} per window exceeded; engaged {release}"),
            );
        }
        wait
    }

    /// Adds request or response bytes of an admitted call.
    pub(crate) fn add_bytes(&self, cell: &LimitCell, n: u64, now: Instant) {
        let Some(rate) = &self.spec.bytes else { return };
        let window = self.now_ms(now) / ms(rate.window).max(1);
        let seen = cell.bytes_window.load(Relaxed);
        if seen != window
            && seen < window
            && cell
                .bytes_window
                .compare_exchange(seen, window, Relaxed, Relaxed)
                .is_ok()
        {
            cell.bytes.store(0, Relaxed);
        }
        cell.bytes.fetch_add(n, Relaxed);
    }

    /// Releases every engaged key (operator command). Returns whether any was engaged.
    pub(crate) fn release(&self, who: &str) -> bool {
        let mut released = self.single.engaged_until.swap(NOT_ENGAGED, Relaxed) != NOT_ENGAGED;
        if let Ok(map) = self.keyed.read() {
            for cell in map.values() {
                released |= cell.engaged_until.swap(NOT_ENGAGED, Relaxed) != NOT_ENGAGED;
            }
        }
        if released {
            self.events.emit(
                EventKind::LimitReleased,
                &self.name,
                format!("released by {who}"),
            );
        }
        released
    }

    /// Whether any key is engaged now (expired `release after` latches are released here).
    pub(crate) fn engaged(&self) -> bool {
        let now = Instant::now();
        let now_ms = self.now_ms(now);
        let mut any = false;
        let mut check = |cell: &LimitCell| {
            let until = cell.engaged_until.load(Relaxed);
            if until == NOT_ENGAGED {
                return;
            }
            if until == MANUAL || now_ms < until {
                any = true;
            } else if cell
                .engaged_until
                .compare_exchange(until, NOT_ENGAGED, Relaxed, Relaxed)
                .is_ok()
            {
                self.events.emit(
                    EventKind::LimitReleased,
                    &self.name,
                    "released after its `release after` time".into(),
                );
            }
        };
        check(&self.single);
        if let Ok(map) = self.keyed.read() {
            map.values().for_each(|c| check(c));
        }
        any
    }

    /// Time until an engaged key releases itself (the longest), `None` when
    /// not engaged or manual.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let now_ms = self.now_ms(Instant::now());
        let mut longest: Option<u64> = None;
        let mut check = |cell: &LimitCell| {
            let until = cell.engaged_until.load(Relaxed);
            if until != NOT_ENGAGED && until != MANUAL && until > now_ms {
                longest = Some(longest.unwrap_or(0).max(until - now_ms));
            }
        };
        check(&self.single);
        if let Ok(map) = self.keyed.read() {
            map.values().for_each(|c| check(c));
        }
        longest.map(Duration::from_millis)
    }
}

fn reason_from(v: u8) -> RejectReason {
    if v == RejectReason::LimitBytes as u8 {
        RejectReason::LimitBytes
    } else {
        RejectReason::LimitCalls
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::config::{LimitAction, LimitKey, LimitScope};
    use crate::events::Event;

    fn limit(
        calls: Option<u64>,
        bytes: Option<u64>,
        release: Option<ReleaseSpec>,
    ) -> (Limit, tokio::sync::broadcast::Receiver<Event>) {
        let events = Events::new();
        let rx = events.subscribe();
        let spec = LimitSpec {
            calls: calls.map(|amount| RateSpec {
                amount,
                window: Duration::from_secs(1),
            }),
            bytes: bytes.map(|amount| RateSpec {
                amount,
                window: Duration::from_secs(1),
            }),
            key: LimitKey::All,
            action: LimitAction::Reject,
            reject_status: StatusCode::TOO_MANY_REQUESTS,
            release,
            scope: LimitScope::Local,
        };
        (Limit::new(spec, "svc/l".into(), events), rx)
    }

    #[tokio::test(start_paused = true)]
    async fn calls_per_window_roll_over() {
        let (l, _rx) = limit(Some(3), None, None);
        let c = CellRef::Single;
        for _ in 0..3 {
            assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        }
        tokio::time::advance(Duration::from_millis(400)).await;
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(e.reason, RejectReason::LimitCalls);
        assert_eq!(e.wait, Some(Duration::from_millis(600)));
        assert_eq!(
            l.refuse(l.cell(&c), e, Instant::now()),
            Some(Duration::from_millis(600))
        );
        // The next window admits again.
        tokio::time::advance(Duration::from_millis(600)).await;
        for _ in 0..3 {
            assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        }
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_per_window() {
        let (l, _rx) = limit(None, Some(1000), None);
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.add_bytes(l.cell(&c), 600, Instant::now());
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.add_bytes(l.cell(&c), 400, Instant::now());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(e.reason, RejectReason::LimitBytes);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.add_bytes(l.cell(&c), 10, Instant::now());
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn latch_releases_after_its_time() {
        let (l, mut rx) = limit(
            Some(1),
            None,
            Some(ReleaseSpec::After(Duration::from_secs(7200))),
        );
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(
            l.refuse(l.cell(&c), e, Instant::now()),
            Some(Duration::from_secs(7200))
        );
        assert_eq!(rx.try_recv().unwrap().kind, EventKind::LimitEngaged);
        assert!(l.engaged());
        // Engaged: refused even in later windows.
        tokio::time::advance(Duration::from_secs(3600)).await;
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert!(e.engaged);
        assert_eq!(e.wait, Some(Duration::from_secs(3600)));
        assert_eq!(l.remaining(), Some(Duration::from_secs(3600)));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        assert_eq!(rx.try_recv().unwrap().kind, EventKind::LimitReleased);
        assert!(!l.engaged());
    }

    #[tokio::test(start_paused = true)]
    async fn manual_latch_needs_a_release() {
        let (l, mut rx) = limit(Some(1), None, Some(ReleaseSpec::Manual));
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(l.refuse(l.cell(&c), e, Instant::now()), None);
        tokio::time::advance(Duration::from_secs(100_000)).await;
        assert!(l.try_admit(l.cell(&c), Instant::now()).unwrap_err().engaged);
        assert_eq!(l.remaining(), None);
        assert!(l.release("ops"));
        assert!(!l.release("ops"), "nothing left to release");
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        let kinds: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, [EventKind::LimitEngaged, EventKind::LimitReleased]);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_count_separately() {
        let (l, _rx) = limit(Some(1), None, Some(ReleaseSpec::Manual));
        let crm = l.cell_for(Some("crm"));
        let shop = l.cell_for(Some("shop"));
        assert!(l.try_admit(l.cell(&crm), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&crm), Instant::now()).unwrap_err();
        l.refuse(l.cell(&crm), e, Instant::now());
        // One consumer engaged does not affect another.
        assert!(l.try_admit(l.cell(&shop), Instant::now()).is_ok());
        assert!(
            l.try_admit(l.cell(&l.cell_for(Some("crm"))), Instant::now())
                .is_err()
        );
    }
}
