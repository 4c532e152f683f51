//! The keys of a keyed limit (`per consumer`, `per service`): looked up per
//! call, evicted only at rest, and an honest overflow past `max_keys`
//! ([`crate::state::keys`]).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use tokio::time::Instant;

use super::{CellRef, Limit, LimitCell, ms};
use crate::primitive::Answer;
use crate::rejection::RejectReason;
use crate::state::keys::KeyOverflow;

impl Limit {
    /// The counters for `key` (`None`: the rule's single counter).
    pub(crate) fn cell_for(&self, key: Option<&str>) -> CellRef {
        let Some(key) = key else {
            return CellRef::Single;
        };
        let max = self.spec.keys.max();
        let now = Instant::now();
        if let Ok(map) = self.keyed.read() {
            if let Some(cell) = map.get(key) {
                return CellRef::Keyed(cell.clone());
            }
            if map.len() >= max && !self.table.may_sweep(now) {
                return self.overflow();
            }
        }
        let Ok(mut map) = self.keyed.write() else {
            return self.overflow();
        };
        if map.len() >= max && !map.contains_key(key) {
            let now_ms = self.now_ms(now);
            map.retain(|_, c| !self.at_rest(c, now_ms));
            self.table.set_keys(map.len());
            if map.len() >= max {
                self.table.swept_in_vain(now);
                return self.overflow();
            }
        }
        let cell = map
            .entry(key.into())
            .or_insert_with(|| Arc::new(LimitCell::keyed(key)))
            .clone();
        self.table.set_keys(map.len());
        CellRef::Keyed(cell)
    }

    /// A call of a key that found no room.
    fn overflow(&self) -> CellRef {
        self.table.overflowed();
        match self.spec.keys.overflow {
            KeyOverflow::Share => CellRef::Single,
            KeyOverflow::Reject => CellRef::Full,
        }
    }

    /// The refusal of a call that found no room (`overflow reject`): a key
    /// may come to rest in the next window.
    pub(super) fn no_room(&self, now: Instant) -> Answer {
        let now_ms = self.now_ms(now);
        let (reason, rate) = match (&self.spec.calls, &self.spec.bytes) {
            (Some(rate), _) => (RejectReason::LimitCalls, rate),
            (None, Some(rate)) => (RejectReason::LimitBytes, rate),
            (None, None) => return Answer::Refused(RejectReason::LimitCalls, None),
        };
        Answer::Refused(reason, Some(Self::window_left(rate, now_ms)))
    }

    /// Whether forgetting `cell` gives its caller nothing back: no call
    /// holds it, it is not latched, and it has counted nothing in the
    /// current window (nor holds a lease or unsent counts of a cluster limit).
    fn at_rest(&self, cell: &Arc<LimitCell>, now_ms: u64) -> bool {
        if Arc::strong_count(cell) > 1 || self.is_engaged(cell, now_ms) {
            return false;
        }
        if !self.calls_at_rest(cell, now_ms) {
            return false;
        }
        if let Some(rate) = &self.spec.bytes {
            let window = now_ms / ms(rate.window).max(1);
            if cell.bytes_window.load(Relaxed) == window && cell.bytes.load(Relaxed) > 0 {
                return false;
            }
        }
        if self.cluster.is_some() {
            let s = cell.shared();
            let lease = &s.lease;
            if s.active
                || s.engage
                || lease.left > 0
                || lease.unleased > 0
                || lease.sending > 0
                || s.bytes.delta > 0
                || s.bytes.inflight > 0
            {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::weight::Weight;

    use http::StatusCode;
    use tokio::time::Instant;

    use super::*;
    use crate::events::Events;
    use crate::primitive::Primitive;
    use crate::state::keys::KeyCap;
    use crate::state::limit::attrs::KeyPart;
    use crate::state::limit::{LimitAction, LimitKey, LimitScope, LimitSpec, RateSpec};

    const HOUR: Duration = Duration::from_secs(3600);

    /// `calls amount per 1h per consumer` with `keys`.
    fn per_consumer(amount: u64, keys: KeyCap) -> Limit {
        by(super::super::Algorithm::FixedWindow, amount, keys)
    }

    fn by(algorithm: super::super::Algorithm, amount: u64, keys: KeyCap) -> Limit {
        let spec = LimitSpec {
            algorithm,
            calls: Some(RateSpec {
                amount,
                window: HOUR,
            }),
            bytes: None,
            key: LimitKey::Consumer,
            action: LimitAction::Reject,
            reject_status: StatusCode::TOO_MANY_REQUESTS,
            reject_grpc: gov_proto::v1::GrpcCode::ResourceExhausted,
            release: None,
            scope: LimitScope::Local,
            keys,
            headers_always: false,
            warmup_scale: false,
            parts: Box::default(),
            share: None,
            by_class: false,
        };
        Limit::new(
            spec,
            "svc/l".into(),
            Events::new(),
            None,
            &Weight::default(),
        )
    }

    /// One call of `key`, as a decision makes it: whether it was admitted.
    fn call(l: &Limit, key: &str) -> bool {
        let scope = l.cell_for(Some(key));
        let now = Instant::now();
        matches!(
            l.try_acquire(Some(&scope), now.into(), now.into()),
            Answer::Granted(_)
        )
    }

    /// Issue 29: 4,200 new consumers in a few seconds emptied the key table
    /// and gave an exhausted consumer its hourly budget back. A key that
    /// counted calls in its window is never evicted; new keys past the cap
    /// share the overflow counter.
    #[tokio::test(start_paused = true)]
    async fn an_exhausted_key_survives_a_flood_of_5000_new_keys() {
        let l = per_consumer(3, KeyCap::default());
        for _ in 0..3 {
            assert!(call(&l, "web"));
        }
        assert!(!call(&l, "web"), "web's hourly budget is spent");
        let mut admitted = 0;
        for i in 0..5000 {
            admitted += usize::from(call(&l, &format!("attacker-{i}")));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert!(!call(&l, "web"), "web is still exhausted after the flood");
        // 4,095 keys fit beside `web`, each with its own budget; the other
        // 905 share the rule's one budget of 3.
        assert_eq!(admitted, 4095 + 3);
        let (keys, overflowed) = l.table.counts();
        assert_eq!(keys, 4096);
        assert_eq!(overflowed, 905);
    }

    #[tokio::test(start_paused = true)]
    async fn overflow_keys_share_one_budget_and_keys_at_rest_make_room() {
        let l = per_consumer(
            3,
            KeyCap {
                max: Some(4),
                overflow: KeyOverflow::Share,
            },
        );
        for k in ["a", "b", "c", "d"] {
            assert!(call(&l, k));
        }
        let shared: usize = (0..10)
            .map(|i| usize::from(call(&l, &format!("new-{i}"))))
            .sum();
        assert_eq!(shared, 3, "ten new keys share the rule's one budget");
        assert!(call(&l, "a"), "a tracked key keeps its own budget");
        // In the next window every key is at rest: a new key gets room.
        tokio::time::advance(HOUR).await;
        assert!(call(&l, "e") && call(&l, "e") && call(&l, "e"));
        assert!(!call(&l, "e"), "e has its own budget of 3");
        assert_eq!(l.table.counts(), (1, 10));
    }

    #[tokio::test(start_paused = true)]
    async fn overflow_reject_refuses_new_keys_until_one_is_at_rest() {
        let l = per_consumer(
            3,
            KeyCap {
                max: Some(2),
                overflow: KeyOverflow::Reject,
            },
        );
        assert!(call(&l, "a") && call(&l, "b"));
        let scope = l.cell_for(Some("c"));
        let now = Instant::now();
        match l.try_acquire(Some(&scope), now.into(), now.into()) {
            Answer::Refused(RejectReason::LimitCalls, Some(retry)) => {
                assert!(retry <= HOUR && retry > Duration::ZERO);
            }
            other => panic!("refused with a Retry-After, got {other:?}"),
        }
        assert!(call(&l, "a"), "tracked keys are served");
        tokio::time::advance(HOUR).await;
        assert!(call(&l, "c"), "room once a key is at rest");
    }

    /// A held key (a call in flight holds its scope) is never evicted, nor
    /// is one latched; a sweep that finds none at rest is not repeated for
    /// every call.
    #[tokio::test(start_paused = true)]
    async fn a_full_table_of_engaged_keys_is_swept_once_per_backoff() {
        let l = per_consumer(
            3,
            KeyCap {
                max: Some(2),
                overflow: KeyOverflow::Share,
            },
        );
        let held = l.cell_for(Some("held"));
        assert!(call(&l, "b"));
        assert!(matches!(l.cell_for(Some("x")), CellRef::Single));
        assert!(!l.table.may_sweep(Instant::now()));
        tokio::time::advance(HOUR).await;
        // `b` is at rest in the new window; `held` is held.
        assert!(matches!(l.cell_for(Some("y")), CellRef::Keyed(_)));
        assert!(l.keyed.read().unwrap().contains_key("held"));
        drop(held);
    }

    /// `calls amount per 1h per header "x-tenant"` with `keys`.
    fn per_tenant(amount: u64, keys: KeyCap) -> Limit {
        let mut l = per_consumer(amount, keys);
        let mut spec = l.spec.clone();
        spec.key = LimitKey::All;
        spec.parts = vec![KeyPart::Header(http::HeaderName::from_static("x-tenant"))].into();
        l = Limit::new(
            spec,
            "svc/l".into(),
            Events::new(),
            None,
            &Weight::default(),
        );
        l
    }

    /// One call with `x-tenant: tenant` (`None`: without the header), as
    /// a decision makes it: whether it was admitted.
    fn tenant_call(l: &Limit, tenant: Option<&str>) -> bool {
        let mut headers = http::HeaderMap::new();
        if let Some(t) = tenant {
            headers.insert("x-tenant", http::HeaderValue::from_str(t).unwrap());
        }
        let keys = crate::primitive::Keys {
            target: None,
            consumer: None,
            instance: None,
            path: "/",
            query: "",
            headers: crate::route::Headers::Map(&headers),
            claims: &[],
            class: Default::default(),
        };
        let scope = l.scope(&keys);
        let now = Instant::now();
        matches!(
            l.try_acquire(Some(&scope), now.into(), now.into()),
            Answer::Granted(_)
        )
    }

    /// Keys on a header: each tenant its own budget; every call without
    /// the header shares one (`%absent`), as do oversized values; a flood
    /// of distinct values goes to the overflow once `max_keys` are engaged,
    /// and an exhausted tenant stays exhausted.
    #[tokio::test(start_paused = true)]
    async fn header_keys_count_apart_absent_shares_one_and_a_flood_overflows() {
        let l = per_tenant(
            2,
            KeyCap {
                max: Some(8),
                overflow: KeyOverflow::Share,
            },
        );
        assert!(tenant_call(&l, Some("acme")) && tenant_call(&l, Some("acme")));
        assert!(!tenant_call(&l, Some("acme")), "acme's budget is spent");
        assert!(tenant_call(&l, Some("zeta")), "zeta counts apart");
        assert!(tenant_call(&l, None) && tenant_call(&l, Some("")));
        assert!(!tenant_call(&l, None), "calls without it share one budget");
        let huge = "x".repeat(10_000);
        assert!(tenant_call(&l, Some(&huge)) && tenant_call(&l, Some(&huge[1..])));
        assert!(
            !tenant_call(&l, Some(&huge[2..])),
            "oversized values share one"
        );
        let mut admitted = 0;
        for i in 0..1000 {
            admitted += usize::from(tenant_call(&l, Some(&format!("t-{i}"))));
        }
        // acme, zeta, %absent, %invalid and 4 new tenants fill the table;
        // the other 996 share the rule's budget of 2.
        assert_eq!(admitted, 4 + 2);
        assert_eq!(l.table.counts(), (8, 996));
        assert!(!tenant_call(&l, Some("acme")), "acme is still exhausted");
        assert!(tenant_call(&l, Some("zeta")), "zeta keeps its own budget");
        // The next window: keys at rest make room again.
        tokio::time::advance(HOUR).await;
        assert!(tenant_call(&l, Some("fresh")));
        assert_eq!(l.table.counts().0, 1);
    }

    /// A key whose sliding window still weighs (counts in this window or
    /// the one before) or whose token bucket is not full again is not at
    /// rest: evicting it would give its caller calls back.
    #[tokio::test(start_paused = true)]
    async fn keys_of_every_algorithm_rest_only_when_forgetting_them_gives_nothing() {
        use super::super::Algorithm;
        let cap = KeyCap {
            max: Some(1),
            overflow: KeyOverflow::Reject,
        };
        let sliding = by(Algorithm::SlidingWindow, 3, cap);
        assert!(call(&sliding, "a"));
        tokio::time::advance(HOUR).await;
        assert!(!call(&sliding, "b"), "a's last window still weighs");
        tokio::time::advance(HOUR).await;
        assert!(call(&sliding, "b"), "two windows on, a is at rest");

        // A bucket refills one call every 20 min.
        let bucket = by(Algorithm::TokenBucket { burst: 3 }, 3, cap);
        assert!(call(&bucket, "a"));
        tokio::time::advance(HOUR / 3 - Duration::from_millis(1)).await;
        assert!(!call(&bucket, "b"), "a's bucket is not full yet");
        let bucket = by(Algorithm::TokenBucket { burst: 3 }, 3, cap);
        assert!(call(&bucket, "a"));
        tokio::time::advance(HOUR / 3).await;
        assert!(call(&bucket, "b"), "a's bucket is full again");
    }
}
