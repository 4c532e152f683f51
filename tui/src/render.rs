//! Drawing: a pure function of [`App`].
//!
//! Layout, top to bottom: a header (control plane, bundle version, connection,
//! counts), a red DISCONNECTED banner while the control plane is gone, the
//! agents table, then the rules table and the tripped fuses / engaged limits
//! on the left with a detail pane for the selection on the right, and a footer
//! with key hints. Help, the release confirmation and release results are
//! popups over it. Only the visible rows of long tables are built.

mod detail;
mod panes;
mod style;
mod table;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph, Wrap};

use crate::app::{App, Connection, Mode, service_of};
use crate::format::{duration, short_version, truncate};
use gov_proto::v1::{ReleaseKind, StoreHealth, SyncState};

use self::detail::*;
use self::panes::*;
use self::style::*;

/// Draws the whole screen for `app`.
pub fn render(app: &App, frame: &mut Frame<'_>) {
    let area = frame.area();
    let banner = matches!(app.connection, Connection::Disconnected { .. });
    let [header, banner_area, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(u16::from(banner)),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(area);

    render_header(app, frame, header);
    if banner {
        render_banner(app, frame, banner_area);
    }
    render_body(app, frame, body);
    render_footer(app, frame, footer);

    match &app.mode {
        Mode::Help => render_help(app, frame, area),
        Mode::ConfirmRelease { kind, rule, yes } => {
            render_confirm(app, frame, area, *kind, rule, *yes);
        }
        Mode::Result { text, ok } => render_result(frame, area, text, *ok),
        Mode::Normal | Mode::Filter => {}
    }
}

/// A canary running: its version, where, how long is left, and the rule
/// whose rejections on the canary are furthest above the other instances'.
fn canary_part(c: &gov_proto::v1::CanaryView, now: u64) -> Span<'static> {
    let ratio = |n: u64, calls: u64| {
        if calls == 0 {
            0.0
        } else {
            n as f64 / calls as f64
        }
    };
    let worst = c
        .rules
        .iter()
        .filter_map(|r| {
            let (a, b) = (r.canary?, r.baseline?);
            Some((
                ratio(a.rejected, a.calls) - ratio(b.rejected, b.calls),
                r,
                a,
                b,
            ))
        })
        .max_by(|x, y| x.0.total_cmp(&y.0))
        .filter(|w| w.0 > 0.0)
        .map(|(_, r, a, b)| {
            format!(
                " · {} rejects {:.0}% vs {:.0}%",
                r.rule,
                ratio(a.rejected, a.calls) * 100.0,
                ratio(b.rejected, b.calls) * 100.0
            )
        })
        .unwrap_or_default();
    Span::styled(
        format!(
            "CANARY {} on {} · {} left{worst}",
            short_version(&c.version),
            c.instances.join(","),
            duration(c.ends_unix_ms.saturating_sub(now)),
        ),
        Style::new().black().on_magenta(),
    )
}

/// The header's parts, most important first where it is too narrow: what is
/// wrong (disconnected, agents not synced, trips) stays, the URL goes first.
fn render_header(app: &App, frame: &mut Frame<'_>, area: Rect) {
    // (priority: 0 stays longest, spans)
    let mut parts: Vec<(u8, Vec<Span<'static>>)> = Vec::new();
    let mut gov = vec![Span::styled(" gov ", Style::new().bold().black().on_cyan())];
    if app.readonly {
        gov.push(Span::raw(" "));
        gov.push(Span::styled("READ-ONLY", Style::new().black().on_yellow()));
    }
    parts.push((0, gov));
    // The URL stays long (after the connection state and the alarms): it is
    // how people tell two TUIs on two control planes apart, at 80x24 too.
    parts.push((2, vec![Span::raw(app.url.clone())]));
    let version = app
        .view
        .as_ref()
        .map(|v| v.version.as_str())
        .filter(|v| !v.is_empty());
    parts.push((
        3,
        vec![Span::raw(match version {
            Some(v) => format!("bundle {}", short_version(v)),
            None => "no bundle applied".into(),
        })],
    ));
    parts.push((
        0,
        vec![match &app.connection {
            Connection::Connecting => Span::styled("CONNECTING…", Style::new().yellow()),
            Connection::Connected => Span::styled("● CONNECTED", Style::new().green()),
            Connection::Disconnected { .. } => {
                Span::styled("● DISCONNECTED", Style::new().red().bold())
            }
        }],
    ));
    if let Some(view) = &app.view {
        view_parts(view, &mut parts);
    }
    // ` gov  URL │ bundle … │ ● CONNECTED │ …`: the badge, a space, then parts
    // separated by bars.
    let separator = |k: usize| if k == 1 { " " } else { " │ " };
    let width = |parts: &[(u8, Vec<Span<'static>>)]| {
        parts
            .iter()
            .enumerate()
            .map(|(k, (_, spans))| {
                let sep = if k == 0 {
                    0
                } else {
                    separator(k).chars().count()
                };
                sep + spans.iter().map(Span::width).sum::<usize>()
            })
            .sum::<usize>()
    };
    while parts.len() > 1 && width(&parts) > usize::from(area.width) {
        let Some(at) = (0..parts.len()).max_by_key(|&k| (parts[k].0, k)) else {
            break;
        };
        parts.remove(at);
    }
    let mut spans = Vec::new();
    for (k, (_, part)) in parts.into_iter().enumerate() {
        if k > 0 {
            spans.push(Span::raw(separator(k)));
        }
        spans.extend(part);
    }
    frame.render_widget(Line::from(spans), area);
}

/// The header's parts from govd's view: counts, what is not synced,
/// trips, a canary, the store.
fn view_parts(view: &gov_proto::v1::ClusterView, parts: &mut Vec<(u8, Vec<Span<'static>>)>) {
    // From the counts per service and state where govd sends them (a
    // few rows at 10,000 agents), from the rows otherwise.
    let counted = !view.agent_counts.is_empty();
    let mut services: Vec<&str> = if counted {
        view.agent_counts
            .iter()
            .map(|c| c.service.as_str())
            .collect()
    } else {
        view.agents.iter().map(|a| a.service.as_str()).collect()
    };
    services.extend(view.rules.iter().map(|r| service_of(&r.rule)));
    services.sort_unstable();
    services.dedup();
    parts.push((
        4,
        vec![Span::raw(format!(
            "{} services · {} agents · {} rules",
            services.len(),
            view.agents.len(),
            view.rules.len()
        ))],
    ));
    let unsynced = if counted {
        let not_synced = view
            .agent_counts
            .iter()
            .filter(|c| c.state() != SyncState::Synced);
        not_synced.map(|c| c.agents as usize).sum()
    } else {
        let not_synced = view
            .agents
            .iter()
            .filter(|a| a.state() != SyncState::Synced);
        not_synced.count()
    };
    if unsynced > 0 {
        parts.push((
            1,
            vec![Span::styled(
                format!("{unsynced} not synced"),
                Style::new().yellow(),
            )],
        ));
    }
    let trips = view.fuses.len() + view.limits.len();
    if trips > 0 {
        parts.push((
            1,
            vec![Span::styled(
                format!("{trips} tripped"),
                Style::new().red().bold(),
            )],
        ));
    }
    if let Some(canary) = &view.canary {
        parts.push((1, vec![canary_part(canary, view.at_unix_ms)]));
    }
    if let Some(store) = &view.store {
        parts.push(store_part(store, view.at_unix_ms));
    }
}

/// The store's health in the header, as `govc status`'s `Store:` line says
/// it: `store ok` goes first when narrow; a store that cannot take writes
/// (applies and releases fail) stays, in red, with how long.
fn store_part(store: &StoreHealth, now_ms: u64) -> (u8, Vec<Span<'static>>) {
    if store.writable {
        return (6, vec![Span::raw("store ok")]);
    }
    let what = if store.store.starts_with("etcd://") {
        "NO ETCD QUORUM"
    } else {
        "STORE NOT WRITABLE"
    };
    let since = duration(now_ms.saturating_sub(store.failing_since_unix_ms));
    (
        0,
        vec![Span::styled(
            format!("{what} {since}"),
            Style::new().red().bold(),
        )],
    )
}

fn render_banner(app: &App, frame: &mut Frame<'_>, area: Rect) {
    let Connection::Disconnected { since_ms, error } = &app.connection else {
        return;
    };
    let mut text = format!(
        " DISCONNECTED from {} for {} · reconnecting… · {error}",
        app.url,
        duration(app.now_ms.saturating_sub(*since_ms))
    );
    if app.view.is_some() {
        text.push_str(" (showing the last view)");
    }
    frame.render_widget(
        Paragraph::new(text).style(Style::new().white().on_red().bold()),
        area,
    );
}

fn render_body(app: &App, frame: &mut Frame<'_>, area: Rect) {
    let agents = app.agents();
    let trips = app.trips();
    let agents_height = u16::try_from(agents.len().max(1) + 3)
        .unwrap_or(u16::MAX)
        .min((area.height * 3 / 10).max(5));
    let [agents_area, rest] =
        Layout::vertical([Constraint::Length(agents_height), Constraint::Fill(1)]).areas(area);
    let [left, detail_area] =
        Layout::horizontal([Constraint::Fill(2), Constraint::Fill(1)]).areas(rest);
    let trips_height = u16::try_from(trips.len().max(1) + 3)
        .unwrap_or(u16::MAX)
        .min((left.height / 3).max(4));
    let [rules_area, trips_area] =
        Layout::vertical([Constraint::Fill(1), Constraint::Length(trips_height)]).areas(left);

    render_agents(app, frame, agents_area, &agents);
    render_rules(app, frame, rules_area);
    render_trips(app, frame, trips_area, &trips);
    render_detail(app, frame, detail_area);
}

// === footer and popups ===

fn render_footer(app: &App, frame: &mut Frame<'_>, area: Rect) {
    let key = |k: &'static str| Span::styled(k, Style::new().fg(FOCUS).bold());
    let mut spans = Vec::new();
    if app.mode == Mode::Filter {
        spans.push(key("/"));
        spans.push(Span::raw(format!("{}▏", app.filter)));
        spans.push(Span::raw("  "));
        spans.push(key("<enter>"));
        spans.push(Span::raw(" keep  "));
        spans.push(key("<esc>"));
        spans.push(Span::raw(" clear"));
    } else {
        for (i, (keys, what)) in crate::keys::hints(app.readonly).enumerate() {
            if i > 0 {
                spans.push(Span::raw("  "));
            }
            spans.extend([key(keys), Span::raw(format!(" {what}"))]);
        }
        if !app.filter.is_empty() {
            spans.push(Span::raw("  │ filter: "));
            spans.push(Span::styled(app.filter.clone(), Style::new().yellow()));
            spans.push(Span::raw(" (esc clears)"));
        }
    }
    if let Some((kind, rule)) = &app.pending {
        spans.push(Span::raw("  │ "));
        spans.push(Span::styled(
            format!("releasing {} {rule}…", ReleaseKind::word(*kind)),
            Style::new().yellow(),
        ));
    }
    if let Some(notice) = &app.notice {
        spans.push(Span::raw("  │ "));
        spans.push(Span::styled(notice.clone(), Style::new().yellow()));
    }
    frame.render_widget(Line::from(spans), area);
}

/// A rectangle of at most `width` x `height` centered in `area`.
fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

fn render_help(app: &App, frame: &mut Frame<'_>, area: Rect) {
    let lines: Vec<Line<'_>> = crate::keys::help(app.readonly)
        .into_iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!(" {k:<16}"), Style::new().fg(FOCUS).bold()),
                Span::raw(v),
            ])
        })
        .chain([
            Line::raw(""),
            Line::styled(
                " sync: SYNCED acked · STALE sent, not acked ·",
                Style::new().dark_gray(),
            ),
            Line::styled(
                "       NACKED refused · DISCONNECTED no stream",
                Style::new().dark_gray(),
            ),
        ])
        .collect();
    let popup = centered(area, 60, u16::try_from(lines.len() + 2).unwrap_or(u16::MAX));
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .border_type(BorderType::Rounded)
                .border_style(Style::new().fg(FOCUS))
                .title(" Help ")
                .title_bottom(Line::from(" esc closes ").right_aligned()),
        ),
        popup,
    );
}

fn render_confirm(
    app: &App,
    frame: &mut Frame<'_>,
    area: Rect,
    kind: ReleaseKind,
    rule: &str,
    yes: bool,
) {
    let service = service_of(rule);
    let agents = app.view.as_ref().map_or(0, |v| {
        v.agents.iter().filter(|a| a.service == service).count()
    });
    let button = |label: &'static str, on: bool| {
        if on {
            Span::styled(label, Style::new().black().on_red().bold())
        } else {
            Span::raw(label)
        }
    };
    let lines = vec![
        Line::from(format!(
            "Release {} {rule} on all agents of {service}? [y/N]",
            ReleaseKind::word(kind)
        ))
        .bold(),
        Line::styled(
            format!(
                "{agents} agent{} will let traffic through again; recorded in the audit log.",
                if agents == 1 { "" } else { "s" }
            ),
            Style::new().dark_gray(),
        ),
        Line::raw(""),
        Line::from(vec![
            button("[ No ]", !yes),
            Span::raw("   "),
            button("[ Yes ]", yes),
        ])
        .centered(),
    ];
    let popup = centered(area, 76, 6);
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: true }).block(
            Block::bordered()
                .border_type(BorderType::Double)
                .border_style(Style::new().red())
                .title(" Confirm release ")
                .title_bottom(Line::from(" y yes · n/esc/enter no · ←→ choose ").right_aligned()),
        ),
        popup,
    );
}

fn render_result(frame: &mut Frame<'_>, area: Rect, text: &str, ok: bool) {
    let popup = centered(area, 76, 5);
    frame.render_widget(Clear, popup);
    let color = if ok { Color::Green } else { Color::Red };
    frame.render_widget(
        Paragraph::new(truncate(text, 200))
            .wrap(Wrap { trim: true })
            .block(
                Block::bordered()
                    .border_type(BorderType::Rounded)
                    .border_style(Style::new().fg(color))
                    .title(if ok { " Released " } else { " Not released " })
                    .title_bottom(Line::from(" any key closes ").right_aligned()),
            ),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use super::table::*;

    const COLUMNS: [Column; 4] = [
        shrinks("NAME", 6, 0),
        col("COUNT", 1),
        col("RATE", 3),
        shrinks("WHY", 4, 2),
    ];

    #[test]
    fn everything_fits_when_wide() {
        // NAME wants 20, COUNT 5, RATE 4, WHY 30; 3 gaps.
        let wants = [20, 5, 4, 30];
        assert_eq!(
            fit(&COLUMNS, &wants, 70, 1),
            vec![(0, 20), (1, 5), (2, 4), (3, 38)]
        );
    }

    #[test]
    fn narrow_drops_the_least_important_first_then_shrinks_names() {
        let wants = [20, 5, 4, 30];
        // Mins 6 + 5 + 4 + 4 + 3 gaps = 22: all kept, NAME grows first.
        assert_eq!(
            fit(&COLUMNS, &wants, 30, 1),
            vec![(0, 14), (1, 5), (2, 4), (3, 4)]
        );
        // 21 < 22: RATE (priority 3) goes, never cut to `0/`.
        assert_eq!(fit(&COLUMNS, &wants, 21, 1), vec![(0, 10), (1, 5), (3, 4)]);
        // Then WHY, then COUNT; NAME is shown, cut, whatever the width.
        assert_eq!(fit(&COLUMNS, &wants, 12, 1), vec![(0, 6), (1, 5)]);
        assert_eq!(fit(&COLUMNS, &wants, 8, 1), vec![(0, 8)]);
        assert_eq!(fit(&COLUMNS, &wants, 3, 1), vec![(0, 3)]);
        assert_eq!(fit(&COLUMNS, &wants, 0, 1), vec![(0, 0)]);
    }
}
