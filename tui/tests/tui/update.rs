//! `update`: keys, the release flow, read-only, the filter, connection
//! changes, and rates derived from cumulative counters.

use gov_tui::proto::{RejectReason, ReleaseKind, ReleaseResult, RuleKind};
use gov_tui::{Action, App, Connection, Mode, Msg, Pane, RATE_WINDOW_MS, ReleaseOutcome, update};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::fixtures::{T0, Traffic, URL, busy_app, busy_view, ch, draw, key, per_s, press, rule};

fn rules_of(app: &App) -> Vec<&str> {
    app.rules().iter().map(|r| r.rule.as_str()).collect()
}

#[test]
fn q_and_ctrl_c_quit() {
    let mut app = busy_app();
    assert_eq!(update(&mut app, ch('q')), Some(Action::Quit));
    let ctrl_c = Msg::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    update(&mut app, ch('/'));
    assert_eq!(update(&mut app, ctrl_c), Some(Action::Quit));
}

#[test]
fn key_releases_are_ignored() {
    let mut app = busy_app();
    let mut release = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
    release.kind = KeyEventKind::Release;
    assert_eq!(update(&mut app, Msg::Key(release)), None);
}

#[test]
fn arrows_and_jk_move_within_the_focused_pane_and_tab_cycles() {
    let mut app = busy_app();
    assert_eq!(app.focus, Pane::Agents);
    // Agents are sorted by service, instance.
    assert_eq!(app.selected_agent().unwrap().instance, "crm-0");
    press(&mut app, "jj");
    assert_eq!(app.selected_agent().unwrap().instance, "inventory-55c-2");
    update(&mut app, key(KeyCode::Up));
    assert_eq!(app.selected_agent().unwrap().instance, "inventory-55c-1");
    update(&mut app, key(KeyCode::End));
    assert_eq!(app.selected_agent().unwrap().instance, "order-7d9f-2");
    press(&mut app, "j");
    assert_eq!(
        app.selected_agent().unwrap().instance,
        "order-7d9f-2",
        "clamped"
    );

    update(&mut app, key(KeyCode::Tab));
    assert_eq!(app.focus, Pane::Rules);
    assert_eq!(app.selected_rule().unwrap().rule, "crm/api");
    update(&mut app, key(KeyCode::Down));
    assert_eq!(app.selected_rule().unwrap().rule, "inventory/reads");
    update(&mut app, key(KeyCode::Tab));
    assert_eq!(app.focus, Pane::Trips);
    update(&mut app, key(KeyCode::Tab));
    assert_eq!(app.focus, Pane::Agents);
    // Each pane keeps its own selection.
    assert_eq!(app.selected_agent().unwrap().instance, "order-7d9f-2");
    update(&mut app, key(KeyCode::BackTab));
    assert_eq!(app.focus, Pane::Trips);
}

#[test]
fn selection_follows_the_row_when_rows_move() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::Tab));
    press(&mut app, "jj");
    assert_eq!(app.selected_rule().unwrap().rule, "inventory/stock_timeout");
    // A new rule sorts before the selection: the selection stays on its rule.
    let mut view = busy_view(61);
    view.rules.push(rule(
        "billing/charge",
        RuleKind::Bulkhead,
        None,
        Traffic::default(),
        61,
    ));
    update(&mut app, Msg::View(view));
    assert_eq!(app.selected_rule().unwrap().rule, "inventory/stock_timeout");
}

#[test]
fn release_asks_first_and_enter_means_no() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::BackTab));
    assert_eq!(app.focus, Pane::Trips);
    assert_eq!(update(&mut app, ch('r')), None);
    assert_eq!(
        app.mode,
        Mode::ConfirmRelease {
            kind: ReleaseKind::Fuse,
            rule: "order/mdm".into(),
            yes: false
        }
    );
    // Enter on the default answer cancels.
    assert_eq!(update(&mut app, key(KeyCode::Enter)), None);
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(app.pending, None);

    // n and Esc cancel too.
    for cancel in [ch('n'), key(KeyCode::Esc)] {
        update(&mut app, ch('r'));
        assert_eq!(update(&mut app, cancel), None);
        assert_eq!(app.mode, Mode::Normal);
    }

    // Unrelated keys leave the question open.
    update(&mut app, ch('r'));
    assert_eq!(update(&mut app, ch('x')), None);
    assert!(matches!(app.mode, Mode::ConfirmRelease { yes: false, .. }));

    // y releases.
    assert_eq!(
        update(&mut app, ch('y')),
        Some(Action::Release {
            kind: ReleaseKind::Fuse,
            rule: "order/mdm".into()
        })
    );
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(app.pending, Some((ReleaseKind::Fuse, "order/mdm".into())));
}

#[test]
fn choosing_yes_with_the_arrows_then_enter_releases_the_limit() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::BackTab));
    press(&mut app, "j");
    update(&mut app, ch('r'));
    update(&mut app, key(KeyCode::Right));
    assert!(matches!(app.mode, Mode::ConfirmRelease { yes: true, .. }));
    update(&mut app, key(KeyCode::Left));
    assert!(matches!(app.mode, Mode::ConfirmRelease { yes: false, .. }));
    update(&mut app, key(KeyCode::Right));
    assert_eq!(
        update(&mut app, key(KeyCode::Enter)),
        Some(Action::Release {
            kind: ReleaseKind::Limit,
            rule: "order/crm_supplier".into()
        })
    );
}

#[test]
fn release_from_the_rules_pane_only_on_a_tripped_rule() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::Tab));
    // crm/api is a limit that is not engaged.
    update(&mut app, ch('r'));
    assert_eq!(app.mode, Mode::Normal);
    assert!(
        app.notice
            .as_deref()
            .unwrap()
            .contains("nothing to release")
    );
    update(&mut app, ch('/'));
    press(&mut app, "mdm");
    update(&mut app, key(KeyCode::Enter));
    update(&mut app, ch('r'));
    assert!(matches!(
        &app.mode,
        Mode::ConfirmRelease { kind: ReleaseKind::Fuse, rule, .. } if rule == "order/mdm"
    ));
    // Nothing on the agents pane.
    let mut app = busy_app();
    update(&mut app, ch('r'));
    assert_eq!(app.mode, Mode::Normal);
}

#[test]
fn readonly_refuses_release_and_hides_it() {
    let mut app = App::new(URL, true, T0);
    update(&mut app, Msg::View(busy_view(60)));
    update(&mut app, key(KeyCode::BackTab));
    assert_eq!(update(&mut app, ch('r')), None);
    assert_eq!(app.mode, Mode::Normal);
    assert!(app.notice.as_deref().unwrap().contains("read-only"));
    let screen = draw(&app, 120, 36);
    assert!(!screen.contains("<r> release"), "{screen}");
    assert!(screen.contains("READ-ONLY"), "{screen}");
    update(&mut app, ch('?'));
    let help = draw(&app, 120, 36);
    assert!(help.contains("read-only: release is disabled"), "{help}");
    assert!(!help.contains("release the selected"), "{help}");
}

#[test]
fn release_result_is_shown_then_dismissed() {
    let mut app = busy_app();
    update(&mut app, key(KeyCode::BackTab));
    update(&mut app, ch('r'));
    update(&mut app, ch('y'));
    // A second release waits for the first answer.
    update(&mut app, ch('r'));
    assert_eq!(app.mode, Mode::Normal);
    assert!(app.notice.as_deref().unwrap().contains("waiting"));
    update(
        &mut app,
        Msg::ReleaseDone(ReleaseOutcome {
            kind: ReleaseKind::Fuse,
            rule: "order/mdm".into(),
            result: Ok(ReleaseResult {
                released: true,
                message: String::new(),
                agents_notified: 2,
            }),
        }),
    );
    assert_eq!(app.pending, None);
    assert_eq!(
        app.mode,
        Mode::Result {
            text: "released fuse order/mdm: 2 agents notified".into(),
            ok: true
        }
    );
    // Any key closes it without acting.
    assert_eq!(update(&mut app, ch('q')), None);
    assert_eq!(app.mode, Mode::Normal);

    update(
        &mut app,
        Msg::ReleaseDone(ReleaseOutcome {
            kind: ReleaseKind::Limit,
            rule: "order/crm_supplier".into(),
            result: Err("Unauthenticated: missing token".into()),
        }),
    );
    assert_eq!(
        app.mode,
        Mode::Result {
            text: "release of limit order/crm_supplier failed: Unauthenticated: missing token"
                .into(),
            ok: false
        }
    );
}

#[test]
fn filter_narrows_every_pane_and_esc_clears_it() {
    let mut app = busy_app();
    update(&mut app, ch('/'));
    assert_eq!(app.mode, Mode::Filter);
    // While typing, q and j are text, not commands.
    press(&mut app, "INVq");
    assert_eq!(app.filter, "INVq");
    update(&mut app, key(KeyCode::Backspace));
    assert_eq!(update(&mut app, key(KeyCode::Enter)), None);
    assert_eq!(app.mode, Mode::Normal);
    assert_eq!(
        rules_of(&app),
        ["inventory/reads", "inventory/stock_timeout"]
    );
    assert_eq!(app.agents().len(), 2);
    assert!(app.trips().is_empty());
    // Esc in normal mode clears the filter.
    update(&mut app, key(KeyCode::Esc));
    assert_eq!(app.filter, "");
    assert_eq!(rules_of(&app).len(), 7);
    // Esc while typing clears it too.
    update(&mut app, ch('/'));
    press(&mut app, "crm");
    update(&mut app, key(KeyCode::Esc));
    assert_eq!(app.filter, "");
    assert_eq!(app.mode, Mode::Normal);
}

#[test]
fn help_opens_and_closes() {
    let mut app = busy_app();
    update(&mut app, ch('?'));
    assert_eq!(app.mode, Mode::Help);
    press(&mut app, "j");
    assert_eq!(app.mode, Mode::Help);
    // q closes the help rather than quitting.
    assert_eq!(update(&mut app, ch('q')), None);
    assert_eq!(app.mode, Mode::Normal);
    update(&mut app, ch('?'));
    update(&mut app, key(KeyCode::Esc));
    assert_eq!(app.mode, Mode::Normal);
}

#[test]
fn disconnection_keeps_its_start_and_a_view_reconnects() {
    let mut app = busy_app();
    assert_eq!(app.connection, Connection::Connected);
    update(&mut app, Msg::Disconnected("connection refused".into()));
    update(&mut app, Msg::Tick(T0 + 5_000));
    update(
        &mut app,
        Msg::Disconnected("connection refused again".into()),
    );
    assert_eq!(
        app.connection,
        Connection::Disconnected {
            since_ms: T0,
            error: "connection refused again".into()
        }
    );
    // The last view stays on screen meanwhile.
    assert_eq!(app.rules().len(), 7);
    update(&mut app, Msg::Reconnected);
    assert_eq!(app.connection, Connection::Connected);
    update(&mut app, Msg::Disconnected("x".into()));
    update(&mut app, Msg::View(busy_view(61)));
    assert_eq!(app.connection, Connection::Connected);
}

#[test]
fn rates_come_from_successive_cumulative_counters() {
    let mut app = App::new(URL, false, T0);
    let t = Traffic {
        admitted_per_s: 50,
        rejected_per_s: per_s(&[
            (RejectReason::BulkheadFull, 10),
            (RejectReason::BulkheadTimeout, 2),
        ]),
        ..Traffic::default()
    };
    let view = |secs: u64, rule_view| gov_tui::proto::ClusterView {
        at_unix_ms: T0 + secs * 1000,
        rules: vec![rule_view],
        ..Default::default()
    };
    update(
        &mut app,
        Msg::View(view(0, rule("a/b", RuleKind::Bulkhead, None, t, 10))),
    );
    assert_eq!(app.rates("a/b"), None, "one view gives no rate");
    // 2 s later the counters moved by 2 s of traffic at twice the rate: 100/s.
    let mut v = rule("a/b", RuleKind::Bulkhead, None, t, 10);
    let s = v.stats.as_mut().unwrap();
    s.admitted += 2 * 100;
    let r = s.rejected.as_mut().unwrap();
    r.bulkhead_full += 2 * 20;
    r.bulkhead_timeout += 2 * 4;
    update(&mut app, Msg::View(view(2, v.clone())));
    let rates = *app.rates("a/b").unwrap();
    assert_eq!(rates.admitted, 100.0);
    assert_eq!(rates.rejected, 24.0);
    assert_eq!(rates.by_reason[..2], [20.0, 4.0]);
    assert!(rates.by_reason[2..].iter().all(|&r| r == 0.0));
    assert_eq!(app.rejection_history("a/b").collect::<Vec<_>>(), [24.0]);

    // A view that is not newer changes nothing.
    update(&mut app, Msg::View(view(2, v.clone())));
    assert_eq!(app.rejection_history("a/b").count(), 1);
    // Nor does one a few milliseconds newer (published for another change):
    // the next rate spans the whole second.
    let mut soon = view(2, v.clone());
    soon.at_unix_ms += 300;
    update(&mut app, Msg::View(soon));
    assert_eq!(app.rejection_history("a/b").count(), 1);
    assert_eq!(app.rates("a/b").unwrap().admitted, 100.0);

    // Counters going down (an agent left) count as no traffic, not negative.
    update(
        &mut app,
        Msg::View(view(3, rule("a/b", RuleKind::Bulkhead, None, t, 1))),
    );
    let rates = *app.rates("a/b").unwrap();
    assert_eq!((rates.admitted, rates.rejected), (0.0, 0.0));

    // Only the last five minutes are kept.
    for secs in 4..400 {
        update(
            &mut app,
            Msg::View(view(secs, rule("a/b", RuleKind::Bulkhead, None, t, secs))),
        );
    }
    let kept = app.rejection_history("a/b").count();
    assert_eq!(u64::try_from(kept).unwrap(), RATE_WINDOW_MS / 1000 + 1);

    // A rule that leaves the policy is forgotten.
    update(
        &mut app,
        Msg::View(view(401, rule("a/c", RuleKind::Bulkhead, None, t, 1))),
    );
    assert_eq!(app.rates("a/b"), None);
    assert_eq!(app.rejection_history("a/b").count(), 0);
}
