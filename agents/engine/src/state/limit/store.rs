//! The cluster side of a limit: counting in the store (`sync exact`),
//! leasing calls from the store (`sync batch`), the flush task (bytes,
//! latches, topping leases up and giving idle ones back), and mirroring the
//! store's latches.

use super::lease::Counting;
use super::*;
use crate::cluster::{self, LeaseAlgorithm, LeaseCall, LeaseReply, StoreAlgorithm};

/// What a lease call carried: its window and the unleased calls it sent.
#[derive(Clone, Copy, Debug)]
struct Asked {
    window: u64,
    unleased: u64,
    counting: Counting,
}

impl Limit {
    /// Starts the flush task of a batched cluster limit (it ends when the
    /// limit is dropped). Needs a Tokio runtime; without one nothing is flushed.
    pub(crate) fn start(self: &Arc<Self>) {
        let Some(link) = &self.cluster else { return };
        // `sync exact` counts calls per call; it flushes bytes, and reads
        // latches back so a release elsewhere shows here without traffic.
        if link.exact.is_some() && self.spec.bytes.is_none() && self.spec.release.is_none() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let period = link.period;
        let weak = Arc::downgrade(self);
        handle.spawn(async move {
            let mut every = tokio::time::interval(period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                every.tick().await;
                let Some(limit) = weak.upgrade() else { return };
                limit.flush().await;
            }
        });
    }

    pub(super) fn check_shared_bytes(
        &self,
        link: &ClusterLink,
        cell: &LimitCell,
        now: Instant,
    ) -> Result<(), Exceeded> {
        let Some(rate) = &self.spec.bytes else {
            return Ok(());
        };
        let unix = link.store.unix_ms(now);
        let w = ms(rate.window).max(1);
        let mut s = cell.shared();
        s.bytes.roll(unix / w);
        s.active = true;
        if s.bytes.used() >= rate.amount {
            return Err(Exceeded {
                reason: RejectReason::LimitBytes,
                wait: Some(Duration::from_millis(w - unix % w)),
                engaged: false,
                room_left: false,
            });
        }
        Ok(())
    }

    /// A batched limit's lease window (0 for a token bucket, which has
    /// none) and what its lease needs to decide at `now`.
    fn counting(&self, link: &ClusterLink, rate: &RateSpec, now: Instant) -> (u64, Counting) {
        let unix = link.store.unix_ms(now);
        let w = ms(rate.window).max(1);
        let (amount, window_ms, elapsed_ms) = (rate.amount, w, unix % w);
        match self.spec.algorithm {
            Algorithm::FixedWindow => (
                unix / w,
                Counting::Fixed {
                    amount,
                    window_ms,
                    elapsed_ms,
                },
            ),
            Algorithm::SlidingWindow => (
                unix / w,
                Counting::Sliding {
                    amount,
                    window_ms,
                    elapsed_ms,
                },
            ),
            Algorithm::TokenBucket { burst } => (
                0,
                Counting::Bucket {
                    now_us: link.store.unix_us(now),
                    interval_us: algo::interval_ns(rate).div_ceil(1000),
                    tolerance_us: algo::tolerance_ns(rate, burst).div_ceil(1000),
                    hold_us: u64::try_from(link.period.as_micros())
                        .unwrap_or(u64::MAX)
                        .saturating_mul(2),
                },
            ),
        }
    }

    /// `sync batch`: takes a leased call; without one (the store down, or
    /// its lease call failed) counts the call locally while the last known
    /// state leaves room (the window's total and own unleased calls under
    /// the amount or the estimate, the bucket's arrival time in tolerance).
    pub(super) fn batch_calls(
        &self,
        link: &ClusterLink,
        cell: &LimitCell,
        now: Instant,
    ) -> Result<(), Exceeded> {
        let Some(rate) = &self.spec.calls else {
            return Ok(());
        };
        let (window, c) = self.counting(link, rate, now);
        let mut s = cell.shared();
        s.active = true;
        let lease = &mut s.lease;
        lease.roll(window);
        lease.expire(c);
        if lease.left == 0 && lease.budget_left(c) && link.store.is_up() {
            // Counted in `demand` once decided.
            return Err(LEASE_FIRST);
        }
        lease.demand = lease.demand.saturating_add(1);
        if lease.take(c) || lease.count_unleased(c) {
            return Ok(());
        }
        Err(Exceeded {
            reason: RejectReason::LimitCalls,
            wait: Some(lease.wait(c)),
            engaged: false,
            room_left: false,
        })
    }

    /// Whether calls are leased (`sync batch` with a calls rate).
    pub(crate) fn leases(&self) -> bool {
        self.cluster.as_ref().is_some_and(|l| l.exact.is_none()) && self.spec.calls.is_some()
    }

    /// Whether a `sync batch` call must ask the store for a lease first: the
    /// key's lease is empty, the store up and, as last known, not spent.
    pub(crate) fn needs_lease(&self, cell: &LimitCell, now: Instant) -> bool {
        let (Some(link), Some(rate)) = (&self.cluster, &self.spec.calls) else {
            return false;
        };
        if link.exact.is_some()
            || !link.store.is_up()
            || cell.engaged_until.load(Relaxed) != NOT_ENGAGED
        {
            return false;
        }
        let (window, c) = self.counting(link, rate, now);
        let mut s = cell.shared();
        s.lease.roll(window);
        s.lease.expire(c);
        s.lease.left == 0 && s.lease.budget_left(c)
    }

    /// `sync batch` with an empty lease: one call of the key at a time asks
    /// the store for a lease (the others wait for its answer), then the call
    /// is decided as [`Limit::try_admit`] decides. The uncommon case: the
    /// flush task keeps busy keys' leases topped up.
    pub(crate) async fn admit_leased(&self, cell: &LimitCell) -> Result<(), Exceeded> {
        // Bounded: each round leases, or finds the permits others leased,
        // the budget spent or the store down. Calls that take permits
        // without waiting can empty a fresh lease before this one's turn.
        for _ in 0..8 {
            match self.try_admit(cell, Instant::now()) {
                Err(LEASE_FIRST) => {}
                decided => return decided,
            }
            let Some(link) = &self.cluster else { break };
            let _turn = cell.lease_turn.lock().await;
            let now = Instant::now();
            if self.needs_lease(cell, now) {
                let (call, asked) = self.lease_call(link, cell, now, false);
                let reply = link.store.lease(call).await;
                self.take_lease(cell, asked, reply, now);
            }
        }
        // Lost every round: refused as over the amount, which it nearly is.
        let now = Instant::now();
        match self.try_admit(cell, now) {
            Err(LEASE_FIRST) => Err(Exceeded {
                wait: match (&self.cluster, &self.spec.calls) {
                    (Some(link), Some(rate)) => {
                        Some(cell.shared().lease.wait(self.counting(link, rate, now).1))
                    }
                    _ => Some(Duration::from_millis(1)),
                },
                ..LEASE_FIRST
            }),
            decided => decided,
        }
    }

    /// The lease call for `cell`: what it wants (nothing for an idle key at
    /// a top-up), its unleased calls, and at a top-up (`tick`) an idle key's
    /// lease given back.
    fn lease_call(
        &self,
        link: &ClusterLink,
        cell: &LimitCell,
        now: Instant,
        tick: bool,
    ) -> (LeaseCall, Asked) {
        let rate = self.spec.calls.unwrap_or(RateSpec {
            amount: 0,
            window: Duration::from_secs(1),
        });
        let w = ms(rate.window).max(1);
        let (window, c) = self.counting(link, &rate, now);
        let mut s = cell.shared();
        let l = &mut s.lease;
        l.roll(window);
        l.expire(c);
        let mut give_back = 0;
        let want = if !tick {
            l.want()
        } else {
            l.per_period = l.demand;
            l.demand = 0;
            if l.per_period == 0 {
                // Idle for a period: its lease goes back to the others.
                give_back = l.give_back(c);
                0
            } else {
                // Keep about two periods of traffic on hand.
                l.want().saturating_sub(l.left)
            }
        };
        let unleased = std::mem::take(&mut l.unleased);
        l.sending = l.sending.saturating_add(unleased);
        let key = |window| cluster::calls_key(&self.name, &cell.key, window);
        let (counter, algorithm) = match c {
            Counting::Fixed { .. } => (key(window), LeaseAlgorithm::FixedWindow),
            Counting::Sliding {
                window_ms,
                elapsed_ms,
                ..
            } => (
                key(window),
                LeaseAlgorithm::SlidingWindow {
                    previous: key(window.saturating_sub(1)),
                    window_ms,
                    elapsed_ms,
                },
            ),
            Counting::Bucket {
                now_us,
                interval_us,
                tolerance_us,
                ..
            } => (
                cluster::bucket_key(&self.name, &cell.key),
                LeaseAlgorithm::TokenBucket {
                    now_us,
                    interval_us,
                    tolerance_us,
                    end_us: l.total,
                },
            ),
        };
        let call = LeaseCall {
            counter,
            latch: cluster::latch_key(&self.name, &cell.key),
            expiry_ms: w.saturating_mul(2),
            amount: rate.amount,
            want,
            unleased,
            give_back,
            algorithm,
        };
        (
            call,
            Asked {
                window: l.window,
                unleased,
                counting: c,
            },
        )
    }

    /// Takes the store's answer to a lease call. A lease that arrives after
    /// its window ended is dropped (it expired with the window); unleased
    /// calls that did not reach the store stay to be sent again.
    fn take_lease(&self, cell: &LimitCell, asked: Asked, reply: Option<LeaseReply>, now: Instant) {
        let engaged = {
            let mut s = cell.shared();
            let l = &mut s.lease;
            if l.window != asked.window {
                return;
            }
            l.sending = l.sending.saturating_sub(asked.unleased);
            match reply {
                None => {
                    l.unleased = l.unleased.saturating_add(asked.unleased);
                    return;
                }
                Some(LeaseReply::Granted {
                    granted,
                    total,
                    previous,
                }) => {
                    l.granted(asked.counting, granted, total, previous);
                    None
                }
                Some(LeaseReply::Engaged(ttl)) => Some(ttl),
            }
        };
        match engaged {
            Some(ttl) => {
                cell.engaged_reason
                    .compare_exchange(0, RejectReason::LimitCalls as u8, Relaxed, Relaxed)
                    .ok();
                self.mirror(cell, Some(ttl), now);
            }
            // Granted: the latch is not set in the store.
            None => self.mirror(cell, None, now),
        }
    }

    /// `sync exact`: counts the call in the store (one round trip), or
    /// locally if the store does not answer in time.
    pub(crate) async fn admit_exact(&self, cell: &LimitCell, now: Instant) -> Result<(), Exceeded> {
        let (Some(link), Some(rate)) = (&self.cluster, &self.spec.calls) else {
            return self.try_admit(cell, now);
        };
        let Some(sync) = link.exact else {
            return self.try_admit(cell, now);
        };
        self.check_shared_bytes(link, cell, now)?;
        let unix = link.store.unix_ms(now);
        let w = ms(rate.window).max(1);
        let (counter, algorithm) = self.store_algorithm(link, cell, rate, now);
        let call = ExactCall {
            counter,
            latch: cluster::latch_key(&self.name, &cell.key),
            expiry_ms: w.saturating_mul(2),
            amount: rate.amount,
            latch_ms: self.latch_ms(),
            algorithm,
        };
        let fixed = self.spec.algorithm == Algorithm::FixedWindow;
        match link.store.exact(call, sync.timeout).await {
            // Down, or no answer within the timeout: the fallback decides.
            None => self.try_admit(cell, now),
            Some(ExactReply::Counted(count)) => {
                self.mirror(cell, None, now);
                if !fixed || count <= rate.amount {
                    Ok(())
                } else {
                    Err(Exceeded {
                        reason: RejectReason::LimitCalls,
                        wait: Some(Duration::from_millis(w - unix % w)),
                        engaged: false,
                        room_left: false,
                    })
                }
            }
            Some(ExactReply::Refused(wait)) => {
                self.mirror(cell, None, now);
                Err(Exceeded {
                    reason: RejectReason::LimitCalls,
                    wait: Some(wait.max(Duration::from_millis(1))),
                    engaged: false,
                    room_left: false,
                })
            }
            Some(ExactReply::Engaged(ttl)) => {
                cell.engaged_reason
                    .compare_exchange(0, RejectReason::LimitCalls as u8, Relaxed, Relaxed)
                    .ok();
                self.mirror(cell, Some(ttl), now);
                Err(Exceeded {
                    reason: reason_from(cell.engaged_reason.load(Relaxed)),
                    wait: ttl,
                    engaged: true,
                    room_left: false,
                })
            }
        }
    }

    /// `sync exact` without the store's answer (down, or none within the
    /// timeout): the declared fallback decides the call, and is counted.
    pub(super) fn exact_fallback(
        &self,
        link: &ClusterLink,
        sync: ExactSync,
        cell: &LimitCell,
        now: Now,
        now_ms: u64,
    ) -> Result<(), Exceeded> {
        link.store.count_fallback(sync.fallback);
        match sync.fallback {
            Fallback::Local => self.local_calls(cell, now, now_ms),
            Fallback::Allow => Ok(()),
            // Not over the amount, so no latch: `engaged` keeps the refusal
            // from engaging one and from shaping (no delay makes it fit).
            Fallback::Reject => Err(Exceeded {
                reason: RejectReason::LimitCalls,
                wait: Some(cluster::PROBE_EVERY),
                engaged: true,
                room_left: false,
            }),
        }
    }

    /// The store's key and algorithm for one call of `cell`: the window's
    /// counter (fixed, sliding with the window before), or the bucket's key.
    fn store_algorithm(
        &self,
        link: &ClusterLink,
        cell: &LimitCell,
        rate: &RateSpec,
        now: Instant,
    ) -> (String, StoreAlgorithm) {
        let unix = link.store.unix_ms(now);
        let w = ms(rate.window).max(1);
        let counter = |window| cluster::calls_key(&self.name, &cell.key, window);
        match self.spec.algorithm {
            Algorithm::FixedWindow => (counter(unix / w), StoreAlgorithm::FixedWindow),
            Algorithm::SlidingWindow => (
                counter(unix / w),
                StoreAlgorithm::SlidingWindow {
                    previous: counter((unix / w).saturating_sub(1)),
                    window_ms: w,
                    elapsed_ms: unix % w,
                },
            ),
            Algorithm::TokenBucket { burst } => (
                cluster::bucket_key(&self.name, &cell.key),
                StoreAlgorithm::TokenBucket {
                    now_us: link.store.unix_us(now),
                    interval_us: algo::interval_ns(rate).div_ceil(1000),
                    tolerance_us: algo::tolerance_ns(rate, burst).div_ceil(1000),
                },
            ),
        }
    }

    /// Takes the latch state the store holds for `cell`.
    pub(super) fn mirror(&self, cell: &LimitCell, latch: Latch, now: Instant) {
        let now_ms = self.now_ms(now);
        match latch {
            Some(ttl) => {
                let until = ttl.map_or(MANUAL, |d| now_ms.saturating_add(ms(d)).max(1));
                if cell.engaged_until.swap(until, Relaxed) == NOT_ENGAGED {
                    cell.engaged_since_unix_ms.store(now_unix_ms(), Relaxed);
                    let reason = reason_from(cell.engaged_reason.load(Relaxed));
                    self.events.emit_key(
                        EventKind::LimitEngaged,
                        &self.name,
                        &cell.key,
                        self.engaged_message(reason),
                    );
                }
            }
            None => {
                if cell.shared().engage {
                    return;
                }
                let before = cell.engaged_until.swap(NOT_ENGAGED, Relaxed);
                if before == MANUAL || (before != NOT_ENGAGED && before > now_ms) {
                    self.events.emit_key(
                        EventKind::LimitReleased,
                        &self.name,
                        &cell.key,
                        "released in the cluster store".into(),
                    );
                }
            }
        }
    }

    /// Every period: sends every key's bytes to the store and reads the
    /// cluster totals and latches back (one pipeline; on failure the deltas
    /// stay local), then, for `sync batch` calls, tops up the lease of every
    /// key asked for in the period, gives back the lease of keys that were
    /// not, and sends calls admitted without a lease (one lease call per key,
    /// all at once).
    pub(crate) async fn flush(&self) {
        let Some(link) = &self.cluster else { return };
        let now = Instant::now();
        let unix = link.store.unix_ms(now);
        let keyed: Vec<Arc<LimitCell>> = self
            .keyed
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        let cells: Vec<&LimitCell> = std::iter::once(&self.single)
            .chain(keyed.iter().map(|c| &**c))
            .collect();
        let calls_w = self.spec.calls.map(|r| ms(r.window).max(1));
        let bytes_w = self.spec.bytes.map(|r| ms(r.window).max(1));
        let leased = link.exact.is_none() && calls_w.is_some();
        let mut items = Vec::new();
        // Per item: the cell, (window, amount) sent for bytes, and whether
        // it engaged the latch.
        type Sent<'a> = (&'a LimitCell, (u64, u64), bool);
        let mut sent: Vec<Sent<'_>> = Vec::new();
        let mut leases = Vec::new();
        for (i, cell) in cells.into_iter().enumerate() {
            let mut s = cell.shared();
            // Read back the single counter always, a key while it is used this
            // window or engaged (to see other agents' calls and releases).
            // A token bucket has no window: a key in use in this period
            // or the last one, or holding calls.
            let calls_now = match self.spec.algorithm {
                Algorithm::TokenBucket { .. } => {
                    s.lease.demand > 0 || s.lease.left > 0 || s.lease.per_period > 0
                }
                _ => calls_w.is_some_and(|w| s.lease.window == unix / w),
            };
            let this_window = calls_now || bytes_w.is_some_and(|w| s.bytes.window == unix / w);
            let lease = s.lease;
            if leased && this_window && (lease.demand > 0 || lease.left > 0 || lease.unleased > 0) {
                leases.push(cell);
            }
            if !(i == 0
                || s.active
                || s.engage
                || s.bytes.delta > 0
                || this_window
                || cell.engaged_until.load(Relaxed) != NOT_ENGAGED)
            {
                continue;
            }
            s.active = false;
            let mut item = FlushItem {
                latch: cluster::latch_key(&self.name, &cell.key),
                engage: s.engage.then(|| self.latch_ms()),
                ..FlushItem::default()
            };
            let mut bytes = (0, 0);
            if let Some(w) = bytes_w {
                if s.bytes.delta == 0 {
                    s.bytes.roll(unix / w);
                }
                bytes = (s.bytes.window, s.bytes.delta);
                s.bytes.inflight += s.bytes.delta;
                s.bytes.delta = 0;
                item.bytes = Some((cluster::bytes_key(&self.name, &cell.key, bytes.0), bytes.1));
                item.bytes_expiry_ms = w.saturating_mul(2);
            }
            sent.push((cell, bytes, s.engage));
            items.push(item);
        }
        let replies = link.store.flush(items).await;
        for (i, (cell, (window, n), engaged)) in sent.into_iter().enumerate() {
            let reply = replies.as_ref().and_then(|r| r.get(i));
            {
                let mut guard = cell.shared();
                let s = &mut *guard;
                if s.bytes.window == window {
                    s.bytes.inflight = s.bytes.inflight.saturating_sub(n);
                    match reply.and_then(|r| r.bytes) {
                        Some(total) => s.bytes.base = total,
                        // Not flushed: keep counting it locally.
                        None => s.bytes.delta += n,
                    }
                }
                if reply.is_none() {
                    s.active = true;
                } else if engaged {
                    s.engage = false;
                }
            }
            if let Some(reply) = reply {
                self.mirror(cell, reply.latch, now);
            }
        }
        self.top_up(link, leases, now).await;
    }

    /// The flush's lease calls, sent at once; each answer taken as it comes.
    async fn top_up(&self, link: &ClusterLink, cells: Vec<&LimitCell>, now: Instant) {
        if !link.store.is_up() {
            return;
        }
        let mut calls = tokio::task::JoinSet::new();
        let mut asked = Vec::with_capacity(cells.len());
        for (i, cell) in cells.iter().enumerate() {
            let (call, what) = self.lease_call(link, cell, now, true);
            asked.push(what);
            if call.want == 0 && call.unleased == 0 && call.give_back == 0 {
                continue;
            }
            let store = link.store.clone();
            calls.spawn(async move { (i, store.lease(call).await) });
        }
        while let Some(done) = calls.join_next().await {
            // A lease task cannot panic; a cancelled one leaves its calls
            // unleased (its `sending` is kept back until the window ends).
            if let Ok((i, reply)) = done {
                self.take_lease(cells[i], asked[i], reply, now);
            }
        }
    }
}
