//! Rules that expire (`expires T`, `for D`): govd's side. Each agent stops
//! enforcing an expired rule by itself, at the instant its config carries
//! (the engine's `Expiry`); govd, on the leader, records each expiry in the
//! audit when it passes (`expire`, once per rule and instant), and first
//! ends the rule's latches (a tripped fuse, an engaged limit, every key),
//! each a release audited like any other (`release-intended` then
//! `release`, by `govd (rule expired)`), so that no latch outlives its rule
//! unseen. A latch that cannot be released now (the store refuses the
//! write) is retried, and the expiry is recorded only once its latches are
//! gone.
//!
//! An expiry that passed while govd was down is recorded when it starts
//! (the newest page of the audit log says which expiries are recorded).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as pb;

use crate::control_plane::Inner;
use crate::convert::now_unix_ms;
use crate::latch::LatchKind;
use crate::store::{AuditEntry, Fence};

/// Who ends an expired rule's latches, in the audit.
pub const WHO: &str = "govd (rule expired)";

/// The expiries of `bundle`: `(rule, kind, at, for_ms)`.
fn expiries(bundle: &pb::Bundle) -> Vec<(String, pb::RuleKind, u64, u64)> {
    bundle
        .targets
        .iter()
        .flat_map(|t| &t.rules)
        .filter(|r| r.expires_at_unix_ms > 0)
        .map(|r| (r.name.clone(), r.kind(), r.expires_at_unix_ms, r.for_ms))
        .collect()
}

/// The audit detail of an expiry.
fn detail(at: u64, for_ms: u64) -> String {
    let at = gov_common::instant::Utc(at);
    match for_ms {
        0 => format!("expired at {at} (expires); every agent stopped enforcing it then"),
        d => format!(
            "expired at {at} (for {} from its apply); every agent stopped enforcing it then",
            gov_common::instant::left(d)
        ),
    }
}

impl Inner {
    /// The expiries recorded in the newest page of the audit log.
    async fn recorded_expiries(&self) -> HashSet<(String, String)> {
        let query = crate::audit::Query::default();
        match self.store.audit_page(query).await {
            Ok(page) => page
                .records
                .into_iter()
                .filter(|(_, e)| e.action == "expire")
                .map(|(_, e)| (e.rule, e.detail))
                .collect(),
            Err(error) => {
                tracing::warn!(error = %crate::error::one_line(&error), "cannot read the audit log: expiries already recorded may be recorded again");
                HashSet::new()
            }
        }
    }

    /// Records each expiry of the applied policy when it passes (on the
    /// leader), after ending the rule's latches. Wakes at the next expiry,
    /// at each new view (an apply), and at least every minute.
    pub(crate) async fn expire_rules(self: Arc<Self>) {
        let mut leader = self.store.leader();
        let mut views = self.policy_version.subscribe();
        let mut recorded = self.recorded_expiries().await;
        loop {
            while !*leader.borrow_and_update() {
                tokio::select! {
                    () = self.shutdown.cancelled() => return,
                    r = leader.changed() => if r.is_err() { return },
                }
            }
            let now = now_unix_ms();
            let (all, latches) = {
                let state = self.lock();
                let all = state.bundle().map(expiries).unwrap_or_default();
                let latches: Vec<(LatchKind, String)> =
                    state.latches().map(|t| (t.kind, t.rule.clone())).collect();
                (all, latches)
            };
            let next = all.iter().filter(|e| e.2 > now).map(|e| e.2 - now).min();
            let mut retry = false;
            for (rule, kind, at, for_ms) in all.into_iter().filter(|e| e.2 <= now) {
                let detail = detail(at, for_ms);
                if recorded.contains(&(rule.clone(), detail.clone())) {
                    continue;
                }
                let mut kinds: Vec<LatchKind> = latches
                    .iter()
                    .filter(|(_, r)| *r == rule)
                    .map(|(k, _)| *k)
                    .collect();
                kinds.dedup();
                let mut ended = true;
                for k in kinds {
                    if let Err(error) = self.release(k, &rule, None, WHO, Fence::Leader).await {
                        tracing::error!(%rule, error = %crate::error::one_line(&error), "cannot end the latch of an expired rule; retrying");
                        ended = false;
                    }
                }
                if !ended {
                    retry = true;
                    continue;
                }
                tracing::info!(%rule, at, "the rule expired");
                self.audit(AuditEntry {
                    at_unix_ms: now_unix_ms(),
                    who: "govd".into(),
                    action: "expire".into(),
                    kind: kind.word().into(),
                    rule: rule.clone(),
                    detail: detail.clone(),
                    ..AuditEntry::default()
                })
                .await;
                recorded.insert((rule, detail));
            }
            let wait = match (next, retry) {
                (_, true) => Duration::from_secs(1),
                (Some(ms), false) => Duration::from_millis(ms.clamp(1, 60_000)),
                (None, false) => Duration::from_secs(60),
            };
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
                r = views.changed() => if r.is_err() { return },
                () = crate::store::leadership_change(&mut leader) => {}
            }
        }
    }
}
