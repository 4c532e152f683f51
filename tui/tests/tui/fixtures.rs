//! Cluster views built in code, read like the scenario they stand for.

use gov_proto::rejections::REASONS;
use gov_tui::proto::{
    AgentView, ClusterView, FuseState, FuseView, LimitView, Phase, RejectReason, Rejections,
    RuleKind, RuleStats, RuleView, SourceRef, StoreHealth, SyncState,
};
use gov_tui::{App, Msg, update};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// A fixed "now": 2026-09-21T11:06:40Z.
pub const T0: u64 = 1_790_000_000_000;
pub const URL: &str = "http://127.0.0.1:7070";
pub const V1: &str = "sha256:3f2a91c07be4d2e1aa00";
pub const V0: &str = "sha256:9c0ffee1234567890000";

pub fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

pub fn ch(c: char) -> Msg {
    key(KeyCode::Char(c))
}

pub fn press(app: &mut App, keys: &str) {
    for c in keys.chars() {
        update(app, ch(c));
    }
}

pub fn draw(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| gov_tui::render(app, f)).unwrap();
    terminal.backend().to_string()
}

pub fn agent(service: &str, instance: &str, port: u16) -> AgentView {
    AgentView {
        service: service.into(),
        instance: instance.into(),
        address: format!("10.0.0.{}:{port}", port % 7 + 2),
        state: SyncState::Synced as i32,
        version: V1.into(),
        last_good_version: V1.into(),
        phase: Phase::Ready as i32,
        last_seen_unix_ms: T0 - 1_000,
        ..Default::default()
    }
}

pub fn source(line: u32, snippet: &str) -> Option<SourceRef> {
    Some(SourceRef {
        file: "examples/shop.gov".into(),
        line,
        column: 3,
        snippet: snippet.into(),
    })
}

/// Cumulative counters after `secs` seconds of steady traffic.
#[derive(Clone, Copy, Default)]
pub struct Traffic {
    pub in_flight: u64,
    pub waiting: u64,
    pub capacity: u64,
    pub admitted_per_s: u64,
    /// Per reason, in `RejectReason::ALL`'s order ([`per_s`]).
    pub rejected_per_s: [u64; REASONS],
    /// Share of calls per latency bucket (per mille of admitted).
    pub latency: [u64; 8],
}

/// Rejections per second for the reasons named, 0 for the others.
pub fn per_s(rates: &[(RejectReason, u64)]) -> [u64; REASONS] {
    let mut out = [0; REASONS];
    for &(reason, n) in rates {
        out[reason.index().expect("a reason")] = n;
    }
    out
}

pub fn rule(name: &str, kind: RuleKind, src: Option<SourceRef>, t: Traffic, secs: u64) -> RuleView {
    let admitted = t.admitted_per_s * secs;
    let r = t.rejected_per_s.map(|n| n * secs);
    RuleView {
        rule: name.into(),
        kind: kind as i32,
        source: src,
        stats: Some(RuleStats {
            rule: name.into(),
            kind: kind as i32,
            in_flight: t.in_flight,
            waiting: t.waiting,
            admitted,
            rejected: Some(Rejections::from_counts(r)),
            latency_buckets: if t.latency.iter().sum::<u64>() == 0 {
                Vec::new()
            } else {
                t.latency.iter().map(|p| p * admitted / 1000).collect()
            },
            fuse_state: if kind == RuleKind::Fuse && r[4] > 0 {
                FuseState::Open as i32
            } else {
                FuseState::Closed as i32
            },
            limit_engaged: kind == RuleKind::Limit && r[2] > 0,
            capacity: t.capacity,
            ..Default::default()
        }),
        ..Default::default()
    }
}

const SLOW: &str = "bulkhead slow_calls on slow {\n  max_concurrent 10\n  max_wait 10ms\n}";
const PER_INSTANCE: &str =
    "bulkhead per_instance on calls to inventory {\n  max_concurrent 20\n  max_wait 1s\n}";
const SUPPLIER: &str = "limit crm_supplier on supplier {\n  calls 100 per 1s\n  bytes 10MiB per 1min\n  release after 2h\n  scope cluster\n}";
const MDM: &str = "fuse mdm on supplier {\n  trip when business_error_ratio > 50% over 1m min_calls 20\n  trip when system_errors >= 10 over 10s\n  recover manual\n}";
const READS: &str =
    "bulkhead reads on path prefix \"/stock\" {\n  max_concurrent 50\n  max_wait 0ms\n}";

/// Three services, five agents, seven rules; order's fuse `mdm` is open and
/// its limit `crm_supplier` engaged. `secs` seconds after the agents started,
/// with the view taken at `T0 - 60s + secs`; rejection rates of `slow_calls`
/// vary with `secs` so that the sparkline has a shape.
pub fn busy_view(secs: u64) -> ClusterView {
    let slow_rejections: u64 = (1..=secs)
        .map(|s| [4, 8, 12, 16, 12, 8, 4, 0][usize::try_from(s % 8).unwrap()])
        .sum();
    let mut slow = rule(
        "order/slow_calls",
        RuleKind::Bulkhead,
        source(9, SLOW),
        Traffic {
            in_flight: 10,
            waiting: 3,
            capacity: 10,
            admitted_per_s: 40,
            rejected_per_s: per_s(&[(RejectReason::BulkheadTimeout, 3)]),
            latency: [0, 0, 10, 200, 700, 80, 10, 0],
        },
        secs,
    );
    if let Some(r) = slow.stats.as_mut().and_then(|s| s.rejected.as_mut()) {
        r.bulkhead_full = slow_rejections;
    }
    ClusterView {
        at_unix_ms: T0 - 60_000 + secs * 1000,
        version: V1.into(),
        agents: vec![
            agent("order", "order-7d9f-1", 8081),
            agent("order", "order-7d9f-2", 8082),
            agent("inventory", "inventory-55c-1", 9091),
            agent("inventory", "inventory-55c-2", 9092),
            agent("crm", "crm-0", 7071),
        ],
        rules: vec![
            slow,
            rule(
                "order/per_instance",
                RuleKind::Bulkhead,
                source(14, PER_INSTANCE),
                Traffic {
                    in_flight: 4,
                    capacity: 20,
                    admitted_per_s: 200,
                    latency: [600, 300, 80, 20, 0, 0, 0, 0],
                    ..Traffic::default()
                },
                secs,
            ),
            rule(
                "order/crm_supplier",
                RuleKind::Limit,
                source(19, SUPPLIER),
                Traffic {
                    capacity: 100,
                    admitted_per_s: 100,
                    rejected_per_s: per_s(&[(RejectReason::LimitCalls, 25)]),
                    ..Traffic::default()
                },
                secs,
            ),
            rule(
                "order/mdm",
                RuleKind::Fuse,
                source(26, MDM),
                Traffic {
                    rejected_per_s: per_s(&[(RejectReason::FuseOpen, 30)]),
                    ..Traffic::default()
                },
                secs,
            ),
            rule(
                "inventory/reads",
                RuleKind::Bulkhead,
                source(41, READS),
                Traffic {
                    in_flight: 12,
                    capacity: 50,
                    admitted_per_s: 400,
                    latency: [900, 80, 20, 0, 0, 0, 0, 0],
                    ..Traffic::default()
                },
                secs,
            ),
            rule(
                "inventory/stock_timeout",
                RuleKind::Bulkhead,
                None,
                Traffic {
                    rejected_per_s: per_s(&[(RejectReason::Timeout, 1)]),
                    ..Traffic::default()
                },
                secs,
            ),
            rule(
                "crm/api",
                RuleKind::Limit,
                None,
                Traffic {
                    capacity: 500,
                    admitted_per_s: 80,
                    ..Traffic::default()
                },
                secs,
            ),
        ],
        fuses: vec![FuseView {
            rule: "order/mdm".into(),
            state: FuseState::Open as i32,
            since_unix_ms: T0 - 135_000,
            reason: "business_error_ratio 62% > 50% over 1m (31 calls)".into(),
            remaining_ms: 0,
            source: source(26, MDM),
        }],
        limits: vec![LimitView {
            rule: "order/crm_supplier".into(),
            since_unix_ms: T0 - 600_000,
            reason: "calls 100 per 1s exceeded".into(),
            remaining_ms: 2 * 3_600_000 - 600_000,
            source: source(19, SUPPLIER),
            key: String::new(),
        }],
        store: Some(StoreHealth {
            store: "etcd://10.0.0.20:2379,10.0.0.21:2379,10.0.0.22:2379/gov".into(),
            writable: true,
            quorum_unix_ms: T0 - 60_000 + secs * 1000 - 1_500,
            last_write_unix_ms: T0 - 600_000,
            leader_name: "govd-0".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An app that has seen one minute of `busy_view`s, one per second, ending at `T0`.
pub fn busy_app() -> App {
    let mut app = App::new(URL, false, T0 - 60_000);
    for s in 0..=60 {
        update(&mut app, Msg::Tick(T0 - 60_000 + s * 1000));
        update(&mut app, Msg::View(busy_view(s)));
    }
    app
}

/// `busy_view` with what a real platform adds: a service with a long name,
/// its rule names longer than any column, an instance name as Kubernetes
/// makes them and an agent that refused a config with a long reason.
pub fn long_names_view(secs: u64) -> ClusterView {
    let mut view = busy_view(secs);
    let service = "payments-reconciliation";
    let mut nacked = agent(service, "payments-reconciliation-6f8d9c7b5-x2k4q", 8443);
    nacked.state = SyncState::Nacked as i32;
    nacked.reason =
        "limit `payments-reconciliation/settlement_batch_window`: scope cluster needs --redis"
            .into();
    nacked.phase = Phase::Warming as i32;
    view.agents.push(agent(
        service,
        "payments-reconciliation-6f8d9c7b5-9zt7m",
        8444,
    ));
    view.agents.push(nacked);
    view.rules.push(rule(
        "payments-reconciliation/settlement_batch_window",
        RuleKind::Limit,
        None,
        Traffic {
            capacity: 100,
            admitted_per_s: 35,
            ..Traffic::default()
        },
        secs,
    ));
    view.rules.push(rule(
        "payments-reconciliation/ledger_writes_concurrency",
        RuleKind::Bulkhead,
        None,
        Traffic {
            in_flight: 48,
            waiting: 7,
            capacity: 64,
            admitted_per_s: 1_250,
            latency: [100, 300, 400, 150, 50, 0, 0, 0],
            ..Traffic::default()
        },
        secs,
    ));
    view
}

/// An app that has seen one minute of `long_names_view`s.
pub fn long_names_app() -> App {
    let mut app = App::new(URL, false, T0 - 60_000);
    for s in 0..=60 {
        update(&mut app, Msg::Tick(T0 - 60_000 + s * 1000));
        update(&mut app, Msg::View(long_names_view(s)));
    }
    app
}
