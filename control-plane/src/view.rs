//! The status view: the `ClusterView` that `Status` answers and `Watch`
//! streams, built from the control plane's [`State`] (read only). Agents
//! with their sync state, every rule with its stats summed over the
//! connected agents of its service, tripped fuses and engaged limits.

use gov_proto::v1 as pb;

use crate::latch::LatchKind;
use crate::latch::SHADOW_NOTE;
use crate::state::State;

/// The most bytes of one `ClusterView` that `Status` and `Watch` send: a
/// quarter of govc's decode limit (64 MiB), so that no viewer is ever sent
/// a view it cannot read, however many agents bring however many labels.
pub const MAX_VIEW_BYTES: usize = 16 << 20;

/// `view` within `max_bytes` encoded: the agents' labels are left out
/// first, then agent rows from the end, and the view says so
/// (`labels_left_out`, `agents_left_out`).
pub fn bounded(mut view: pb::ClusterView, max_bytes: usize) -> pb::ClusterView {
    use prost::Message as _;
    let mut size = view.encoded_len();
    if size <= max_bytes {
        return view;
    }
    for agent in &mut view.agents {
        agent.labels.clear();
    }
    view.labels_left_out = true;
    size = view.encoded_len();
    while size > max_bytes {
        let Some(agent) = view.agents.pop() else {
            break;
        };
        size = size.saturating_sub(prost::encoding::message::encoded_len(3, &agent));
        view.agents_left_out = view.agents_left_out.saturating_add(1);
    }
    view
}

/// Every agent of `agents` counted per service and sync state, by service
/// then state: what `ClusterView.agent_counts` carries.
pub fn agent_counts(agents: &[pb::AgentView]) -> Vec<pb::AgentCount> {
    let mut counts: std::collections::BTreeMap<(&str, i32), (u32, u32)> = Default::default();
    for a in agents {
        let (n, mtls) = counts.entry((a.service.as_str(), a.state)).or_default();
        *n = n.saturating_add(1);
        *mtls = mtls.saturating_add(u32::from(a.inbound_mtls));
    }
    counts
        .into_iter()
        .map(
            |((service, state), (agents, inbound_mtls))| pb::AgentCount {
                service: service.to_owned(),
                state,
                agents,
                inbound_mtls,
            },
        )
        .collect()
}

/// `view` (its `agent_counts` kept) with only the agent rows asked for: `rows` of them, at most `max` (0: no bound), by service and
/// instance when bounded; the rows of that kind left out are counted in
/// `agents_left_out`. `AgentRows::All` with no bound leaves the rows as
/// they are, as `Status` and `Watch` answered before these fields.
pub fn select_agents(mut view: pb::ClusterView, rows: pb::AgentRows, max: u32) -> pb::ClusterView {
    match rows {
        pb::AgentRows::All => {}
        pb::AgentRows::NotSynced => view.agents.retain(|a| a.state() != pb::SyncState::Synced),
        pb::AgentRows::None => view.agents.clear(),
    }
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    if max > 0 && view.agents.len() > max {
        let by_name = |a: &pb::AgentView, b: &pb::AgentView| {
            (&a.service, &a.instance).cmp(&(&b.service, &b.instance))
        };
        let left = view.agents.len() - max;
        view.agents.select_nth_unstable_by(max - 1, by_name);
        view.agents.truncate(max);
        view.agents.sort_unstable_by(by_name);
        view.agents_left_out = view
            .agents_left_out
            .saturating_add(u32::try_from(left).unwrap_or(u32::MAX));
    }
    view
}

/// The cluster as `Watch` and `Status` show it, at `now` (Unix ms).
pub fn cluster_view(state: &State, now: u64) -> pb::ClusterView {
    let agents: Vec<pb::AgentView> = state
        .agents()
        .map(|a| {
            let (sync, reason, rule) = state.sync_state(a);
            pb::AgentView {
                service: a.service().to_owned(),
                instance: a.instance().to_owned(),
                address: a.address().to_owned(),
                state: sync as i32,
                reason,
                rule,
                version: a.version().to_owned(),
                last_good_version: a.last_good().to_owned(),
                phase: a.phase() as i32,
                weight_milli_percent: a.weight_milli_percent(),
                last_seen_unix_ms: if a.is_connected() {
                    now
                } else {
                    a.last_seen_unix_ms()
                },
                labels: a.labels().clone().into_iter().collect(),
                removal_waiting_on: state.removal_waiting_on(a),
                inbound_mtls: a.inbound_mtls(),
            }
        })
        .collect();
    let mut rules = Vec::new();
    for t in state
        .bundle()
        .map(|b| b.targets.as_slice())
        .unwrap_or_default()
    {
        for r in &t.rules {
            let kind = r.kind();
            rules.push(pb::RuleView {
                rule: r.name.clone(),
                kind: kind as i32,
                source: r.source.clone(),
                stats: Some(aggregate(state, &t.service, &r.name, kind)),
                mode: r.mode,
                shadow_since_unix_ms: state.shadow_since(&r.name).unwrap_or(0),
                expires_at_unix_ms: r.expires_at_unix_ms,
            });
        }
    }
    let source = |kind: LatchKind, rule: &str| -> Option<pb::SourceRef> {
        let (service, _) = rule.split_once('/')?;
        let t = state.target(service)?;
        t.rule(rule)
            .filter(|r| r.kind() == kind.rule_kind())?
            .source
            .clone()
    };
    let fuses = state
        .latches()
        .filter(|t| t.kind == LatchKind::Fuse)
        .map(|t| pb::FuseView {
            rule: t.rule.clone(),
            state: if t.half_open {
                pb::FuseState::HalfOpen
            } else {
                pb::FuseState::Open
            } as i32,
            since_unix_ms: t.since_unix_ms,
            reason: latch_reason(state, t),
            remaining_ms: state.fuse_recovery(&t.rule).map_or(0, |after| {
                t.since_unix_ms
                    .saturating_add(after)
                    .saturating_sub(now)
                    .max(1)
            }),
            source: source(LatchKind::Fuse, &t.rule),
        })
        .collect();
    let limits = state
        .latches()
        .filter(|t| t.kind == LatchKind::Limit)
        .map(|t| pb::LimitView {
            rule: t.rule.clone(),
            key: t.key.clone(),
            since_unix_ms: t.since_unix_ms,
            reason: latch_reason(state, t),
            remaining_ms: t
                .deadline_unix_ms
                .map_or(0, |d| d.saturating_sub(now).max(1)),
            source: source(LatchKind::Limit, &t.rule),
        })
        .collect();
    pb::ClusterView {
        at_unix_ms: now,
        version: state.version().to_owned(),
        rules,
        fuses,
        limits,
        labels_left_out: false,
        agents_left_out: 0,
        store: None,
        consumer_sources: state
            .bundle()
            .map(|b| b.targets.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|t| {
                let words = gov_proto::compiled::consumer_source_words(t);
                (t.service.clone(), words)
            })
            .collect(),
        canary: state.canary().map(|c| c.view()),
        agent_counts: agent_counts(&agents),
        agents,
    }
}

/// The latch's reason, saying whether it rejects nothing by the rule's mode
/// now (a latch engaged in shadow is enforced once the rule is switched to
/// enforce, and the other way round), and the instances that report it
/// released although nobody released it (an agent that restarted and
/// forgot it): the latch is not enforced there, and an operator must know.
fn latch_reason(state: &State, t: &crate::latch::Latch) -> String {
    let base = t.reason.strip_suffix(SHADOW_NOTE).unwrap_or(&t.reason);
    let shadow = t
        .rule
        .split_once('/')
        .and_then(|(service, _)| state.target(service))
        .and_then(|target| target.rule(&t.rule))
        .is_some_and(|r| r.mode() == pb::Mode::Shadow);
    let note = if shadow { SHADOW_NOTE } else { "" };
    if t.not_enforced.is_empty() {
        return format!("{base}{note}");
    }
    let names: Vec<&str> = t.not_enforced.iter().map(String::as_str).collect();
    format!(
        "{base}{note}; NOT ENFORCED by {} (reports it released without a release)",
        names.join(", ")
    )
}

/// One rule's stats summed over the connected agents of its service.
/// Fuse state is the worst any agent reports; capacity is summed like
/// the in-flight count it bounds.
fn aggregate(state: &State, service: &str, rule: &str, kind: pb::RuleKind) -> pb::RuleStats {
    let mut sum = pb::RuleStats {
        rule: rule.to_owned(),
        kind: kind as i32,
        rejected: Some(pb::Rejections::default()),
        ..Default::default()
    };
    let mut worst = pb::FuseState::Closed;
    for a in state.connected(service) {
        let Some(r) = a
            .stats()
            .and_then(|s| s.rules.iter().find(|r| r.rule == rule))
        else {
            continue;
        };
        sum.in_flight += r.in_flight;
        sum.waiting += r.waiting;
        sum.admitted += r.admitted;
        sum.capacity += r.capacity;
        sum.retries += r.retries;
        sum.retries_refused += r.retries_refused;
        sum.limit_engaged |= r.limit_engaged;
        sum.engaged_keys_truncated |= r.engaged_keys_truncated;
        sum.engaged_keys.extend(r.engaged_keys.iter().cloned());
        if let (Some(s), Some(x)) = (sum.rejected.as_mut(), r.rejected.as_ref()) {
            s.add(x);
        }
        if let Some(x) = &r.shadow_rejected {
            sum.shadow_rejected.get_or_insert_default().add(x);
        }
        if sum.latency_buckets.len() < r.latency_buckets.len() {
            sum.latency_buckets.resize(r.latency_buckets.len(), 0);
        }
        for (s, x) in sum.latency_buckets.iter_mut().zip(&r.latency_buckets) {
            *s += x;
        }
        if sum.grpc_outcomes.len() < r.grpc_outcomes.len() {
            sum.grpc_outcomes.resize(r.grpc_outcomes.len(), 0);
        }
        for (s, x) in sum.grpc_outcomes.iter_mut().zip(&r.grpc_outcomes) {
            *s += x;
        }
        worst = match (worst, r.fuse_state()) {
            (pb::FuseState::Open, _) | (_, pb::FuseState::Open) => pb::FuseState::Open,
            (pb::FuseState::HalfOpen, _) | (_, pb::FuseState::HalfOpen) => pb::FuseState::HalfOpen,
            _ => pb::FuseState::Closed,
        };
    }
    sum.fuse_state = worst as i32;
    // The union of the agents' latched keys, as bounded as each agent's list.
    sum.engaged_keys.sort_unstable();
    sum.engaged_keys.dedup();
    if sum.engaged_keys.len() > MAX_ENGAGED_KEYS {
        sum.engaged_keys.truncate(MAX_ENGAGED_KEYS);
        sum.engaged_keys_truncated = true;
    }
    sum
}

/// As many latched keys per rule as an agent's stats list (the agent's
/// `MAX_ENGAGED_KEYS`).
const MAX_ENGAGED_KEYS: usize = 64;

/// Keeps only what concerns `service` ("" keeps everything).
pub fn filter_view(mut view: pb::ClusterView, service: &str) -> pb::ClusterView {
    if service.is_empty() {
        return view;
    }
    let ours = |rule: &str| rule.split_once('/').is_some_and(|(s, _)| s == service);
    view.agents.retain(|a| a.service == service);
    view.agent_counts.retain(|c| c.service == service);
    view.rules.retain(|r| ours(&r.rule));
    view.fuses.retain(|f| ours(&f.rule));
    view.limits.retain(|l| ours(&l.rule));
    view.consumer_sources.retain(|s, _| s == service);
    view
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pb::agent_message::Msg as AgentMsg;

    use super::*;
    use crate::store::AppliedPolicy;

    #[test]
    fn a_view_over_its_bound_loses_labels_then_agent_rows_and_says_so() {
        use prost::Message as _;
        let agent = |i: usize| pb::AgentView {
            service: "order".into(),
            instance: format!("order-{i}"),
            labels: [("blob".to_owned(), "x".repeat(1_000))].into(),
            ..Default::default()
        };
        let view = pb::ClusterView {
            agents: (0..100).map(agent).collect(),
            ..Default::default()
        };
        let size = view.encoded_len();
        assert!(size > 100_000);
        assert_eq!(bounded(view.clone(), size), view, "within its bound: as is");
        let small = bounded(view.clone(), 10_000);
        assert!(small.labels_left_out);
        assert_eq!(small.agents.len(), 100);
        assert_eq!(small.agents_left_out, 0);
        assert!(small.encoded_len() <= 10_000);
        let tiny = bounded(view, 500);
        assert!(tiny.encoded_len() <= 500, "{}", tiny.encoded_len());
        assert!(tiny.agents_left_out > 0);
        assert_eq!(tiny.agents.len() + tiny.agents_left_out as usize, 100);
        assert_eq!(
            tiny.agents[0].instance, "order-0",
            "rows from the end go first"
        );
    }

    #[test]
    fn ten_thousand_agents_are_counted_and_the_rows_not_synced_bounded() {
        use prost::Message as _;
        // One agent in 97 not SYNCED (104 of them), over four services.
        let agent = |i: usize| pb::AgentView {
            service: format!("svc-{}", i % 4),
            instance: format!("svc-{}-{i:05}", i % 4),
            address: format!("10.0.{}.{}:8080", i >> 8, i & 255),
            state: if i.is_multiple_of(97) {
                pb::SyncState::Stale
            } else {
                pb::SyncState::Synced
            } as i32,
            version: "0123456789abcdef".into(),
            last_good_version: "0123456789abcdef".into(),
            last_seen_unix_ms: 1_700_000_000_000,
            ..Default::default()
        };
        let mut agents: Vec<pb::AgentView> = (0..10_000).map(agent).collect();
        agents.reverse();
        let view = pb::ClusterView {
            agent_counts: agent_counts(&agents),
            agents,
            ..Default::default()
        };
        assert_eq!(view.agent_counts.len(), 8, "4 services x 2 states");
        let total: u32 = view.agent_counts.iter().map(|c| c.agents).sum();
        assert_eq!(total, 10_000);
        let stale: u32 = view
            .agent_counts
            .iter()
            .filter(|c| c.state() == pb::SyncState::Stale)
            .map(|c| c.agents)
            .sum();
        assert_eq!(stale, 104);

        let full = select_agents(view.clone(), pb::AgentRows::All, 0);
        assert_eq!((full.agents.len(), full.agents_left_out), (10_000, 0));

        let summary = select_agents(view.clone(), pb::AgentRows::NotSynced, 50);
        assert_eq!(summary.agents.len(), 50);
        assert_eq!(summary.agents_left_out, 54, "the not SYNCED rows left out");
        assert!(
            summary
                .agents
                .iter()
                .all(|a| a.state() == pb::SyncState::Stale)
        );
        assert!(
            summary
                .agents
                .windows(2)
                .all(|w| (&w[0].service, &w[0].instance) < (&w[1].service, &w[1].instance)),
            "the first by service and instance, in order"
        );
        assert_eq!(
            summary.agent_counts, view.agent_counts,
            "counts every agent"
        );
        let (full_bytes, summary_bytes) = (full.encoded_len(), summary.encoded_len());
        assert!(full_bytes > 500_000, "{full_bytes}");
        assert!(summary_bytes < 10_000, "{summary_bytes}");

        let none = select_agents(view.clone(), pb::AgentRows::None, 0);
        assert_eq!((none.agents.len(), none.agents_left_out), (0, 0));
        assert_eq!(none.agent_counts.len(), 8);

        let one = filter_view(view, "svc-1");
        assert_eq!(one.agents.len(), 2_500);
        assert!(one.agent_counts.iter().all(|c| c.service == "svc-1"));
        assert_eq!(one.agent_counts.len(), 2, "svc-1 has a STALE agent (97)");
    }

    /// A policy of one limit, `order/crm`, in `mode`, committed as `version`.
    fn commit_limit(state: &mut State, mode: pb::Mode, version: &str) {
        let target = pb::TargetConfig {
            service: "order".into(),
            version: version.into(),
            rules: vec![pb::Rule {
                name: "order/crm".into(),
                mode: mode as i32,
                spec: Some(pb::rule::Spec::Limit(pb::Limit::default())),
                ..Default::default()
            }],
            ..gov_proto::compiled::target("order")
        };
        state.commit(
            Arc::new(AppliedPolicy {
                version: version.into(),
                who: "t".into(),
                at_unix_ms: 1,
                sources: vec![],
                bundle: pb::Bundle {
                    targets: vec![target],
                    version: version.into(),
                },
                shadow_since: Default::default(),
            }),
            &[],
            crate::HistoryLimit::default(),
            &mut Vec::new(),
        );
    }

    #[test]
    fn a_latch_says_it_rejects_nothing_while_its_rule_is_in_shadow_and_only_then() {
        let mut state = State::default();
        commit_limit(&mut state, pb::Mode::Shadow, "v1");
        let (tx, _rx) = tokio::sync::mpsc::channel(8);
        let hello = pb::Hello {
            service: "order".into(),
            instance: "a".into(),
            last_version: "v1".into(),
            ..Default::default()
        };
        let (key, id) = state.hello(hello, tx, 1, &mut Vec::new());
        let engaged = pb::Event {
            key: String::new(),
            kind: pb::EventKind::LimitEngaged as i32,
            rule: "order/crm".into(),
            reason: "calls 5 per 1s".into(),
            at_unix_ms: 1_000,
        };
        state.on_message(&key, id, AgentMsg::Event(engaged), 1_000);
        let reason = |state: &State| cluster_view(state, 2_000).limits[0].reason.clone();
        assert_eq!(
            reason(&state),
            "calls 5 per 1s (mode shadow: rejects nothing)"
        );

        // Switched to enforce, the latch engaged in shadow now rejects.
        commit_limit(&mut state, pb::Mode::Enforce, "v2");
        assert_eq!(reason(&state), "calls 5 per 1s");

        // And back to shadow: it rejects nothing again.
        commit_limit(&mut state, pb::Mode::Shadow, "v3");
        assert_eq!(
            reason(&state),
            "calls 5 per 1s (mode shadow: rejects nothing)"
        );
    }

    #[test]
    fn an_engaged_limit_shows_its_remaining_time_and_its_source() {
        let target = pb::TargetConfig {
            service: "order".into(),
            version: "v1".into(),
            rules: vec![pb::Rule {
                name: "order/crm".into(),
                source: Some(pb::SourceRef {
                    file: "shop.gov".into(),
                    line: 12,
                    ..Default::default()
                }),
                spec: Some(pb::rule::Spec::Limit(pb::Limit {
                    release: Some(pb::Release {
                        kind: Some(pb::release::Kind::AfterMs(7_200_000)),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..gov_proto::compiled::target("order")
        };
        let mut state = State::default();
        state.commit(
            Arc::new(AppliedPolicy {
                version: "b1".into(),
                who: "t".into(),
                at_unix_ms: 1,
                sources: vec![],
                bundle: pb::Bundle {
                    targets: vec![target],
                    version: "b1".into(),
                },
                shadow_since: Default::default(),
            }),
            &[],
            crate::HistoryLimit::default(),
            &mut Vec::new(),
        );
        let (tx, _rx) = tokio::sync::mpsc::channel(8);
        let hello = pb::Hello {
            service: "order".into(),
            instance: "a".into(),
            last_version: "v1".into(),
            ..Default::default()
        };
        let (key, id) = state.hello(hello, tx, 1, &mut Vec::new());
        let engaged = pb::Event {
            key: String::new(),
            kind: pb::EventKind::LimitEngaged as i32,
            rule: "order/crm".into(),
            reason: "calls 100 per 1s".into(),
            at_unix_ms: 1_000,
        };
        state.on_message(&key, id, AgentMsg::Event(engaged), 1_000);

        let view = cluster_view(&state, 3_600_000);
        assert_eq!(view.limits.len(), 1);
        let limit = &view.limits[0];
        assert_eq!(limit.remaining_ms, 3_601_000);
        assert_eq!(limit.reason, "calls 100 per 1s");
        assert_eq!(limit.source.as_ref().map(|s| s.line), Some(12));
        assert_eq!(view.agents[0].state(), pb::SyncState::Synced);
        // Another service's view does not show it.
        assert!(filter_view(view, "pay").limits.is_empty());

        // The agent restarts and forgets it: the view says so.
        let stats = pb::Stats {
            rules: vec![pb::RuleStats {
                rule: "order/crm".into(),
                kind: pb::RuleKind::Limit as i32,
                limit_engaged: false,
                ..Default::default()
            }],
            ..Default::default()
        };
        state.on_message(&key, id, AgentMsg::Stats(stats), 2_000);
        let view = cluster_view(&state, 3_600_000);
        assert_eq!(view.limits.len(), 1, "the latch holds");
        assert!(
            view.limits[0].reason.contains("NOT ENFORCED by a"),
            "{}",
            view.limits[0].reason
        );
    }
}
