//! What an admitted call tells of its rules (the decision log, the proxy):
//! those that granted it, in decision order, the shadow rules that would
//! have refused it, its retry rule. Off the request path.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::config::Mode;
use crate::rejection::WouldReject;
use crate::snapshot::Snapshot;

use super::call::Call;

impl Call {
    pub(super) fn would_reject_on<'a>(
        &'a self,
        snap: &'a Snapshot,
    ) -> impl Iterator<Item = WouldReject> + 'a {
        self.refused.iter().filter_map(|&(rule, reason)| {
            Some(WouldReject {
                rule: snap.config.rules.get(rule as usize)?.name.clone(),
                reason,
            })
        })
    }

    /// The rules to name to the upstream in `gov-would-reject-by`.
    pub(super) fn stamps(&self) -> impl Iterator<Item = &str> + '_ {
        let rules = self.snap.as_deref().map(|s| &s.config.rules[..]);
        self.refused.iter().filter_map(move |&(rule, _)| {
            let rule = rules?.get(rule as usize)?;
            (rule.mode == Mode::Shadow { stamp: true }).then_some(&*rule.name)
        })
    }

    /// The rules that admitted this call, each with how long it waited.
    /// Those that granted it and the shadow rules that would have refused
    /// it, merged back into decision order (phase, then rule id).
    pub(super) fn rules(&self) -> impl Iterator<Item = (&Arc<str>, Option<Duration>)> {
        let snap = self.snap.as_deref();
        let order = move |rule: u32| {
            let phase = snap.and_then(|s| s.config.metas.get(rule as usize));
            (phase.map(|m| m.phase), rule)
        };
        let mut held = self.granted().into_iter().peekable();
        let mut refused = self.refused.iter().map(|&(rule, _)| rule).peekable();
        let merged = std::iter::from_fn(move || match (held.peek(), refused.peek()) {
            (Some(&h), Some(&r)) if order(r) < order(h) => refused.next(),
            (Some(_), _) => held.next(),
            (None, _) => refused.next(),
        });
        merged.filter_map(move |id| {
            let rule = &snap?.config.rules.get(id as usize)?.name;
            let wait = self.waits.iter().find_map(|&(r, d)| (r == id).then_some(d));
            Some((rule, wait))
        })
    }

    /// The rules that granted this call, in decision order (phase, then
    /// rule id): its plain holds and the others merged.
    pub(super) fn granted(&self) -> SmallVec<[u32; 8]> {
        let snap = self.snap.as_deref();
        let mut granted: SmallVec<[u32; 8]> = (self.plain.rules())
            .chain(self.held.iter().map(|h| h.rule))
            .collect();
        granted.sort_unstable_by_key(|&rule| {
            let meta = snap.and_then(|s| s.config.metas.get(rule as usize));
            (meta.map(|m| m.phase), rule)
        });
        granted
    }

    /// The retry rule that matched this call (the first), unless in mode shadow.
    pub(super) fn retry(&self) -> Option<crate::RetryPolicy> {
        let snap = self.snap.as_deref()?;
        (self.granted().into_iter())
            .filter(|&rule| !snap.is_shadow(rule))
            .find_map(|rule| snap.states[rule as usize].retry())
    }
}
