//! What the latches (`crate::latch`) decide, delivered to the state's
//! agents: the reporter an agent is, the releases and re-arms each agent
//! is sent, and what a release changes in the agents' last stats. The
//! latches themselves, and every rule about them, are `crate::latch`'s;
//! nothing here reads or changes a latch but through its API.

use std::collections::BTreeSet;

use super::agent::{Agent, AgentKey, Outbox};
use super::agents::Agents;
use crate::encoded::Encoded;
use crate::latch::release::{self, arm_message, release_message};
use crate::latch::{LatchId, Latches, Release, Reporter};

/// `agent` as the reporter of a latch change.
pub(super) fn reporter(agent: &Agent) -> Reporter<'_> {
    Reporter {
        service: &agent.service,
        instance: &agent.instance,
        identity: &agent.identity,
    }
}

/// `agent` as the reporter of its stats, and the releases on their way to
/// it (which its stats may still show latched).
pub(super) fn reporter_releasing(agent: &mut Agent) -> (Reporter<'_>, &mut BTreeSet<LatchId>) {
    let by = Reporter {
        service: &agent.service,
        instance: &agent.instance,
        identity: &agent.identity,
    };
    (by, &mut agent.releasing)
}

/// Queues an `Arm` command for every latch of `key`'s service that this
/// instance held (or was marked as not enforcing) and that is not in
/// `held`: each key of a keyed limit alone.
pub(super) fn rearm(
    latches: &Latches,
    agents: &Agents,
    key: &AgentKey,
    held: &BTreeSet<LatchId>,
    out: &mut Outbox,
) {
    let Some(agent) = agents.get(key).filter(|a| a.conn.is_some()) else {
        return;
    };
    let (service, instance) = key;
    for latch in latches.to_rearm(service, instance, &agent.identity, held) {
        out.extend(agent.outgoing(Encoded::new(&arm_message(latch))));
    }
}

/// Queues the releases `key` missed and remembers them until its stats
/// say they are done.
pub(super) fn send_missed(
    agents: &mut Agents,
    key: &AgentKey,
    missed: BTreeSet<LatchId>,
    out: &mut Outbox,
) {
    let Some(agent) = agents.get_mut(key) else {
        return;
    };
    for (kind, rule, latch_key) in &missed {
        let msg = release_message(
            (*kind, rule, Some(latch_key)),
            "govd (a release made while this agent was away)",
        );
        if let Some(o) = agent.outgoing(Encoded::new(&msg)) {
            tracing::info!(%rule, key = %latch_key, instance = %key.1, kind = kind.as_str(), "sending a release the agent missed while away");
            out.push(o);
        }
    }
    agent.releasing = missed;
}

/// What [`release`] would return, without changing anything: for the
/// audit record written before the release takes effect.
pub(super) fn release_preview(
    latches: &Latches,
    agents: &Agents,
    (kind, rule, key): Release<'_>,
) -> (Vec<String>, Vec<String>) {
    let service = rule.split_once('/').map_or("", |(s, _)| s);
    let mut keys: BTreeSet<String> = latches.of(kind, rule, key).map(|l| l.key.clone()).collect();
    let mut notified = Vec::new();
    for a in connected(agents, service) {
        keys.extend(reported(a, (kind, rule, key)));
        notified.push(a.instance.clone());
    }
    (keys.into_iter().collect(), notified)
}

/// Releases `rule` (its `key` only, or every key) in `latches`, and queues
/// the release command to every connected agent of the rule's service.
/// Returns (the keys that were latched, instances notified).
pub(super) fn release(
    latches: &mut Latches,
    agents: &mut Agents,
    release: Release<'_>,
    who: &str,
    now: u64,
    out: &mut Outbox,
) -> (Vec<String>, Vec<String>) {
    let mut keys: BTreeSet<String> = latches.release(release, now).into_iter().collect();
    let (notified, reported) = deliver(agents, release, who, out);
    keys.extend(reported);
    (keys.into_iter().collect(), notified)
}

/// Takes in another replica's latches and releases (`Latches::adopt`):
/// each release not seen here yet goes to this replica's agents.
pub(super) fn adopt(
    latches: &mut Latches,
    agents: &mut Agents,
    releases: Vec<crate::latch::Released>,
    theirs: Vec<crate::latch::Latch>,
    out: &mut Outbox,
) {
    for r in latches.adopt(releases, theirs) {
        let key = (!r.key.is_empty()).then_some(r.key.as_str());
        let who = "govd (a release made through another replica)";
        deliver(agents, (r.kind, &r.rule, key), who, out);
    }
}

/// Forgets `release` in the last stats of the agents of its service and
/// queues it to the connected ones. Returns (instances notified, the keys
/// their stats still reported latched).
fn deliver(
    agents: &mut Agents,
    release: Release<'_>,
    who: &str,
    out: &mut Outbox,
) -> (Vec<String>, Vec<String>) {
    let service = release.1.split_once('/').map_or("", |(s, _)| s).to_owned();
    let stats = agents
        .values_mut()
        .filter(|a| a.service == service)
        .filter_map(|a| a.stats.as_mut());
    for s in stats {
        release::forget_reported(s, release);
    }
    let msg = Encoded::new(&release_message(release, who));
    let (mut notified, mut keys) = (Vec::new(), Vec::new());
    for a in connected(agents, &service) {
        keys.extend(reported(a, release));
        out.extend(a.outgoing(msg.clone()));
        notified.push(a.instance.clone());
    }
    (notified, keys)
}

/// The keys `agent`'s last stats say are latched for `release`.
fn reported(agent: &Agent, release: Release<'_>) -> Vec<String> {
    agent
        .stats
        .as_ref()
        .map_or_else(Vec::new, |s| release::reported(s, release))
}

/// Connected agents of `service`.
fn connected<'a>(agents: &'a Agents, service: &'a str) -> impl Iterator<Item = &'a Agent> {
    agents
        .values()
        .filter(move |a| a.service == service && a.conn.is_some())
}
