//! The agents, rules and latches (tripped fuses, engaged limits) tables.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;

use crate::app::{App, Pane, Trip, trip_key};
use crate::format::{ago, bar, duration, quantile_bucket, rate, short_version};
use gov_proto::v1::{AgentView, ReleaseKind, RuleKind, SyncState};

use super::style::*;
use super::table::*;

// === agents ===

pub(super) fn sync_cell(a: &AgentView) -> TextCell {
    let state = a.state();
    let mut text = state.word().to_owned();
    if matches!(state, SyncState::Nacked | SyncState::Unsaved) && !a.reason.is_empty() {
        text.push_str(&format!(" ({})", a.reason));
    }
    TextCell::styled(text, sync_style(state))
}

pub(super) fn sync_style(state: SyncState) -> Style {
    match state {
        SyncState::Synced => Style::new().green(),
        SyncState::Stale => Style::new().yellow(),
        // In force but lost on a restart without govd: a warning, not a refusal.
        SyncState::Unsaved => Style::new().yellow().bold(),
        SyncState::Nacked => Style::new().red().bold(),
        SyncState::Disconnected => Style::new().dark_gray(),
        SyncState::Unspecified => Style::new(),
    }
}

/// The version `a` enforces: the last one it acknowledged (a STALE, NACKED or
/// DISCONNECTED agent keeps it), or for an UNSAVED one the version sent,
/// which it acknowledged without saving.
pub(super) fn enforced(a: &AgentView) -> &str {
    if a.state() == SyncState::Unsaved || a.last_good_version.is_empty() {
        &a.version
    } else {
        &a.last_good_version
    }
}

/// Narrow: the service, instance and sync state stay longest (and take the
/// space in that order).
pub(super) const AGENT_COLUMNS: [Column; 7] = [
    shrinks("SERVICE", 8, 0),
    shrinks("INSTANCE", 10, 0),
    col("ADDRESS", 5),
    col("ENFORCES", 4),
    shrinks("SYNC", 12, 0),
    col("PHASE", 2),
    col("LAST SEEN", 3),
];

pub(super) fn render_agents(app: &App, frame: &mut Frame<'_>, area: Rect, agents: &[&AgentView]) {
    let total = app.view.as_ref().map_or(0, |v| v.agents.len());
    // Only the rows in the window are built: the pane costs the same at
    // 10 agents and 10,000.
    let selected = app.selected_agent_in(agents);
    let (from, to, sel) = window(agents.len(), selected, area);
    let rows = agents[from..to]
        .iter()
        .map(|a| {
            // The detail pane shows the version sent and saved as well.
            let version = enforced(a);
            vec![
                TextCell::from(a.service.clone()),
                TextCell::from(a.instance.clone()),
                TextCell::from(a.address.clone()),
                TextCell::from(short_version(version)),
                sync_cell(a),
                TextCell::from(a.phase().word()),
                TextCell::from(ago(app.now_ms, a.last_seen_unix_ms)),
            ]
        })
        .collect();
    render_table(
        frame,
        area,
        TableSpec {
            block: pane_block(
                app,
                Pane::Agents,
                count_title("Agents", agents.len(), total),
            ),
            columns: &AGENT_COLUMNS,
            rows,
            selected: sel,
            focused: app.focus == Pane::Agents,
            empty: if app.view.is_none() {
                "waiting for the control plane…"
            } else {
                "no agents connected"
            },
        },
    );
}

// === rules ===

/// A text sparkline of the last `width` samples, scaled to their maximum.
pub(super) fn spark_text(samples: &[f64], width: usize) -> String {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let tail = &samples[samples.len().saturating_sub(width)..];
    let max = tail.iter().copied().fold(0.0, f64::max);
    if max <= 0.0 {
        return String::new();
    }
    tail.iter()
        .map(|v| {
            if *v <= 0.0 {
                ' '
            } else {
                let level = (v / max * 7.0).round().clamp(0.0, 7.0);
                LEVELS[level as usize]
            }
        })
        .collect()
}

pub(super) fn in_flight_text(in_flight: u64, capacity: u64) -> String {
    if capacity == 0 {
        format!("{:>4} {in_flight}", "")
    } else {
        format!("{} {in_flight}/{capacity}", bar(in_flight, capacity, 4))
    }
}

/// Narrow: the rule's name and its rejections stay longest; the sparkline
/// goes first.
pub(super) const RULE_COLUMNS: [Column; 8] = [
    shrinks("RULE", 16, 0),
    col("KIND", 3),
    col("IN FLIGHT", 2),
    col("WAIT", 6),
    col("ADM/s", 4),
    col("REJ/s", 1),
    col("P99", 5),
    col("REJECTIONS", 7),
];

pub(super) fn render_rules(app: &App, frame: &mut Frame<'_>, area: Rect) {
    let rules = app.rules();
    let total = app.view.as_ref().map_or(0, |v| v.rules.len());
    let selected = app.selected_in(Pane::Rules, rules.iter().map(|r| r.rule.as_str()));
    let (from, to, sel) = window(rules.len(), selected, area);
    let spark_width = 10;
    let rows = rules[from..to]
        .iter()
        .map(|r| {
            let stats = r.stats.clone().unwrap_or_default();
            let rates = app.rates(&r.rule).copied().unwrap_or_default();
            let samples: Vec<f64> = app.rejection_history(&r.rule).collect();
            // A shadow rule's rejections are the calls it would have
            // rejected: yellow, and its kind says SHADOW and for how long.
            let shadow = r.mode() == gov_proto::v1::Mode::Shadow;
            let rejected = TextCell::styled(
                rate(rates.rejected),
                match (rates.rejected > 0.0, shadow) {
                    (false, _) => Style::new(),
                    (true, false) => Style::new().red().bold(),
                    (true, true) => Style::new().yellow().bold(),
                },
            );
            let kind = if shadow {
                TextCell::styled(
                    shadow_text(app, r.kind(), r.shadow_since_unix_ms),
                    Style::new().yellow(),
                )
            } else {
                TextCell::from(RuleKind::word(r.kind()))
            };
            let tripped = app.view.as_ref().is_some_and(|v| {
                v.fuses.iter().any(|f| f.rule == r.rule)
                    || v.limits.iter().any(|l| l.rule == r.rule)
            });
            let name_style = if tripped {
                Style::new().red().bold()
            } else {
                Style::new()
            };
            vec![
                TextCell::styled(r.rule.clone(), name_style),
                kind,
                TextCell::from(in_flight_text(stats.in_flight, stats.capacity)),
                TextCell::from(stats.waiting.to_string()),
                TextCell::from(rate(rates.admitted)),
                rejected,
                TextCell::from(
                    quantile_bucket(&stats.latency_buckets, 0.99).unwrap_or_else(|| "-".into()),
                ),
                TextCell::styled(
                    spark_text(&samples, spark_width),
                    if shadow {
                        Style::new().yellow()
                    } else {
                        Style::new().red()
                    },
                ),
            ]
        })
        .collect();
    render_table(
        frame,
        area,
        TableSpec {
            block: pane_block(app, Pane::Rules, count_title("Rules", rules.len(), total)),
            columns: &RULE_COLUMNS,
            rows,
            selected: sel,
            focused: app.focus == Pane::Rules,
            empty: if app.view.is_none() {
                ""
            } else {
                "no rules: apply a policy with `govc apply`"
            },
        },
    );
}

/// Whether `rule` is in mode shadow in the view.
pub(super) fn is_shadow(app: &App, rule: &str) -> bool {
    app.view.as_ref().is_some_and(|v| {
        v.rules
            .iter()
            .any(|r| r.rule == rule && r.mode() == gov_proto::v1::Mode::Shadow)
    })
}

/// `limit SHADOW 12m`: a rule in mode shadow and how long it has been.
pub(super) fn shadow_text(app: &App, kind: RuleKind, since_unix_ms: u64) -> String {
    if since_unix_ms == 0 || app.now_ms < since_unix_ms {
        return format!("{} SHADOW", kind.word());
    }
    format!(
        "{} SHADOW {}",
        kind.word(),
        duration(app.now_ms - since_unix_ms)
    )
}

// === trips ===

/// Time left until automatic release, counted down from the view's time.
pub(super) fn remaining_text(app: &App, t: &Trip<'_>) -> String {
    if t.remaining_ms == 0 {
        return "manual".into();
    }
    let at = app.view.as_ref().map_or(0, |v| v.at_unix_ms);
    let elapsed = if at == 0 {
        0
    } else {
        app.now_ms.saturating_sub(at)
    };
    format!("in {}", duration(t.remaining_ms.saturating_sub(elapsed)))
}

/// Narrow: the rule and its state stay longest, then why it tripped.
pub(super) const TRIP_COLUMNS: [Column; 6] = [
    col("KIND", 5),
    shrinks("RULE", 16, 0),
    col("STATE", 1),
    col("SINCE", 4),
    col("AUTO", 3),
    shrinks("WHY", 10, 2),
];

pub(super) fn render_trips(app: &App, frame: &mut Frame<'_>, area: Rect, trips: &[Trip<'_>]) {
    let total = app
        .view
        .as_ref()
        .map_or(0, |v| v.fuses.len() + v.limits.len());
    let keys: Vec<String> = trips.iter().map(|t| trip_key(*t)).collect();
    let selected = app.selected_in(Pane::Trips, keys.iter().map(String::as_str));
    let (from, to, sel) = window(trips.len(), selected, area);
    let rows = trips[from..to]
        .iter()
        .map(|t| {
            vec![
                TextCell::from(ReleaseKind::word(t.kind)),
                TextCell::from(if t.key.is_empty() {
                    t.rule.to_owned()
                } else {
                    format!("{} [{}]", t.rule, t.key)
                }),
                // A latch of a rule in shadow rejects nothing.
                if is_shadow(app, t.rule) {
                    TextCell::styled(format!("{} SHADOW", t.state), Style::new().yellow())
                } else {
                    TextCell::styled(t.state, Style::new().red().bold())
                },
                TextCell::from(ago(app.now_ms, t.since_unix_ms)),
                TextCell::from(remaining_text(app, t)),
                TextCell::from(t.reason),
            ]
        })
        .collect();
    render_table(
        frame,
        area,
        TableSpec {
            block: pane_block(
                app,
                Pane::Trips,
                count_title("Tripped fuses & engaged limits", trips.len(), total),
            ),
            columns: &TRIP_COLUMNS,
            rows,
            selected: sel,
            focused: app.focus == Pane::Trips,
            empty: "none: every fuse is closed and no limit is engaged",
        },
    );
}
