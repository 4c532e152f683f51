//! Whole screens rendered into a `TestBackend`, 120x36, as insta snapshots.

use gov_tui::proto::{ClusterView, SyncState};
use gov_tui::{App, Msg, update};
use insta::assert_snapshot;
use ratatui::crossterm::event::KeyCode;

use crate::fixtures::{T0, URL, V0, V1, busy_app, busy_view, ch, draw, key, long_names_app, press};

#[test]
fn before_the_first_view() {
    let app = App::new(URL, false, T0);
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn empty_cluster() {
    let mut app = App::new(URL, false, T0);
    update(
        &mut app,
        Msg::View(ClusterView {
            at_unix_ms: T0,
            ..Default::default()
        }),
    );
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn busy_cluster() {
    let app = busy_app();
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn busy_cluster_rule_detail() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::Tab));
    press(&mut app, "jjjjjj");
    assert_eq!(app.selected_rule().unwrap().rule, "order/slow_calls");
    assert_snapshot!(draw(&app, 120, 36));
}

/// An instance on its way out names the callers that still route to it, as
/// `govc status` does (the status's `removal_waiting_on`).
#[test]
fn a_leaving_agent_names_the_callers_it_waits_on() {
    let mut app = busy_app();
    let mut view = busy_view(61);
    let leaving = view
        .agents
        .iter_mut()
        .find(|a| a.instance == "order-7d9f-2")
        .unwrap();
    leaving.removal_waiting_on = vec!["gateway/gateway-0".into(), "web/web-1".into()];
    update(&mut app, Msg::Tick(T0 + 1_000));
    update(&mut app, Msg::View(view));
    update(&mut app, key(KeyCode::End));
    let screen = draw(&app, 120, 36);
    assert!(screen.contains("Agent order-7d9f-2"), "{screen}");
    // The pane wraps the list under the label.
    assert!(screen.contains("removal    waiting on"), "{screen}");
    assert!(screen.contains("gateway/gateway-0, web/web-1"), "{screen}");
    // Once they have all acknowledged, the line goes.
    update(&mut app, Msg::View(busy_view(62)));
    assert!(!draw(&app, 120, 36).contains("waiting on"));
}

/// An agent's detail says where its service's consumers come from and
/// whether it verifies its callers, as `govc status` does.
#[test]
fn an_agents_detail_shows_its_consumer_source_and_mutual_tls() {
    let mut app = busy_app();
    let mut view = busy_view(61);
    let leaving = view
        .agents
        .iter_mut()
        .find(|a| a.instance == "order-7d9f-2")
        .unwrap();
    leaving.inbound_mtls = true;
    view.consumer_sources
        .insert("order".into(), "peer on invalid reject".into());
    update(&mut app, Msg::Tick(T0 + 1_000));
    update(&mut app, Msg::View(view));
    update(&mut app, key(KeyCode::End));
    let screen = draw(&app, 120, 36);
    assert!(screen.contains("Agent order-7d9f-2"), "{screen}");
    assert!(
        screen.contains("consumers  peer on invalid reject"),
        "{screen}"
    );
    assert!(
        screen.contains("inbound    mutual TLS from agents"),
        "{screen}"
    );
    update(&mut app, Msg::View(busy_view(62)));
    let screen = draw(&app, 120, 36);
    assert!(!screen.contains("mutual TLS"), "{screen}");
}

/// A rule's gRPC calls by the code they ended with, in its detail.
#[test]
fn a_rule_detail_counts_grpc_calls_by_code() {
    let mut app = busy_app();
    let mut view = busy_view(61);
    for rule in view
        .rules
        .iter_mut()
        .filter(|r| r.rule == "order/slow_calls")
    {
        let stats = rule.stats.as_mut().unwrap();
        stats.grpc_outcomes = vec![0; 17];
        stats.grpc_outcomes[0] = 120;
        stats.grpc_outcomes[14] = 3;
    }
    update(&mut app, Msg::Tick(T0 + 1_000));
    update(&mut app, Msg::View(view));
    update(&mut app, key(KeyCode::Tab));
    press(&mut app, "jjjjjj");
    assert_eq!(app.selected_rule().unwrap().rule, "order/slow_calls");
    let screen = draw(&app, 120, 36);
    assert!(
        screen.contains("grpc       OK 120  UNAVAILABLE 3"),
        "{screen}"
    );
    // A rule no gRPC call went through has no such line.
    update(&mut app, Msg::View(busy_view(62)));
    assert!(!draw(&app, 120, 36).contains("grpc   "));
}

/// An agent that enforces the config it was sent but could not save it:
/// UNSAVED with the reason in the list, and in its detail the version a
/// restart without govd goes back to.
/// etcd's majority lost: the header says so in red, whatever else it
/// leaves out for width.
#[test]
fn store_without_quorum() {
    let mut app = busy_app();
    let mut view = busy_view(61);
    if let Some(store) = view.store.as_mut() {
        store.writable = false;
        store.failing_since_unix_ms = T0 - 14_000;
        store.last_error = "etcd failed to read the leader key".into();
    }
    update(&mut app, Msg::Tick(T0 + 1_000));
    update(&mut app, Msg::View(view));
    let screen = draw(&app, 120, 36);
    assert!(screen.contains("NO ETCD QUORUM 15s"), "{screen}");
    let narrow = draw(&app, 80, 24);
    assert!(narrow.contains("NO ETCD QUORUM 15s"), "{narrow}");
    assert_snapshot!(screen);
}

#[test]
fn unsaved_agent() {
    let mut app = busy_app();
    let mut view = busy_view(61);
    let agent = view
        .agents
        .iter_mut()
        .find(|a| a.instance == "order-7d9f-2")
        .unwrap();
    agent.state = SyncState::Unsaved as i32;
    agent.reason = "cannot write the last good config `last-good-config.json`: No space left on device (os error 28)".into();
    agent.version = "sha256:77aa00bb11cc".into();
    agent.last_good_version = V1.into();
    update(&mut app, Msg::Tick(T0 + 1_000));
    update(&mut app, Msg::View(view));
    update(&mut app, key(KeyCode::End));
    let screen = draw(&app, 120, 36);
    assert!(screen.contains("UNSAVED (cannot write"), "{screen}");
    assert!(
        screen.contains("enforcing  sha256:77aa00bb11cc"),
        "{screen}"
    );
    assert!(screen.contains("on restart sha256:3f2a91c0"), "{screen}");
    assert_snapshot!(screen);
}

#[test]
fn nacked_agent() {
    let mut app = busy_app();
    let mut view = busy_view(61);
    let agent = view
        .agents
        .iter_mut()
        .find(|a| a.instance == "order-7d9f-2")
        .unwrap();
    agent.state = SyncState::Nacked as i32;
    agent.reason =
        "bulkhead `order/slow_calls`: max_concurrent 500 exceeds the agent's limit of 256".into();
    agent.rule = "order/slow_calls".into();
    agent.version = "sha256:77aa00bb11cc".into();
    agent.last_good_version = V1.into();
    let stale = view
        .agents
        .iter_mut()
        .find(|a| a.instance == "inventory-55c-2")
        .unwrap();
    stale.state = SyncState::Disconnected as i32;
    stale.reason = "stream reset".into();
    stale.version = V1.into();
    stale.last_good_version = V0.into();
    stale.last_seen_unix_ms = T0 - 95_000;
    update(&mut app, Msg::Tick(T0 + 1_000));
    update(&mut app, Msg::View(view));
    update(&mut app, key(KeyCode::End));
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn tripped_fuse_with_the_confirmation_dialog() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::BackTab));
    update(&mut app, ch('r'));
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn release_result() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::BackTab));
    update(&mut app, ch('r'));
    update(&mut app, ch('y'));
    update(
        &mut app,
        Msg::ReleaseDone(gov_tui::ReleaseOutcome {
            kind: gov_tui::proto::ReleaseKind::Fuse,
            rule: "order/mdm".into(),
            result: Ok(gov_tui::proto::ReleaseResult {
                released: true,
                message: String::new(),
                agents_notified: 2,
            }),
        }),
    );
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn disconnected_control_plane() {
    let mut app = busy_app();
    update(
        &mut app,
        Msg::Disconnected(
            "transport error: tcp connect error: Connection refused (os error 111)".into(),
        ),
    );
    update(&mut app, Msg::Tick(T0 + 12_000));
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn help() {
    let mut app = busy_app();
    update(&mut app, ch('?'));
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn filtering() {
    let mut app = busy_app();
    update(&mut app, ch('/'));
    press(&mut app, "order");
    assert_snapshot!(draw(&app, 120, 36));
}

#[test]
fn small_terminal_does_not_panic() {
    let app = busy_app();
    for (w, h) in [(1, 1), (20, 5), (40, 10), (80, 24)] {
        let _ = draw(&app, w, h);
    }
    let mut app = busy_app();
    update(&mut app, key(KeyCode::BackTab));
    update(&mut app, ch('r'));
    for (w, h) in [(1, 1), (20, 5), (40, 10)] {
        let _ = draw(&app, w, h);
    }
}

#[test]
fn long_rule_list_scrolls_to_the_selection() {
    use gov_tui::proto::RuleKind;

    use crate::fixtures::{Traffic, rule};

    let mut app = App::new(URL, false, T0);
    let rules = (0..300)
        .map(|i| {
            rule(
                &format!("svc/rule_{i:03}"),
                RuleKind::Bulkhead,
                None,
                Traffic::default(),
                1,
            )
        })
        .collect();
    update(
        &mut app,
        Msg::View(ClusterView {
            at_unix_ms: T0,
            rules,
            ..Default::default()
        }),
    );
    update(&mut app, key(KeyCode::Tab));
    for _ in 0..25 {
        update(&mut app, key(KeyCode::PageDown));
    }
    assert_eq!(app.selected_rule().unwrap().rule, "svc/rule_250");
    let screen = draw(&app, 120, 36);
    assert!(screen.contains("│svc/rule_250"), "{screen}");
    assert!(!screen.contains("│svc/rule_000"), "{screen}");
    update(&mut app, key(KeyCode::Home));
    let screen = draw(&app, 120, 36);
    assert!(screen.contains("│svc/rule_000"), "{screen}");
    assert!(!screen.contains("│svc/rule_250"), "{screen}");
}

/// Lines of a drawn screen, without the quotes `TestBackend` adds.
fn lines(screen: &str) -> Vec<String> {
    screen
        .lines()
        .map(|l| l.trim_matches('"').to_owned())
        .collect()
}

/// What makes a screen usable whatever its size: every table keeps its most
/// important columns with their headers, a value is shown whole or not at
/// all (`0/100`, never `0/`), and a name too long for its column ends in
/// `…` instead of being cut.
fn assert_usable(screen: &str, width: usize) {
    let lines = lines(screen);
    for line in &lines {
        assert_eq!(line.chars().count(), width, "{screen}");
    }
    for header in ["SERVICE", "INSTANCE", "SYNC", "RULE", "REJ/s", "STATE"] {
        assert!(screen.contains(header), "no {header} column:\n{screen}");
    }
    assert!(screen.contains("● CONNECTED"), "{screen}");
    assert!(screen.contains("tripped"), "{screen}");
    assert!(screen.contains("1 not synced"), "{screen}");
    // Cut values: a count split at its slash, a name cut without `…`.
    for cut in ["0/ ", "0/│", "/ "] {
        assert!(!screen.contains(cut), "`{cut}` is cut:\n{screen}");
    }
    let whole = [
        "payments-reconciliation",
        "payments-reconciliation/settlement_batch_window",
        "payments-reconciliation/ledger_writes_concurrency",
        "payments-reconciliation-6f8d9c7b5-x2k4q",
        "payments-reconciliation-6f8d9c7b5-9zt7m",
        "inventory/stock_timeout",
    ];
    let words = screen.split(|c: char| c.is_whitespace() || c == '│' || c == '"');
    for word in words.filter(|w| w.starts_with("payments-") || w.starts_with("inventory/s")) {
        assert!(
            whole.contains(&word) || word.ends_with('…'),
            "`{word}` is cut without `…`:\n{screen}"
        );
    }
    assert!(screen.contains("order/mdm"), "{screen}");
    assert!(
        screen.contains("OPEN"),
        "the tripped fuse's state:\n{screen}"
    );
    assert!(
        screen.contains("ENGAGED"),
        "the engaged limit's state:\n{screen}"
    );
}

#[test]
fn standard_terminal_80x24() {
    let app = long_names_app();
    let screen = draw(&app, 80, 24);
    assert_usable(&screen, 80);
    assert_snapshot!(screen);
}

#[test]
fn wide_terminal_120x40() {
    let app = long_names_app();
    let screen = draw(&app, 120, 40);
    assert_usable(&screen, 120);
    // Wide enough that no rule name of the busy cluster is cut.
    for name in [
        "inventory/stock_timeout",
        "order/crm_supplier",
        "order/per_instance",
        "order/slow_calls",
    ] {
        assert!(screen.contains(name), "`{name}` is cut:\n{screen}");
    }
    assert_snapshot!(screen);
}

/// A rule in mode shadow: its kind says SHADOW and for how long, and its
/// rejection rate is the rate of calls it would have rejected.
#[test]
fn a_shadow_rule_shows_how_long_and_what_it_would_reject() {
    use crate::fixtures::{Traffic, rule};
    use gov_tui::proto::{Mode, Rejections, RuleKind};
    let view = |secs: u64| {
        let mut r = rule(
            "order/trial",
            RuleKind::Limit,
            None,
            Traffic {
                in_flight: 0,
                waiting: 0,
                capacity: 100,
                admitted_per_s: 100,
                rejected_per_s: Default::default(),
                latency: [1000, 0, 0, 0, 0, 0, 0, 0],
            },
            secs,
        );
        r.mode = Mode::Shadow as i32;
        r.shadow_since_unix_ms = T0 - 12 * 60_000;
        if let Some(s) = r.stats.as_mut() {
            s.shadow_rejected = Some(Rejections {
                limit_calls: 25 * secs,
                ..Default::default()
            });
        }
        ClusterView {
            at_unix_ms: T0 - 10_000 + secs * 1000,
            version: V1.into(),
            rules: vec![r],
            limits: vec![gov_tui::proto::LimitView {
                rule: "order/trial".into(),
                since_unix_ms: T0 - 60_000,
                reason: "calls 100 per 1s".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    };
    let mut app = App::new(URL, false, T0 - 10_000);
    for s in 0..=10 {
        update(&mut app, Msg::Tick(T0 - 10_000 + s * 1000));
        update(&mut app, Msg::View(view(s)));
    }
    let screen = draw(&app, 120, 36);
    let row = screen
        .lines()
        .find(|l| l.contains("order/trial"))
        .unwrap_or_else(|| panic!("no row:\n{screen}"));
    assert!(row.contains("limit SHADOW 12m00s"), "{row}");
    assert!(row.contains("25"), "would-be rejections per second: {row}");
    // Its latch rejects nothing: marked.
    assert!(
        screen
            .lines()
            .any(|l| l.contains("order/trial") && l.contains("ENGAGED SHADOW")),
        "{screen}"
    );
}

/// What agents wrote (an instance name, an address, a reason) is shown
/// escaped: the screen holds `\x1b[2J`, never an ESC a terminal would obey.
#[test]
fn terminal_escapes_from_agents_are_shown_not_obeyed() {
    let mut app = App::new(URL, false, T0);
    let mut hostile = crate::fixtures::agent("order", "evil\u{1b}[2J", 9000);
    hostile.address = "10.0.0.9:80\r\nforged".into();
    hostile.state = SyncState::Nacked as i32;
    hostile.reason = "\u{1b}]0;owned\u{7}".into();
    update(
        &mut app,
        Msg::View(ClusterView {
            at_unix_ms: T0,
            agents: vec![hostile],
            ..Default::default()
        }),
    );
    let screen = draw(&app, 120, 36);
    assert!(screen.contains("evil\\x1b[2J"), "{screen}");
    assert!(
        !screen.contains('\u{1b}') && !screen.contains('\r'),
        "{screen}"
    );
    assert_eq!(
        app.view.as_ref().unwrap().agents[0].address,
        "10.0.0.9:80\\r\\nforged"
    );
}

#[test]
fn a_canary_shows_in_the_header_with_the_rule_furthest_above_the_others() {
    use gov_tui::proto::{CanaryCounts, CanaryRule, CanaryView};
    let mut app = busy_app();
    let mut view = busy_view(61);
    let counts = |calls, rejected| CanaryCounts {
        calls,
        rejected,
        ..Default::default()
    };
    view.canary = Some(CanaryView {
        version: V1.into(),
        instances: vec!["order/o-1".into()],
        ends_unix_ms: view.at_unix_ms + 125_000,
        rules: vec![
            CanaryRule {
                rule: "order/even".into(),
                canary: Some(counts(100, 1)),
                baseline: Some(counts(300, 3)),
            },
            CanaryRule {
                rule: "order/tight".into(),
                canary: Some(counts(100, 30)),
                baseline: Some(counts(300, 0)),
            },
        ],
        ..Default::default()
    });
    update(&mut app, Msg::View(view));
    let screen = draw(&app, 120, 36);
    assert!(
        screen
            .contains("CANARY 3f2a91c0 on order/o-1 · 2m05s left · order/tight rejects 30% vs 0%"),
        "{screen}"
    );
}

/// 10,000 agents (issue 35): the agents pane draws only the rows that fit,
/// the header counts from govd's counts per service and state, and the
/// selection reaches the last agent.
#[test]
fn ten_thousand_agents_draw_the_rows_that_fit() {
    use gov_tui::proto::AgentCount;
    let mut agents: Vec<_> = (0..10_000_usize)
        .map(|i| {
            let mut a =
                crate::fixtures::agent(&format!("svc-{}", i % 4), &format!("i-{i:05}"), 8080);
            if i.is_multiple_of(97) {
                a.state = SyncState::Stale as i32;
            }
            a
        })
        .collect();
    agents.reverse();
    let mut counts = std::collections::BTreeMap::<(String, i32), u32>::new();
    for a in &agents {
        *counts.entry((a.service.clone(), a.state)).or_default() += 1;
    }
    let agent_counts = counts
        .into_iter()
        .map(|((service, state), agents)| AgentCount {
            service,
            state,
            agents,
            inbound_mtls: 0,
        })
        .collect();
    let mut app = App::new(URL, false, T0);
    update(
        &mut app,
        Msg::View(ClusterView {
            at_unix_ms: T0,
            version: V1.into(),
            agents,
            agent_counts,
            ..Default::default()
        }),
    );
    let screen = draw(&app, 200, 50);
    assert!(screen.contains("4 services · 10000 agents"), "{screen}");
    assert!(screen.contains("104 not synced"), "{screen}");
    assert!(screen.contains("i-00000"), "{screen}");
    let rows = screen.lines().filter(|l| l.contains(" i-0")).count();
    assert!((1..50).contains(&rows), "{rows} rows:\n{screen}");
    update(&mut app, key(KeyCode::End));
    assert_eq!(app.selected_agent().unwrap().instance, "i-09999");
    let screen = draw(&app, 200, 50);
    assert!(screen.contains("i-09999"), "{screen}");
    assert!(!screen.contains("i-00000 "), "{screen}");
}
