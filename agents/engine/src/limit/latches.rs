//! A limit's latches as the engine exports them (restart, hello) and
//! re-arms them.

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
