//! Taking in a state another govd replica stored (`--store etcd://`): its
//! policy is pushed to this replica's agents of the services whose config
//! changed, its releases are sent to this replica's agents, and its latches
//! are merged with those this replica's agents reported.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Outbox, State};
use crate::latches::{LatchId, Latches};
use crate::store::{Persisted, Trip};

/// What [`State::adopt`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// The policy in force is another one.
    pub policy: bool,
}

impl State {
    /// Takes `stored` (written by another replica) in: see the module doc.
    /// A latch this replica holds that `stored` lacks is kept unless it was
    /// released since it tripped (it is then this replica's to write).
    pub fn adopt(&mut self, stored: Persisted, out: &mut Outbox) -> Adopted {
        for r in &stored.releases {
            let id: LatchId = (r.kind, r.rule.clone(), r.key.clone());
            if self.released.get(&id).is_some_and(|&at| at >= r.at_unix_ms) {
                continue;
            }
            let key = (!r.key.is_empty()).then_some(r.key.as_str());
            self.release(
                r.kind,
                &r.rule,
                key,
                "govd (a release made through another replica)",
                r.at_unix_ms,
                out,
            );
        }
        let mut merged: BTreeMap<LatchId, Trip> = stored
            .trips
            .into_iter()
            .map(|t| ((t.kind, t.rule.clone(), t.key.clone()), t))
            .collect();
        for local in self.latches.iter() {
            let id: LatchId = (local.kind, local.rule.clone(), local.key.clone());
            match merged.get_mut(&id) {
                Some(trip) => {
                    trip.instances.extend(local.instances.iter().cloned());
                    trip.not_enforced.extend(local.not_enforced.iter().cloned());
                }
                None if !self.released_since(&id, local.since_unix_ms) => {
                    merged.insert(id, local.clone());
                }
                None => {}
            }
        }
        self.latches = Latches::from_trips(merged.into_values().collect());
        self.history = stored.history.into();

        let before = self.applied.take();
        self.applied = stored.applied.map(Arc::new);
        let changed = changed_services(before.as_deref(), self.applied.as_deref());
        let keys: Vec<_> = self
            .agents
            .iter()
            .filter(|(k, a)| a.conn.is_some() && changed.contains(&k.0))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.push(&key, out);
        }
        Adopted {
            policy: before.map(|p| p.version.clone())
                != self.applied.as_ref().map(|p| p.version.clone()),
        }
    }

    /// Whether latch `id` (or every key of its rule) was released at or
    /// after `since`.
    fn released_since(&self, id: &LatchId, since: u64) -> bool {
        let all = (id.0, id.1.clone(), String::new());
        [id, &all]
            .into_iter()
            .any(|k| self.released.get(k).is_some_and(|&at| at >= since))
    }
}

/// The services whose config differs between two policies (a service in
/// one only included).
fn changed_services(
    before: Option<&crate::store::AppliedPolicy>,
    after: Option<&crate::store::AppliedPolicy>,
) -> Vec<String> {
    let versions = |p: Option<&crate::store::AppliedPolicy>| -> BTreeMap<String, String> {
        p.map(|p| {
            p.bundle
                .targets
                .iter()
                .map(|t| (t.service.clone(), t.version.clone()))
                .collect()
        })
        .unwrap_or_default()
    };
    let (a, b) = (versions(before), versions(after));
    a.keys()
        .chain(b.keys())
        .filter(|s| a.get(*s) != b.get(*s))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}
