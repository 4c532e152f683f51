//! A limit's latches: released (operator, per key or all), read (engaged,
//! its keys, time left), exported (restart, hello) and re-armed.

use super::*;

impl Limit {
    /// The latches of every engaged key (expired ones are left to
    /// [`Limit::engaged`] to release).
    pub(crate) fn latches_into(&self, now: Instant, now_unix_ms: u64, out: &mut Vec<Kept>) {
        let now_ms = self.now_ms(now);
        let mut one = |cell: &LimitCell| {
            let until = cell.engaged_until.load(Relaxed);
            if until == NOT_ENGAGED || (until != MANUAL && until <= now_ms) {
                return;
            }
            let since = match cell.engaged_since_unix_ms.load(Relaxed) {
                0 => now_unix_ms,
                since => since,
            };
            out.push(Kept {
                kind: LatchKind::Limit,
                rule: self.name.to_string(),
                key: cell.key.to_string(),
                since_unix_ms: since,
                deadline_unix_ms: (until != MANUAL)
                    .then(|| now_unix_ms.saturating_add(until - now_ms)),
                reason: self.engaged_message(reason_from(cell.engaged_reason.load(Relaxed))),
            });
        };
        one(&self.single);
        if let Ok(map) = self.keyed.read() {
            map.values().for_each(|c| one(c));
        }
    }

    /// Engages the key of `latch` again until its deadline (restart,
    /// carry-over). No event: nothing new happened. A cluster limit engages
    /// it in the store again at its next flush.
    pub(crate) fn restore_latch(&self, latch: &Kept, now: Instant, now_unix_ms: u64) -> Restored {
        if latch.key.is_empty() && matches!(self.spec.key, LimitKey::Service | LimitKey::Consumer) {
            return Restored::KeyMissing;
        }
        let end = match (latch.deadline_unix_ms, self.spec.release) {
            (Some(deadline), _) => Some(deadline),
            (None, Some(ReleaseSpec::After(after))) => {
                Some(latch.since_unix_ms.saturating_add(ms(after)))
            }
            (None, _) => None,
        };
        let until = match end {
            Some(end) if end <= now_unix_ms => return Restored::Expired,
            Some(end) => self
                .now_ms(now)
                .saturating_add(end - now_unix_ms)
                .clamp(1, MANUAL - 1),
            None => MANUAL,
        };
        let key = (!latch.key.is_empty()).then_some(latch.key.as_str());
        let cell_ref = self.cell_for(key);
        let cell = self.cell(&cell_ref);
        if cell.engaged_until.load(Relaxed) != NOT_ENGAGED {
            return Restored::Held;
        }
        let reason = if latch.reason.starts_with("bytes") {
            RejectReason::LimitBytes
        } else {
            RejectReason::LimitCalls
        };
        cell.engaged_reason.store(reason as u8, Relaxed);
        cell.engaged_since_unix_ms
            .store(latch.since_unix_ms.max(1), Relaxed);
        if self.cluster.is_some() {
            // The store may have lost it: the next flush engages it there.
            cell.shared().engage = true;
        }
        match cell
            .engaged_until
            .compare_exchange(NOT_ENGAGED, until, Relaxed, Relaxed)
        {
            Ok(_) => Restored::Armed,
            Err(_) => Restored::Held,
        }
    }
}

impl Limit {
    /// Releases every engaged key, or only `key` (operator command).
    /// Returns whether any was engaged. A released key starts on a fresh
    /// count in the current window, so the release holds until the key goes
    /// over the limit again (not until its next call). For a cluster limit
    /// the store's latches and counters are deleted in the background
    /// ([`Limit::release_shared`] waits for it).
    pub(crate) fn release(&self, who: &str, key: Option<&str>) -> bool {
        let clear = |cell: &LimitCell| {
            if self.cluster.is_some() {
                cell.shared().engage = false;
            }
            let was = cell.engaged_until.swap(NOT_ENGAGED, Relaxed) != NOT_ENGAGED;
            if was {
                self.fresh_count(cell);
            }
            was
        };
        let released = match key {
            Some(key) => {
                if let Some(link) = &self.cluster {
                    link.store
                        .release_key(&self.name, key, self.counters_now(key));
                }
                if key.is_empty() {
                    clear(&self.single)
                } else {
                    let cell = self.keyed.read().ok().and_then(|m| m.get(key).cloned());
                    cell.is_some_and(|c| clear(&c))
                }
            }
            None => {
                let mut released = clear(&self.single);
                if let Ok(map) = self.keyed.read() {
                    for cell in map.values() {
                        released |= clear(cell);
                    }
                }
                if let Some(link) = &self.cluster {
                    link.store.release(&self.name);
                }
                released
            }
        };
        if released {
            self.events.emit_key(
                EventKind::LimitReleased,
                &self.name,
                key.unwrap_or(""),
                format!("released by {who}"),
            );
        }
        released
    }

    /// Starts `cell` on a fresh count in the current window: its calls (by
    /// the limit's algorithm: a token bucket full again, a window with no
    /// count and no previous one) and bytes, and a cluster limit's last
    /// totals from the store.
    fn fresh_count(&self, cell: &LimitCell) {
        let now = Instant::now();
        if let Some(rate) = &self.spec.calls {
            match self.spec.algorithm {
                // The theoretical arrival time at the limit's start: full.
                Algorithm::TokenBucket { .. } => cell.calls.store(0, Relaxed),
                Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                    let window = (self.now_ms(now) / ms(rate.window).max(1)) & 0xffff_ffff;
                    cell.calls.store(pack(window, 0), Relaxed);
                    cell.previous.store(0, Relaxed);
                }
            }
        }
        cell.bytes.store(0, Relaxed);
        if self.cluster.is_some() {
            let mut shared = cell.shared();
            shared.lease.total = 0;
            shared.bytes.base = 0;
        }
    }

    /// The store's counters of `key` now, by the limit's algorithm (what a
    /// release deletes with its latch): the current window's, the window
    /// before's too for a sliding window, the bucket's one key.
    fn counters_now(&self, key: &str) -> Vec<String> {
        let Some(link) = &self.cluster else {
            return Vec::new();
        };
        let unix = link.store.unix_ms(Instant::now());
        let mut counters = Vec::new();
        if let Some(rate) = &self.spec.calls {
            let window = unix / ms(rate.window).max(1);
            let calls = |window| crate::cluster::calls_key(&self.name, key, window);
            match self.spec.algorithm {
                Algorithm::FixedWindow => counters.push(calls(window)),
                // Without the window before's count, as locally.
                Algorithm::SlidingWindow => {
                    counters.extend([calls(window), calls(window.saturating_sub(1))]);
                }
                // Full again.
                Algorithm::TokenBucket { .. } => {
                    counters.push(crate::cluster::bucket_key(&self.name, key));
                }
            }
        }
        if let Some(rate) = &self.spec.bytes {
            counters.push(crate::cluster::bytes_key(
                &self.name,
                key,
                unix / ms(rate.window).max(1),
            ));
        }
        counters
    }

    /// Deletes the latches and counters of this limit (of `key` only, if
    /// given) in the store and waits for it. `None`: no store, or it failed.
    pub(crate) async fn release_shared(&self, key: Option<&str>) -> Option<u64> {
        let link = self.cluster.as_ref()?;
        match key {
            Some(key) => {
                link.store
                    .release_key_now(&self.name, key, self.counters_now(key))
                    .await
            }
            None => link.store.release_now(&self.name).await,
        }
    }

    /// Whether any key is engaged now (expired `release after` latches are released here).
    pub(crate) fn engaged(&self) -> bool {
        self.engaged_keys().1 > 0
    }

    /// The keys engaged now, sorted, at most [`MAX_ENGAGED_KEYS`] (`""`:
    /// the rule's own counter), and how many there are in all. Expired
    /// `release after` latches are released here.
    pub(crate) fn engaged_keys(&self) -> (Vec<Arc<str>>, usize) {
        let now = Instant::now();
        let now_ms = self.now_ms(now);
        let mut keys: Vec<Arc<str>> = Vec::new();
        let mut count = 0;
        let mut check = |cell: &LimitCell| {
            let until = cell.engaged_until.load(Relaxed);
            if until == NOT_ENGAGED {
                return;
            }
            if until == MANUAL || now_ms < until {
                count += 1;
                keys.push(Arc::from(&*cell.key));
            } else if cell
                .engaged_until
                .compare_exchange(until, NOT_ENGAGED, Relaxed, Relaxed)
                .is_ok()
            {
                self.events.emit_key(
                    EventKind::LimitReleased,
                    &self.name,
                    &cell.key,
                    "released after its `release after` time".into(),
                );
            }
        };
        check(&self.single);
        if let Ok(map) = self.keyed.read() {
            map.values().for_each(|c| check(c));
        }
        keys.sort_unstable();
        keys.truncate(MAX_ENGAGED_KEYS);
        (keys, count)
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
