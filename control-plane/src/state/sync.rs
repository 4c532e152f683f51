//! Sync state per agent, as `istioctl proxy-status` shows it, and the
//! outcomes an `Apply` answers with.

use gov_proto::v1 as pb;

use super::{Agent, State};

impl State {
    /// The sync state of `agent`, as `istioctl proxy-status` would show it.
    pub fn sync_state(&self, agent: &Agent) -> (pb::SyncState, String, String) {
        if agent.conn.is_none() {
            return (
                pb::SyncState::Disconnected,
                agent.disconnect_reason.clone(),
                String::new(),
            );
        }
        if agent.pending.is_some() {
            return (
                pb::SyncState::Stale,
                "sent, not yet acknowledged".into(),
                String::new(),
            );
        }
        let current = self.current_version(&agent.service);
        if let Some(n) = &agent.nack
            && current.as_deref() == Some(n.version.as_str())
        {
            return (pb::SyncState::Nacked, n.error.clone(), n.rule.clone());
        }
        match current {
            Some(v) if v == agent.last_good => {
                (pb::SyncState::Synced, String::new(), String::new())
            }
            Some(_) => (pb::SyncState::Stale, "not sent".into(), String::new()),
            None => (
                pb::SyncState::Stale,
                "nothing applied yet: the agent enforces its own last good config".into(),
                String::new(),
            ),
        }
    }

    /// The outcome of every agent of `services` (for `ApplyResult`).
    pub fn outcomes(&self, services: &[String]) -> Vec<pb::AgentOutcome> {
        self.agents
            .values()
            .filter(|a| services.contains(&a.service))
            .map(|a| {
                let (state, error, rule) = self.sync_state(a);
                pb::AgentOutcome {
                    service: a.service.clone(),
                    instance: a.instance.clone(),
                    state: state as i32,
                    version: a.last_good.clone(),
                    error: if state == pb::SyncState::Nacked {
                        error
                    } else {
                        String::new()
                    },
                    rule,
                }
            })
            .collect()
    }
}
