//! The plain summary `govc demo --no-tui` prints every few seconds: agents
//! and their sync state, admitted and rejected calls per rule, tripped fuses
//! and engaged limits, and what the load generator saw.

use std::fmt::Write as _;

use gov_proto::v1 as pb;

use super::load::Totals;

/// The last view and totals, to print rates since then.
#[derive(Debug, Default, Clone)]
pub struct Previous {
    pub at_ms: u64,
    /// (rule, admitted, rejected).
    pub rules: Vec<(String, u64, u64)>,
    pub load: Totals,
}

/// Renders one summary; `elapsed_s` is the time since the demo started.
pub fn render(
    view: &pb::ClusterView,
    load: Totals,
    elapsed_s: u64,
    prev: &Previous,
) -> (String, Previous) {
    let mut out = String::new();
    let secs = view.at_unix_ms.saturating_sub(prev.at_ms) as f64 / 1000.0;
    let per_s = |now: u64, before: u64| -> String {
        if prev.at_ms == 0 || secs <= 0.0 {
            String::new()
        } else {
            format!(" ({:.0}/s)", now.saturating_sub(before) as f64 / secs)
        }
    };
    let _ = writeln!(
        out,
        "--- {elapsed_s}s  policy {}  load: sent {}{}, 2xx {}, rejected by gov {}, service errors {}, failed {}, skipped {}",
        short(&view.version),
        load.sent,
        per_s(load.sent, prev.load.sent),
        load.ok,
        load.rejected,
        load.errors,
        load.failed,
        load.skipped,
    );
    for a in &view.agents {
        let mut line = format!(
            "agent {:<26} {:<12} version {}  {}",
            format!("{}/{}", a.service, a.instance),
            sync_name(a.state()),
            short(&a.last_good_version),
            pb::Phase::word(a.phase()),
        );
        if !a.reason.is_empty() {
            let _ = write!(line, "  reason: {}", a.reason);
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let mut rules = Vec::new();
    for r in &view.rules {
        let Some(s) = &r.stats else { continue };
        let rejected = s.rejected.as_ref().map(reasons).unwrap_or_default();
        let total: u64 = rejected.iter().map(|(_, n)| n).sum();
        let before = prev.rules.iter().find(|(rule, _, _)| *rule == r.rule);
        let (adm_before, rej_before) = before.map_or((0, 0), |(_, a, j)| (*a, *j));
        let mut line = format!(
            "rule  {:<26} {:<8} admitted {}{}  rejected {}{}",
            r.rule,
            r.kind().word(),
            s.admitted,
            per_s(s.admitted, adm_before),
            total,
            per_s(total, rej_before),
        );
        if !rejected.is_empty() {
            let by: Vec<String> = rejected
                .iter()
                .map(|(why, n)| format!("{why} {n}"))
                .collect();
            let _ = write!(line, ": {}", by.join(", "));
        }
        if s.capacity > 0 && r.kind() == pb::RuleKind::Bulkhead {
            let _ = write!(line, "  in flight {}/{}", s.in_flight, s.capacity);
        }
        let _ = writeln!(out, "{line}");
        rules.push((r.rule.clone(), s.admitted, total));
    }
    for f in &view.fuses {
        let since = view.at_unix_ms.saturating_sub(f.since_unix_ms) / 1000;
        let _ = writeln!(
            out,
            "fuse  {:<26} {:<8} for {since}s: {}{}",
            f.rule,
            fuse_name(f.state()),
            f.reason,
            if f.remaining_ms == 0 {
                "  (manual: govc release or the TUI)".to_owned()
            } else {
                format!("  (auto in {}s)", f.remaining_ms / 1000)
            }
        );
    }
    for l in &view.limits {
        let _ = writeln!(out, "limit {:<26} ENGAGED: {}", l.rule, l.reason);
    }
    if view.fuses.is_empty() {
        let _ = writeln!(out, "fuses: none tripped");
    }
    let next = Previous {
        at_ms: view.at_unix_ms,
        rules,
        load,
    };
    (out, next)
}

fn reasons(r: &pb::Rejections) -> Vec<(&'static str, u64)> {
    r.by_reason().into_iter().filter(|(_, n)| *n > 0).collect()
}

/// The first 8 characters of a version, `-` when empty.
pub fn short(version: &str) -> &str {
    if version.is_empty() {
        "-"
    } else {
        version.get(..8).unwrap_or(version)
    }
}

pub fn sync_name(s: pb::SyncState) -> &'static str {
    s.word()
}

pub fn fuse_name(s: pb::FuseState) -> &'static str {
    match s {
        pb::FuseState::Closed => "CLOSED",
        pb::FuseState::Open => "OPEN",
        pb::FuseState::HalfOpen => "HALF_OPEN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(at: u64, admitted: u64, timeouts: u64) -> pb::ClusterView {
        pb::ClusterView {
            at_unix_ms: at,
            version: "0123456789abcdef".into(),
            agents: vec![pb::AgentView {
                service: "order".into(),
                instance: "order-1".into(),
                state: pb::SyncState::Synced as i32,
                last_good_version: "fedcba9876543210".into(),
                ..Default::default()
            }],
            rules: vec![pb::RuleView {
                rule: "order/slow_calls".into(),
                kind: pb::RuleKind::Bulkhead as i32,
                stats: Some(pb::RuleStats {
                    admitted,
                    in_flight: 7,
                    capacity: 10,
                    rejected: Some(pb::Rejections {
                        bulkhead_timeout: timeouts,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            fuses: vec![pb::FuseView {
                rule: "order/mdm".into(),
                state: pb::FuseState::Open as i32,
                since_unix_ms: at - 3000,
                reason: "business_error_ratio 52% > 50% over 1m (300 calls)".into(),
                ..Default::default()
            }],
            limits: vec![],
            ..Default::default()
        }
    }

    #[test]
    fn renders_agents_rules_rates_and_fuses() {
        let (first, prev) = render(
            &view(10_000, 100, 10),
            Totals::default(),
            5,
            &Previous::default(),
        );
        assert!(first.contains("agent order/order-1"), "{first}");
        assert!(first.contains("SYNCED"), "{first}");
        assert!(first.contains("version fedcba98"), "{first}");
        assert!(
            first.contains("admitted 100  rejected 10: bulkhead_timeout 10  in flight 7/10"),
            "{first}"
        );
        assert!(first.contains("fuse  order/mdm"), "{first}");
        assert!(
            first.contains("OPEN     for 3s: business_error_ratio"),
            "{first}"
        );
        let (second, _) = render(&view(15_000, 600, 60), Totals::default(), 10, &prev);
        assert!(
            second.contains("admitted 600 (100/s)  rejected 60 (10/s)"),
            "{second}"
        );
    }
}
