//! Releases: an operator's, govd's `release after` timer's, one made
//! through another replica, or one an agent missed while it was away; the
//! latches to re-arm on an agent that lost them; and another replica's
//! latches merged with this one's. What goes to which agent is
//! `state/latch_agents.rs`'s; the commands and what they change in an
//! agent's last stats are here.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;

use super::{Latch, LatchId, LatchKind, Latches, Release, Released, engaged_keys};

// === impl Latches ===

impl Latches {
    /// Forgets the latches of `rule` for `key` (`None`: every key) and
    /// records the release at `now`. Returns the keys that were latched.
    pub fn release(&mut self, (kind, rule, key): Release<'_>, now: u64) -> Vec<String> {
        if key.is_none() {
            self.released
                .retain(|(k, r, _), _| !(*k == kind && r == rule));
        }
        self.released
            .insert((kind, rule.to_owned(), key.unwrap_or("").to_owned()), now);
        self.remove(kind, rule, key)
    }

    /// Forgets the latches of `rule` for `key` (`None`: every key); the
    /// keys that were latched.
    pub(super) fn remove(&mut self, kind: LatchKind, rule: &str, key: Option<&str>) -> Vec<String> {
        let gone: Vec<LatchId> = self.of(kind, rule, key).map(Latch::id).collect();
        for k in &gone {
            self.latches.remove(k);
        }
        gone.into_iter().map(|(_, _, key)| key).collect()
    }

    /// The latches `hello` reports that govd released while the agent was
    /// away (latched no later than the release of that key, or of every key
    /// of the rule): it gets the release, not a new latch.
    pub fn missed_releases(&self, hello: &pb::Hello) -> BTreeSet<LatchId> {
        hello
            .latches
            .iter()
            .filter(|l| {
                let k = LatchKind::from_wire(l.kind());
                let released = |key: &str| {
                    self.released
                        .get(&(k, l.rule.clone(), key.to_owned()))
                        .is_some_and(|&at| at >= l.since_unix_ms)
                };
                !self.contains(k, &l.rule, Some(&l.key)) && (released(&l.key) || released(""))
            })
            .map(wire_id)
            .collect()
    }

    /// The latches of `service` that `instance` (proving `identity`) held,
    /// or was marked as not enforcing, and that are not in `held` (what its
    /// hello reported): each key of a keyed limit alone, to arm again.
    pub fn to_rearm(
        &self,
        service: &str,
        instance: &str,
        identity: &str,
        held: &BTreeSet<LatchId>,
    ) -> Vec<pb::Latch> {
        let mut arm = Vec::new();
        for latch in self.iter() {
            let held_here =
                latch.instances.contains(instance) || latch.not_enforced.contains(instance);
            if latch.service() != service || !held_here || held.contains(&latch.id()) {
                continue;
            }
            // A latch another identity reported under this name (a squatter
            // before the name was proved, or an older holder) is not this
            // agent's to enforce: govd keeps it, shown, until released.
            if let Some(reporter) = latch.reported_by.get(instance)
                && reporter != identity
            {
                tracing::warn!(rule = %latch.rule, key = %latch.key, %instance, %reporter, identity, "not re-arming a latch another identity reported under this instance's name");
                continue;
            }
            tracing::info!(rule = %latch.rule, key = %latch.key, %instance, kind = latch.kind.as_str(), "re-arming a latch the agent lost");
            arm.push(pb::Latch {
                kind: latch.kind.wire() as i32,
                rule: latch.rule.clone(),
                key: latch.key.clone(),
                since_unix_ms: latch.since_unix_ms,
                deadline_unix_ms: latch.deadline_unix_ms.unwrap_or(0),
                reason: latch.reason.clone(),
            });
        }
        arm
    }

    /// Takes in another replica's latches and releases: each release not
    /// seen here yet is made here too (and returned, for this replica's
    /// agents); a latch this replica holds that `latches` lacks is kept
    /// unless it was released since it latched (it is then this replica's
    /// to write).
    pub fn adopt(&mut self, releases: Vec<Released>, latches: Vec<Latch>) -> Vec<Released> {
        let mut new = Vec::new();
        for r in releases {
            let id: LatchId = (r.kind, r.rule.clone(), r.key.clone());
            if self.released.get(&id).is_some_and(|&at| at >= r.at_unix_ms) {
                continue;
            }
            let key = (!r.key.is_empty()).then_some(r.key.as_str());
            self.release((r.kind, &r.rule, key), r.at_unix_ms);
            new.push(r);
        }
        let mut merged: BTreeMap<LatchId, Latch> =
            latches.into_iter().map(|l| (l.id(), l)).collect();
        for local in self.latches.values() {
            let id = local.id();
            match merged.get_mut(&id) {
                Some(latch) => {
                    latch.instances.extend(local.instances.iter().cloned());
                    latch
                        .not_enforced
                        .extend(local.not_enforced.iter().cloned());
                    latch.reported_by.extend(
                        local
                            .reported_by
                            .iter()
                            .map(|(i, who)| (i.clone(), who.clone())),
                    );
                }
                None if !self.released_since(&id, local.since_unix_ms) => {
                    merged.insert(id, local.clone());
                }
                None => {}
            }
        }
        self.latches = merged;
        new
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

/// Which latch a latch on the wire (an agent's hello, an `Arm`) is.
pub fn wire_id(l: &pb::Latch) -> LatchId {
    (
        LatchKind::from_wire(l.kind()),
        l.rule.clone(),
        l.key.clone(),
    )
}

/// The command that releases `rule` (its `key` only, or every key) on an agent.
pub fn release_message((kind, rule, key): Release<'_>, who: &str) -> pb::ControlMessage {
    let cmd = pb::ReleaseCommand {
        kind: kind.wire() as i32,
        rule: rule.to_owned(),
        who: who.to_owned(),
        key: key.unwrap_or("").to_owned(),
    };
    pb::ControlMessage {
        msg: Some(pb::control_message::Msg::Command(pb::Command {
            kind: Some(pb::command::Kind::Release(cmd)),
        })),
    }
}

/// The command that arms `latch` again on an agent that lost it.
pub fn arm_message(latch: pb::Latch) -> pb::ControlMessage {
    pb::ControlMessage {
        msg: Some(pb::control_message::Msg::Command(pb::Command {
            kind: Some(pb::command::Kind::Arm(latch)),
        })),
    }
}

/// Drops `rule` (its `key` only, or every key) from an agent's last
/// `stats`: they were taken before the release, and would otherwise show
/// the released latch until the next stats (and count it in a later
/// release's answer).
pub fn forget_reported(stats: &mut pb::Stats, (kind, rule, key): Release<'_>) {
    for r in stats.rules.iter_mut().filter(|r| r.rule == rule) {
        match kind {
            LatchKind::Fuse => r.fuse_state = pb::FuseState::Closed as i32,
            LatchKind::Limit => match key {
                None => {
                    r.engaged_keys.clear();
                    r.engaged_keys_truncated = false;
                    r.limit_engaged = false;
                }
                // An agent without `engaged_keys` has only the rule's own
                // counter, which a release of one key leaves alone.
                Some(_) if r.engaged_keys.is_empty() => {}
                Some(key) => {
                    r.engaged_keys.retain(|k| k != key);
                    r.limit_engaged = !r.engaged_keys.is_empty() || r.engaged_keys_truncated;
                }
            },
        }
    }
}

/// The keys of `rule` (of `key` only, or all) an agent's `stats` say are
/// latched (stats may know of a latch the events did not tell).
pub fn reported(stats: &pb::Stats, (kind, rule, key): Release<'_>) -> Vec<String> {
    let mut keys = Vec::new();
    for r in stats.rules.iter().filter(|r| r.rule == rule) {
        match kind {
            LatchKind::Fuse if r.fuse_state() != pb::FuseState::Closed => keys.push(String::new()),
            LatchKind::Fuse => {}
            LatchKind::Limit => keys.extend(
                engaged_keys(r)
                    .into_iter()
                    .filter(|k| key.is_none_or(|key| key == *k))
                    .map(str::to_owned),
            ),
        }
    }
    keys
}
