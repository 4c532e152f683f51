//! What agents report does to the latches: an event latches a rule or ends
//! an instance's hold on it; stats complete the events (one may have been
//! lost) and tell an instance that lost a latch (it restarted) from one
//! whose latch ended by itself (see `latch.rs`).

use std::collections::BTreeSet;

use gov_proto::v1 as pb;

use super::{
    Audits, Latch, LatchId, LatchKind, Latches, Reporter, SHADOW_NOTE, engaged_keys, fuse_recovery,
    id, is_shadow, release_after, service_of,
};
use crate::audit::AuditEntry;

/// An agent releasing a `release after` limit this close to govd's
/// deadline is on time (their clocks and start times differ a little).
const EXPIRY_SLACK_MS: u64 = 5_000;

// === impl Reporter ===

impl Reporter<'_> {
    /// Its instance holds (enforces) `latch`, as reported by its identity.
    fn holds(self, latch: &mut Latch) {
        latch.instances.insert(self.instance.to_owned());
        latch.not_enforced.remove(self.instance);
        latch
            .reported_by
            .insert(self.instance.to_owned(), self.identity.to_owned());
    }
}

// === impl Latches ===

impl Latches {
    /// Takes in the latches `by`'s stats report: whether they changed.
    /// Rules in `releasing` (a release the agent missed, on its way) are
    /// not a latch; once reported closed they leave `releasing`.
    pub fn on_stats(
        &mut self,
        policy: Option<&pb::Bundle>,
        by: Reporter<'_>,
        releasing: &mut BTreeSet<LatchId>,
        stats: &pb::Stats,
        now: u64,
        audits: &mut Audits,
    ) -> bool {
        let mut seen = stats.clone();
        hide_releasing(releasing, &mut seen);
        self.reconcile(policy, by, &seen, now, audits)
    }

    /// Records a fuse/limit event of agent `by`: whether the latches
    /// changed. Events about rules of another service are ignored: an agent
    /// speaks for itself only.
    pub fn on_event(
        &mut self,
        policy: Option<&pb::Bundle>,
        by: Reporter<'_>,
        event: &pb::Event,
        now: u64,
        audits: &mut Audits,
    ) -> bool {
        let (service, instance) = (by.service, by.instance);
        if event.rule.split_once('/').map(|(s, _)| s) != Some(service) {
            tracing::warn!(service, instance, rule = %event.rule, "ignoring an event about another service's rule");
            return false;
        }
        let at = if event.at_unix_ms == 0 {
            now
        } else {
            event.at_unix_ms
        };
        let fuse = id(LatchKind::Fuse, &event.rule, "");
        let limit = id(LatchKind::Limit, &event.rule, &event.key);
        // A rule in shadow latches in its own state and rejects nothing: the
        // reason (in the audit, `govc status`, the TUI) says so.
        let shadow_reason;
        let reason = if is_shadow(policy, &event.rule) {
            shadow_reason = format!("{}{SHADOW_NOTE}", event.reason);
            &shadow_reason
        } else {
            &event.reason
        };
        match event.kind() {
            pb::EventKind::FuseTripped | pb::EventKind::FuseHalfOpen => {
                let half_open = event.kind() == pb::EventKind::FuseHalfOpen;
                let latch = self.latch(&fuse, at, reason, by, audits);
                by.holds(latch);
                latch.half_open = half_open;
                if !half_open {
                    reason.clone_into(&mut latch.reason);
                }
                true
            }
            pb::EventKind::LimitEngaged => {
                let deadline = release_after(policy, &event.rule).map(|ms| at.saturating_add(ms));
                let latch = self.latch(&limit, at, reason, by, audits);
                by.holds(latch);
                if latch.deadline_unix_ms.is_none() {
                    latch.deadline_unix_ms = deadline;
                }
                true
            }
            pb::EventKind::FuseReleased => {
                self.end(&fuse, by, "released by the agent", now, audits)
            }
            pb::EventKind::LimitReleased => {
                self.end(&limit, by, "released by the agent", now, audits)
            }
            pb::EventKind::Unspecified => false,
        }
    }

    /// The latch `id`, created (and audited) if there is none.
    fn latch(
        &mut self,
        id: &LatchId,
        at: u64,
        reason: &str,
        by: Reporter<'_>,
        audits: &mut Audits,
    ) -> &mut Latch {
        let (kind, rule, key) = id;
        self.latches.entry(id.clone()).or_insert_with(|| {
            audits.push(entry(*kind, rule, key, by, "trip", reason, at));
            Latch {
                kind: *kind,
                rule: rule.clone(),
                key: key.clone(),
                since_unix_ms: at,
                reason: reason.to_owned(),
                half_open: false,
                deadline_unix_ms: None,
                instances: Default::default(),
                not_enforced: Default::default(),
                reported_by: Default::default(),
            }
        })
    }

    /// `instance` no longer holds the latch `id`; the latch ends (and that
    /// is audited) when no instance holds it any more.
    fn end(
        &mut self,
        id: &LatchId,
        by: Reporter<'_>,
        why: &str,
        now: u64,
        audits: &mut Audits,
    ) -> bool {
        let instance = by.instance;
        let Some(latch) = self.latches.get_mut(id) else {
            return false;
        };
        latch.instances.remove(instance);
        latch.not_enforced.remove(instance);
        latch.reported_by.remove(instance);
        if latch.instances.is_empty() {
            self.latches.remove(id);
            let (kind, rule, key) = id;
            audits.push(entry(*kind, rule, key, by, "untrip", why, now));
        }
        true
    }

    /// Whether a closed report of `instance` may end its hold on the latch:
    /// only for a fuse that recovers by itself, or a limit whose deadline
    /// has come. Otherwise the instance lost the latch (an agent restart).
    fn may_end(&self, policy: Option<&pb::Bundle>, id: &LatchId, now: u64) -> bool {
        match id.0 {
            LatchKind::Fuse => fuse_recovery(policy, &id.1).is_some(),
            LatchKind::Limit => self
                .latches
                .get(id)
                .and_then(|l| l.deadline_unix_ms)
                .is_some_and(|d| now.saturating_add(EXPIRY_SLACK_MS) >= d),
        }
    }

    /// An agent's stats say latch `id` is closed on `instance` while govd
    /// holds it there.
    fn reported_closed(
        &mut self,
        policy: Option<&pb::Bundle>,
        id: &LatchId,
        by: Reporter<'_>,
        now: u64,
        audits: &mut Audits,
    ) -> bool {
        let instance = by.instance;
        if self.may_end(policy, id, now) {
            let why = match id.0 {
                LatchKind::Fuse => "recovered on the agent (recover after)",
                LatchKind::Limit => "released on the agent (release after)",
            };
            return self.end(id, by, why, now, audits);
        }
        let Some(latch) = self.latches.get_mut(id) else {
            return false;
        };
        if !latch.not_enforced.insert(instance.to_owned()) {
            // Known already: audited once.
            return false;
        }
        let (kind, rule, key) = id;
        tracing::warn!(
            rule,
            key,
            instance,
            kind = kind.as_str(),
            "an agent reports a latched rule released without a release (restarted?); keeping the latch"
        );
        audits.push(entry(
            *kind,
            rule,
            key,
            by,
            "latch-not-enforced",
            "the agent reports it released without a release (it restarted?); govd keeps the latch: release it to clear",
            now,
        ));
        true
    }

    /// Stats complete the events: a fuse an agent reports open, a limit key
    /// it reports engaged, is latched (an event may have been lost); one it
    /// reports closed ends its hold on the latch only when the latch may
    /// end by itself (see the module doc).
    fn reconcile(
        &mut self,
        policy: Option<&pb::Bundle>,
        by: Reporter<'_>,
        stats: &pb::Stats,
        now: u64,
        audits: &mut Audits,
    ) -> bool {
        let (service, instance) = (by.service, by.instance);
        let mut changed = false;
        for r in &stats.rules {
            if r.rule.split_once('/').map(|(s, _)| s) != Some(service) {
                continue;
            }
            match r.kind() {
                pb::RuleKind::Fuse => {
                    let fuse = id(LatchKind::Fuse, &r.rule, "");
                    let open = r.fuse_state() != pb::FuseState::Closed;
                    let held = self.held(&fuse, instance);
                    if open && held != Held::Enforced {
                        let latch =
                            self.latch(&fuse, now, "reported open by the agent", by, audits);
                        by.holds(latch);
                        changed = true;
                    } else if !open && held == Held::Enforced {
                        changed |= self.reported_closed(policy, &fuse, by, now, audits);
                    }
                }
                pb::RuleKind::Limit => {
                    let engaged = engaged_keys(r);
                    for key in &engaged {
                        let limit = id(LatchKind::Limit, &r.rule, key);
                        if self.held(&limit, instance) == Held::Enforced {
                            continue;
                        }
                        let deadline =
                            release_after(policy, &r.rule).map(|ms| now.saturating_add(ms));
                        let latch =
                            self.latch(&limit, now, "reported engaged by the agent", by, audits);
                        by.holds(latch);
                        if latch.deadline_unix_ms.is_none() {
                            latch.deadline_unix_ms = deadline;
                        }
                        changed = true;
                    }
                    if r.engaged_keys_truncated {
                        // Keys past the list: no word on them either way.
                        continue;
                    }
                    let closed: Vec<LatchId> = self
                        .of(LatchKind::Limit, &r.rule, None)
                        .filter(|l| !engaged.contains(&l.key.as_str()))
                        .map(Latch::id)
                        .collect();
                    for limit in closed {
                        if self.held(&limit, instance) == Held::Enforced {
                            changed |= self.reported_closed(policy, &limit, by, now, audits);
                        }
                    }
                }
                _ => {}
            }
        }
        changed
    }

    /// How `instance` holds the latch `id`.
    fn held(&self, id: &LatchId, instance: &str) -> Held {
        match self.latches.get(id) {
            Some(l) if l.not_enforced.contains(instance) => Held::Lost,
            Some(l) if l.instances.contains(instance) => Held::Enforced,
            _ => Held::No,
        }
    }
}

/// How one instance holds a latch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// It reported the rule tripped and has not reported otherwise.
    Enforced,
    /// It reported it released without a release: govd still holds it.
    Lost,
    No,
}

/// An audit entry about the latch of `rule` and `key`, caused by `by`: the
/// record names the instance and the identity it proved.
fn entry(
    kind: LatchKind,
    rule: &str,
    key: &str,
    by: Reporter<'_>,
    action: &str,
    detail: &str,
    at: u64,
) -> AuditEntry {
    let service = service_of(rule);
    let instance = by.instance;
    AuditEntry {
        at_unix_ms: at,
        who: format!("agent {service}/{instance} ({})", by.identity),
        action: action.to_owned(),
        intent: String::new(),
        version: String::new(),
        kind: kind.as_str().to_owned(),
        rule: rule.to_owned(),
        key: key.to_owned(),
        targets: vec![instance.to_owned()],
        detail: detail.to_owned(),
    }
}

/// Hides from `stats` the latches whose missed release is on its way to
/// the agent (not a new latch), and forgets those the stats report released.
fn hide_releasing(releasing: &mut BTreeSet<LatchId>, stats: &mut pb::Stats) {
    if !releasing.is_empty() {
        stats.rules.retain_mut(|r| {
            let kind = match r.kind() {
                pb::RuleKind::Fuse => LatchKind::Fuse,
                pb::RuleKind::Limit => LatchKind::Limit,
                _ => return true,
            };
            let open: Vec<String> = match kind {
                LatchKind::Fuse if r.fuse_state() != pb::FuseState::Closed => {
                    vec![String::new()]
                }
                LatchKind::Fuse => Vec::new(),
                LatchKind::Limit => engaged_keys(r).into_iter().map(str::to_owned).collect(),
            };
            let mut left = Vec::new();
            let mut hidden = false;
            for key in open {
                if releasing.contains(&(kind, r.rule.clone(), key.clone())) {
                    hidden = true;
                } else {
                    left.push(key);
                }
            }
            // Keys no longer reported latched: their release is done.
            releasing.retain(|(k, rule, key)| {
                !(*k == kind && *rule == r.rule)
                    || r.engaged_keys_truncated
                    || match kind {
                        LatchKind::Fuse => r.fuse_state() != pb::FuseState::Closed,
                        LatchKind::Limit => engaged_keys(r).contains(&key.as_str()),
                    }
            });
            if !hidden {
                return true;
            }
            match kind {
                // The fuse's release is on its way: not a new latch.
                LatchKind::Fuse => false,
                LatchKind::Limit => {
                    // Only the keys whose release is on its way are hidden.
                    r.limit_engaged = !left.is_empty();
                    r.engaged_keys = left;
                    true
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent of the tests, by its instance.
    fn by(instance: &str) -> Reporter<'_> {
        Reporter {
            service: "order",
            instance,
            identity: "token `order-agents`",
        }
    }

    const FUSE: &str = "order/mdm";
    const LIMIT: &str = "order/crm";

    /// order: a manual fuse, an auto-recovering fuse and a limit that
    /// releases itself after 60s.
    fn bundle() -> pb::Bundle {
        let fuse = |rule: &str, kind| pb::Rule {
            name: rule.into(),
            spec: Some(pb::rule::Spec::Fuse(pb::Fuse {
                recover: Some(pb::Recovery { kind: Some(kind) }),
                ..Default::default()
            })),
            ..Default::default()
        };
        pb::Bundle {
            targets: vec![pb::TargetConfig {
                service: "order".into(),
                rules: vec![
                    fuse(FUSE, pb::recovery::Kind::Manual(true)),
                    fuse(
                        "order/auto",
                        pb::recovery::Kind::After(pb::AutoRecovery {
                            after_ms: 30_000,
                            ..Default::default()
                        }),
                    ),
                    pb::Rule {
                        name: LIMIT.into(),
                        spec: Some(pb::rule::Spec::Limit(pb::Limit {
                            release: Some(pb::Release {
                                kind: Some(pb::release::Kind::AfterMs(60_000)),
                            }),
                            ..Default::default()
                        })),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn event(kind: pb::EventKind, rule: &str, at: u64) -> pb::Event {
        pb::Event {
            kind: kind as i32,
            rule: rule.into(),
            reason: "errors >= 3 over 10s".into(),
            at_unix_ms: at,
            key: String::new(),
        }
    }

    fn stats(rule: &str, kind: pb::RuleKind, tripped: bool) -> pb::Stats {
        pb::Stats {
            rules: vec![pb::RuleStats {
                rule: rule.into(),
                kind: kind as i32,
                fuse_state: if tripped && kind == pb::RuleKind::Fuse {
                    pb::FuseState::Open
                } else {
                    pb::FuseState::Closed
                } as i32,
                limit_engaged: tripped && kind == pb::RuleKind::Limit,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn actions(audits: &Audits) -> Vec<&str> {
        audits.iter().map(|a| a.action.as_str()).collect()
    }

    #[test]
    fn the_latch_of_a_shadow_rule_says_it_rejects_nothing() {
        let mut b = bundle();
        for r in &mut b.targets[0].rules {
            r.mode = pb::Mode::Shadow as i32;
        }
        let mut l = Latches::default();
        let mut audits = Vec::new();
        let tripped = event(pb::EventKind::FuseTripped, FUSE, 10);
        assert!(l.on_event(Some(&b), by("a"), &tripped, 10, &mut audits));
        let reason = "errors >= 3 over 10s (mode shadow: rejects nothing)";
        assert_eq!(l.iter().next().unwrap().reason, reason);
        assert_eq!(
            (audits[0].action.as_str(), audits[0].detail.as_str()),
            ("trip", reason)
        );
    }

    #[test]
    fn an_agent_that_forgot_a_manual_fuse_does_not_release_it_and_that_is_audited_once() {
        let b = bundle();
        let mut l = Latches::default();
        let mut audits = Vec::new();
        assert!(l.on_event(
            Some(&b),
            by("a"),
            &event(pb::EventKind::FuseTripped, FUSE, 10),
            10,
            &mut audits
        ));
        assert_eq!(actions(&audits), ["trip"]);
        assert_eq!(audits[0].who, "agent order/a (token `order-agents`)");

        // The agent restarted and forgot: it reports the fuse closed.
        let closed = stats(FUSE, pb::RuleKind::Fuse, false);
        assert!(l.reconcile(Some(&b), by("a"), &closed, 20, &mut audits));
        assert!(l.contains(LatchKind::Fuse, FUSE, None), "the latch holds");
        let latch = l.iter().next().unwrap();
        assert!(latch.not_enforced.contains("a"));
        assert_eq!(actions(&audits), ["trip", "latch-not-enforced"]);
        // Every second the same report: nothing new to record.
        assert!(!l.reconcile(Some(&b), by("a"), &closed, 21, &mut audits));
        assert_eq!(audits.len(), 2);

        // It trips again: it enforces the latch again.
        let open = stats(FUSE, pb::RuleKind::Fuse, true);
        assert!(l.reconcile(Some(&b), by("a"), &open, 30, &mut audits));
        assert!(l.iter().next().unwrap().not_enforced.is_empty());
        assert_eq!(audits.len(), 2, "the same latch: no second trip entry");
        // Only a release ends it.
        assert_eq!(l.remove(LatchKind::Fuse, FUSE, None), [""]);
    }

    #[test]
    fn a_self_recovering_fuse_and_an_expired_limit_end_with_an_audit_entry() {
        let b = bundle();
        let mut l = Latches::default();
        let mut audits = Vec::new();
        let open = stats("order/auto", pb::RuleKind::Fuse, true);
        assert!(l.reconcile(Some(&b), by("a"), &open, 10, &mut audits));
        let closed = stats("order/auto", pb::RuleKind::Fuse, false);
        assert!(l.reconcile(Some(&b), by("a"), &closed, 40_010, &mut audits));
        assert!(!l.contains(LatchKind::Fuse, "order/auto", None));
        assert_eq!(actions(&audits), ["trip", "untrip"]);

        audits.clear();
        let engaged = event(pb::EventKind::LimitEngaged, LIMIT, 1_000);
        assert!(l.on_event(Some(&b), by("a"), &engaged, 1_000, &mut audits));
        let released = stats(LIMIT, pb::RuleKind::Limit, false);
        // Before its deadline (61s): a lost latch, kept.
        assert!(l.reconcile(Some(&b), by("a"), &released, 30_000, &mut audits));
        assert!(l.contains(LatchKind::Limit, LIMIT, None));
        assert_eq!(actions(&audits), ["trip", "latch-not-enforced"]);
        // A new engage clears the mark; at its deadline the agent's release ends it.
        let engaged = stats(LIMIT, pb::RuleKind::Limit, true);
        assert!(l.reconcile(Some(&b), by("a"), &engaged, 31_000, &mut audits));
        assert!(l.reconcile(Some(&b), by("a"), &released, 61_000, &mut audits));
        assert!(!l.contains(LatchKind::Limit, LIMIT, None));
        assert_eq!(actions(&audits), ["trip", "latch-not-enforced", "untrip"]);
    }

    #[test]
    fn an_explicit_release_event_ends_the_hold_of_that_instance_only() {
        let b = bundle();
        let mut l = Latches::default();
        let mut audits = Vec::new();
        for i in ["a", "b"] {
            let e = event(pb::EventKind::FuseTripped, FUSE, 10);
            l.on_event(Some(&b), by(i), &e, 10, &mut audits);
        }
        let released = event(pb::EventKind::FuseReleased, FUSE, 20);
        assert!(l.on_event(Some(&b), by("a"), &released, 20, &mut audits));
        assert!(l.contains(LatchKind::Fuse, FUSE, None), "b still holds it");
        assert!(l.on_event(Some(&b), by("b"), &released, 21, &mut audits));
        assert!(!l.contains(LatchKind::Fuse, FUSE, None));
        assert_eq!(actions(&audits), ["trip", "untrip"]);
    }

    /// A limit's stats listing `keys` engaged.
    fn keyed(keys: &[&str]) -> pb::Stats {
        pb::Stats {
            rules: vec![pb::RuleStats {
                rule: LIMIT.into(),
                kind: pb::RuleKind::Limit as i32,
                limit_engaged: !keys.is_empty(),
                engaged_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn each_key_of_a_limit_is_its_own_latch_tripped_released_and_audited_alone() {
        let b = bundle();
        let mut l = Latches::default();
        let mut audits = Vec::new();
        for key in ["alice", "bob"] {
            let e = pb::Event {
                key: key.into(),
                ..event(pb::EventKind::LimitEngaged, LIMIT, 10)
            };
            assert!(l.on_event(Some(&b), by("a"), &e, 10, &mut audits));
        }
        assert_eq!(l.iter().count(), 2, "two consumers: two latches");
        assert_eq!(actions(&audits), ["trip", "trip"]);
        assert_eq!(audits[1].key, "bob");

        // The agent reports only bob engaged (it restarted and kept one?):
        // alice is kept, marked as not enforced there, once.
        assert!(l.reconcile(Some(&b), by("a"), &keyed(&["bob"]), 20, &mut audits));
        let alice = l.of(LatchKind::Limit, LIMIT, Some("alice")).next().unwrap();
        assert!(alice.not_enforced.contains("a"));
        assert_eq!(actions(&audits), ["trip", "trip", "latch-not-enforced"]);
        assert_eq!(audits[2].key, "alice");
        assert!(!l.reconcile(Some(&b), by("a"), &keyed(&["bob"]), 21, &mut audits));

        // A truncated list says nothing about the keys it leaves out.
        let mut cut = keyed(&["bob"]);
        cut.rules[0].engaged_keys_truncated = true;
        assert!(!l.reconcile(Some(&b), by("a"), &cut, 22, &mut audits));

        // Releasing one key leaves the other.
        assert_eq!(l.remove(LatchKind::Limit, LIMIT, Some("bob")), ["bob"]);
        assert!(l.contains(LatchKind::Limit, LIMIT, Some("alice")));
        assert!(!l.contains(LatchKind::Limit, LIMIT, Some("bob")));
        // A third consumer reported by stats alone is latched and audited.
        assert!(l.reconcile(Some(&b), by("a"), &keyed(&["carol"]), 30, &mut audits));
        assert!(l.contains(LatchKind::Limit, LIMIT, Some("carol")));
        assert_eq!(audits.last().unwrap().key, "carol");
        // Every key at once.
        let mut gone = l.remove(LatchKind::Limit, LIMIT, None);
        gone.sort();
        assert_eq!(gone, ["alice", "carol"]);
    }

    #[test]
    fn an_agent_without_engaged_keys_is_read_as_the_rules_own_counter() {
        let b = bundle();
        let mut l = Latches::default();
        let mut audits = Vec::new();
        let old = stats(LIMIT, pb::RuleKind::Limit, true);
        assert!(l.reconcile(Some(&b), by("a"), &old, 10, &mut audits));
        assert!(l.contains(LatchKind::Limit, LIMIT, Some("")));
        assert_eq!(l.iter().count(), 1);
    }
}
