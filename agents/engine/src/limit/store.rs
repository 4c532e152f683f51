//! The cluster side of a limit: counting in the store (`sync exact`),
//! merging the store's totals with local calls (`sync batch`), the flush
//! task, and mirroring the store's latches.

use super::*;
use crate::cluster;

impl Limit {
    /// Starts the flush task of a batched cluster limit (it ends when the
    /// limit is dropped). Needs a Tokio runtime; without one nothing is flushed.
    pub(crate) fn start(self: &Arc<Self>) {
        let Some(link) = &self.cluster else { return };
        // `sync exact` counts calls per call; it flushes bytes, and reads
        // latches back so a release elsewhere shows here without traffic.
        if link.exact && self.spec.bytes.is_none() && self.spec.release.is_none() {
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
            });
        }
        Ok(())
    }

    /// `sync batch`: the cluster total at the last flush plus own calls since.
    pub(super) fn batch_calls(
        &self,
        link: &ClusterLink,
        cell: &LimitCell,
        now: Instant,
    ) -> Result<(), Exceeded> {
        let Some(rate) = &self.spec.calls else {
            return Ok(());
        };
        let unix = link.store.unix_ms(now);
        let w = ms(rate.window).max(1);
        let mut s = cell.shared();
        s.calls.roll(unix / w);
        s.active = true;
        if s.calls.used() >= rate.amount {
            return Err(Exceeded {
                reason: RejectReason::LimitCalls,
                wait: Some(Duration::from_millis(w - unix % w)),
                engaged: false,
            });
        }
        s.calls.delta += 1;
        Ok(())
    }

    /// `sync exact`: counts the call in the store (one round trip), or
    /// locally if the store does not answer in time.
    pub(crate) async fn admit_exact(&self, cell: &LimitCell, now: Instant) -> Result<(), Exceeded> {
        let (Some(link), Some(rate)) = (&self.cluster, &self.spec.calls) else {
            return self.try_admit(cell, now);
        };
        self.check_shared_bytes(link, cell, now)?;
        let unix = link.store.unix_ms(now);
        let w = ms(rate.window).max(1);
        let call = ExactCall {
            counter: cluster::calls_key(&self.name, &cell.key, unix / w),
            latch: cluster::latch_key(&self.name, &cell.key),
            expiry_ms: w.saturating_mul(2),
            amount: rate.amount,
            latch_ms: self.latch_ms(),
        };
        match link.store.exact(call).await {
            None => self.try_admit(cell, now),
            Some(ExactReply::Counted(count)) => {
                self.mirror(cell, None, now);
                if count <= rate.amount {
                    Ok(())
                } else {
                    Err(Exceeded {
                        reason: RejectReason::LimitCalls,
                        wait: Some(Duration::from_millis(w - unix % w)),
                        engaged: false,
                    })
                }
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
                })
            }
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

    /// Sends every key's delta to the store and reads the cluster totals and
    /// latches back (one pipeline). On failure the deltas stay local.
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
        let mut items = Vec::new();
        // Per item: the cell, (window, amount) sent for calls and for bytes,
        // and whether it engaged the latch.
        type Sent<'a> = (&'a LimitCell, (u64, u64), (u64, u64), bool);
        let mut sent: Vec<Sent<'_>> = Vec::new();
        for (i, cell) in cells.into_iter().enumerate() {
            let mut s = cell.shared();
            // Read back the single counter always, a key while it is used this
            // window or engaged (to see other agents' calls and releases).
            let this_window = calls_w.is_some_and(|w| s.calls.window == unix / w)
                || bytes_w.is_some_and(|w| s.bytes.window == unix / w);
            if !(i == 0
                || s.active
                || s.engage
                || s.calls.delta > 0
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
            let mut calls = (0, 0);
            if let (Some(w), false) = (calls_w, link.exact) {
                if s.calls.delta == 0 {
                    s.calls.roll(unix / w);
                }
                calls = (s.calls.window, s.calls.delta);
                s.calls.inflight += s.calls.delta;
                s.calls.delta = 0;
                item.calls = Some((cluster::calls_key(&self.name, &cell.key, calls.0), calls.1));
                item.calls_expiry_ms = w.saturating_mul(2);
            }
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
            sent.push((cell, calls, bytes, s.engage));
            items.push(item);
        }
        if items.is_empty() {
            return;
        }
        let replies = link.store.flush(items).await;
        for (i, (cell, calls, bytes, engaged)) in sent.into_iter().enumerate() {
            let reply = replies.as_ref().and_then(|r| r.get(i));
            {
                let mut guard = cell.shared();
                let s = &mut *guard;
                for (part, (window, n), total) in [
                    (&mut s.calls, calls, reply.and_then(|r| r.calls)),
                    (&mut s.bytes, bytes, reply.and_then(|r| r.bytes)),
                ] {
                    if part.window != window {
                        continue;
                    }
                    part.inflight = part.inflight.saturating_sub(n);
                    match total {
                        Some(total) => part.base = total,
                        // Not flushed: keep counting it locally.
                        None => part.delta += n,
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
    }
}
