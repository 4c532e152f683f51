//! Cost of one TUI frame for a large cluster: 100 agents, 1,000 rules (10 per
//! service over 100 services... here 20 services of 50 rules), 50 tripped fuses
//! and engaged limits, five minutes of history.
//!
//! One iteration = what the runtime does once a second: decode the protobuf
//! `ClusterView` as it comes off the wire, `update` with it (sort, rates,
//! history), then `render` into a 200x60 `TestBackend` (the buffer diff
//! included). The runtime also redraws on the one-second tick, measured
//! separately as "render only". CPU share at 1 update/s = the sum of both.
//!
//! Run: `cargo bench -j2 -p gov-tui --bench render`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gov_tui::proto::{
    AgentView, ClusterView, FuseState, FuseView, LimitView, Phase, Rejections, RuleKind, RuleStats,
    RuleView, SourceRef, SyncState,
};
use gov_tui::{App, Msg, render, update};
use prost::Message as _;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

const T0: u64 = 1_790_000_000_000;
const SERVICES: usize = 20;
const AGENTS: usize = 100;
const RULES: usize = 1000;

fn view(tick: u64) -> ClusterView {
    let service = |i: usize| format!("service-{:02}", i % SERVICES);
    let agents = (0..AGENTS)
        .map(|i| AgentView {
            service: service(i),
            instance: format!("{}-{i:03}", service(i)),
            address: format!("10.0.{}.{}:8080", i / 250, i % 250),
            state: if i % 17 == 0 {
                SyncState::Nacked as i32
            } else {
                SyncState::Synced as i32
            },
            reason: if i % 17 == 0 {
                "bulkhead max_concurrent exceeds the agent's limit".into()
            } else {
                String::new()
            },
            version: "sha256:3f2a91c07be4d2e1aa00".into(),
            last_good_version: "sha256:3f2a91c07be4d2e1aa00".into(),
            phase: Phase::Ready as i32,
            last_seen_unix_ms: T0 + tick * 1000 - 400,
            ..Default::default()
        })
        .collect();
    let kinds = [RuleKind::Bulkhead, RuleKind::Limit, RuleKind::Fuse];
    let rules = (0..RULES)
        .map(|i| {
            let kind = kinds[i % kinds.len()];
            let name = format!("{}/rule_{i:04}", service(i));
            let n = tick + 1;
            let i64 = i as u64;
            RuleView {
                rule: name.clone(),
                kind: kind as i32,
                source: Some(SourceRef {
                    file: "policy/big.gov".into(),
                    line: u32::try_from(i * 6 + 1).unwrap_or(0),
                    column: 3,
                    snippet: format!(
                        "bulkhead rule_{i:04} on slow {{\n  max_concurrent 10\n  max_wait 10ms\n}}"
                    ),
                }),
                stats: Some(RuleStats {
                    rule: name,
                    kind: kind as i32,
                    in_flight: i64 % 11,
                    waiting: i64 % 3,
                    admitted: n * (100 + i64),
                    rejected: Some(Rejections {
                        bulkhead_full: n * (i64 % 7),
                        bulkhead_timeout: n * (i64 % 3),
                        limit_calls: n * (i64 % 5),
                        fuse_open: n * (i64 % 2),
                        ..Default::default()
                    }),
                    latency_buckets: vec![n * 50, n * 30, n * 10, n * 5, n * 3, n, n, 0],
                    capacity: 10,
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect();
    let fuses = (0..25)
        .map(|i| FuseView {
            rule: format!("{}/rule_{:04}", service(i * 4 + 2), i * 4 + 2),
            state: FuseState::Open as i32,
            since_unix_ms: T0 - 60_000,
            reason: "business_error_ratio 62% > 50% over 1m (31 calls)".into(),
            remaining_ms: 0,
            source: None,
        })
        .collect();
    let limits = (0..25)
        .map(|i| LimitView {
            rule: format!("{}/rule_{:04}", service(i * 4 + 1), i * 4 + 1),
            since_unix_ms: T0 - 60_000,
            reason: "calls 100 per 1s exceeded".into(),
            remaining_ms: 3_600_000,
            source: None,
            key: String::new(),
        })
        .collect();
    ClusterView {
        at_unix_ms: T0 + tick * 1000,
        version: "sha256:3f2a91c07be4d2e1aa00".into(),
        agents,
        rules,
        fuses,
        limits,
        ..Default::default()
    }
}

fn frame(c: &mut Criterion) {
    // Five minutes of history first, and the rules pane focused on a row
    // halfway down so that the detail pane and a scrolled window are drawn.
    let mut app = App::new("http://127.0.0.1:7070", false, T0);
    for tick in 0..300 {
        update(&mut app, Msg::Tick(T0 + tick * 1000));
        update(&mut app, Msg::View(view(tick)));
    }
    update(
        &mut app,
        Msg::Key(KeyEvent::new(KeyCode::Tab, KeyModifiers::NONE)),
    );
    for _ in 0..50 {
        update(
            &mut app,
            Msg::Key(KeyEvent::new(KeyCode::PageDown, KeyModifiers::NONE)),
        );
    }
    let mut terminal = Terminal::new(TestBackend::new(200, 60)).unwrap_or_else(|e| panic!("{e}"));

    // Views are encoded outside the measurement, decoded inside it.
    let views: Vec<Vec<u8>> = (300..310).map(|t| view(t).encode_to_vec()).collect();
    println!("one view on the wire: {} bytes", views[0].len());
    let mut tick = 0;
    c.bench_function("decode+update+render 100 agents 1000 rules 200x60", |b| {
        b.iter_batched(
            || {
                tick += 1;
                views[tick % views.len()].clone()
            },
            |bytes| {
                let v = ClusterView::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
                update(&mut app, Msg::Tick(v.at_unix_ms));
                update(&mut app, Msg::View(v));
                terminal
                    .draw(|f| render(black_box(&app), f))
                    .unwrap_or_else(|e| panic!("{e}"));
            },
            criterion::BatchSize::LargeInput,
        );
    });

    c.bench_function("render only 100 agents 1000 rules 200x60", |b| {
        b.iter(|| {
            terminal
                .draw(|f| render(black_box(&app), f))
                .unwrap_or_else(|e| panic!("{e}"));
        });
    });
}

criterion_group!(benches, frame);
criterion_main!(benches);
