//! The decision of a request the miss filter may not pass, with this
//! thread's cached snapshot of the engine ([`crate::snapshot`]): out of
//! line from [`Engine::try_admit`](crate::Engine::try_admit), which inlines
//! only the miss test into its callers.

use std::sync::atomic::Ordering::Acquire;

use super::Shared;
use crate::admission::Admission;
use crate::decision::{Decided, admit_matched, route};
use crate::request::RequestInfo;
use crate::snapshot::CACHE;

impl Shared {
    /// [`Engine::try_admit`](crate::Engine::try_admit) of a request the miss filter may not pass. Only
    /// the miss test is inlined into every caller: with several callers (as
    /// in gov-agent) an unmatched call pays no call of this. Of the engine's
    /// shared part (issue 39: the caller has its address at hand from the
    /// miss test, and passes it).
    #[inline]
    pub(super) fn try_admit_routed(&self, req: &RequestInfo<'_>) -> Decided {
        let generation = self.generation.load(Acquire);
        let mut scratch = None;
        // Route with this thread's cached config; take the snapshot only if
        // a rule matched (its config is the cached one: the plan's `PlanAt`
        // holds in it).
        let hit = CACHE.try_with(|cache| {
            // Borrowed mutably, though only read (issue 39: a test of one
            // borrow state, where a shared borrow counts readers; nothing a
            // decision does reads the cache again).
            let cache = cache.try_borrow_mut().ok()?;
            let entry = cache.find(generation)?;
            let Some(at) = route(&entry.config, req, &mut scratch) else {
                return Some(None);
            };
            // `None` (the snapshot was swapped and dropped since): load it.
            entry.snap.upgrade().map(|snap| Some((snap, at)))
        });
        match hit {
            Ok(Some(None)) => Decided::Admitted(Admission::unmatched()),
            Ok(Some(Some((snap, at)))) => admit_matched(snap, at, &scratch, req),
            // Its generation read again (issue 39: not kept across the
            // routing; it is still read before the snapshot is loaded).
            _ => self.try_admit_loaded(req),
        }
    }

    /// [`Engine::try_admit`](crate::Engine::try_admit) with the snapshot loaded (and cached for this
    /// thread): the first decision after a swap, or without the cache.
    #[cold]
    #[inline(never)]
    fn try_admit_loaded(&self, req: &RequestInfo<'_>) -> Decided {
        let generation = self.generation.load(Acquire);
        // The thread's stripe, from its first decision on (issue 39: not
        // asked for by every count).
        crate::stripe::lease();
        let snap = self.current.load_full();
        let _ = CACHE.try_with(|cache| {
            if let Ok(mut cache) = cache.try_borrow_mut() {
                cache.insert(self.id, generation, &snap);
            }
        });
        let mut scratch = None;
        match route(&snap.config, req, &mut scratch) {
            Some(at) => admit_matched(snap, at, &scratch, req),
            None => Decided::Admitted(Admission::unmatched()),
        }
    }
}
