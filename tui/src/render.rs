//! Drawing: a pure function of [`App`].
//!
//! Layout, top to bottom: a header (control plane, bundle version, connection,
//! counts), a red DISCONNECTED banner while the control plane is gone, the
//! agents table, then the rules table and the tripped fuses / engaged limits
//! on the left with a detail pane for the selection on the right, and a footer
//! with key hints. Help, the release confirmation and release results are
//! popups over it. Only the visible rows of long tables are built.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{
    Block, BorderType, Borders, Cell, Clear, Gauge, Paragraph, Row, Sparkline, Table, TableState,
    Wrap,
};

use crate::app::{App, Connection, Mode, Pane, Trip, agent_key, service_of, trip_key};
use crate::format::{
    ago, bar, duration, latency_bound, quantile_bucket, rate, short_version, truncate,
};
use crate::history::REASONS;
use crate::proto::{AgentView, ReleaseKind, RuleKind, RuleView, SourceRef, StoreHealth, SyncState};

const FOCUS: Color = Color::Cyan;
const SELECTED: Style = Style::new().add_modifier(Modifier::REVERSED);

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
    parts.push((5, vec![Span::raw(app.url.clone())]));
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
        let mut services: Vec<&str> = view.agents.iter().map(|a| a.service.as_str()).collect();
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
        let unsynced = view
            .agents
            .iter()
            .filter(|a| a.state() != SyncState::Synced)
            .count();
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
        if let Some(store) = &view.store {
            parts.push(store_part(store, view.at_unix_ms));
        }
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

fn pane_block(app: &App, pane: Pane, title: String) -> Block<'static> {
    let focused = app.focus == pane;
    let block = Block::new()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .title(Line::from(format!(" {title} ")));
    if focused {
        block
            .border_style(Style::new().fg(FOCUS))
            .title_style(Style::new().fg(FOCUS).bold())
    } else {
        block.border_style(Style::new().dark_gray())
    }
}

fn count_title(name: &str, shown: usize, total: usize) -> String {
    if shown == total {
        format!("{name} ({total})")
    } else {
        format!("{name} ({shown}/{total})")
    }
}

/// The rows to build for a table of `len` rows in `area` (borders and header
/// excluded) so that `selected` is visible, and the selection within them.
fn window(len: usize, selected: Option<usize>, area: Rect) -> (usize, usize, Option<usize>) {
    let visible = usize::from(area.height.saturating_sub(3)).max(1);
    let sel = selected.unwrap_or(0);
    let offset = sel.saturating_sub(visible - 1);
    let end = (offset + visible).min(len);
    (offset, end, selected.map(|s| s - offset))
}

/// A table column: its header, how narrow it may get and how much it matters.
/// A narrow pane drops the columns that matter least, then truncates the
/// ones that may shrink with `…`; a value that may not shrink (a count, a
/// time) is shown whole or not at all.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Column {
    pub(crate) header: &'static str,
    /// Narrowest width for a column that may shrink (names, reasons);
    /// `None`: the column is as wide as its widest cell, or dropped.
    pub(crate) min: Option<u16>,
    /// 0 matters most; the highest is dropped first.
    pub(crate) priority: u8,
}

const fn col(header: &'static str, priority: u8) -> Column {
    Column {
        header,
        min: None,
        priority,
    }
}

const fn shrinks(header: &'static str, min: u16, priority: u8) -> Column {
    Column {
        header,
        min: Some(min),
        priority,
    }
}

/// A cell's text and style, before its column's width is known.
pub(crate) struct TextCell {
    text: String,
    style: Style,
}

impl<T: Into<String>> From<T> for TextCell {
    fn from(text: T) -> Self {
        TextCell {
            text: text.into(),
            style: Style::new(),
        }
    }
}

impl TextCell {
    fn styled(text: impl Into<String>, style: Style) -> Self {
        TextCell {
            text: text.into(),
            style,
        }
    }
}

/// Which columns fit in `width` cells and how wide each is, in column order:
/// `(index, width)`. `wants[i]` is the widest cell of column `i` (header
/// included). Columns are dropped, least important first, until the rest fit
/// at their narrowest; the space left goes to the shrunk ones, most
/// important (then leftmost) first.
pub(crate) fn fit(
    columns: &[Column],
    wants: &[u16],
    width: u16,
    spacing: u16,
) -> Vec<(usize, u16)> {
    let header = |i: usize| u16::try_from(columns[i].header.chars().count()).unwrap_or(u16::MAX);
    let min = |i: usize| match columns[i].min {
        Some(m) => m.max(header(i)).min(wants[i]),
        None => wants[i],
    };
    let mut kept: Vec<usize> = (0..columns.len()).collect();
    let need = |kept: &[usize]| {
        let gaps = u16::try_from(kept.len().saturating_sub(1)).unwrap_or(u16::MAX);
        kept.iter()
            .map(|&i| min(i))
            .fold(gaps.saturating_mul(spacing), u16::saturating_add)
    };
    while kept.len() > 1 && need(&kept) > width {
        // The least important; of equals, the rightmost.
        let Some(at) = (0..kept.len()).max_by_key(|&k| (columns[kept[k]].priority, k)) else {
            break;
        };
        kept.remove(at);
    }
    let mut widths: Vec<(usize, u16)> = kept.iter().map(|&i| (i, min(i).min(width))).collect();
    let mut spare = width.saturating_sub(need(&kept));
    let mut by_priority: Vec<usize> = (0..widths.len()).collect();
    by_priority.sort_by_key(|&k| columns[widths[k].0].priority);
    for k in by_priority {
        let (i, w) = &mut widths[k];
        let more = wants[*i].saturating_sub(*w).min(spare);
        *w += more;
        spare -= more;
    }
    // What is left widens the last column that may shrink (a name or a
    // reason), so that the columns after it line up at the right edge.
    if let Some((_, w)) = widths
        .iter_mut()
        .rev()
        .find(|(i, _)| columns[*i].min.is_some())
    {
        *w += spare;
    }
    widths
}

/// One table pane: its frame, columns and the rows in view.
struct TableSpec<'a> {
    block: Block<'a>,
    columns: &'a [Column],
    rows: Vec<Vec<TextCell>>,
    /// Within `rows`.
    selected: Option<usize>,
    focused: bool,
    /// Shown instead of an empty table.
    empty: &'a str,
}

fn render_table(frame: &mut Frame<'_>, area: Rect, spec: TableSpec<'_>) {
    let TableSpec {
        block,
        columns,
        rows,
        selected,
        focused,
        empty,
    } = spec;
    if rows.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled(empty.to_owned(), Style::new().dark_gray())).block(block),
            area,
        );
        return;
    }
    const SPACING: u16 = 1;
    let width_of = |text: &str| u16::try_from(text.chars().count()).unwrap_or(u16::MAX);
    let wants: Vec<u16> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|cell| width_of(&cell.text))
                .fold(width_of(c.header), u16::max)
        })
        .collect();
    let shown = fit(columns, &wants, area.width.saturating_sub(2), SPACING);
    let header = Row::new(
        shown
            .iter()
            .map(|&(i, w)| Cell::from(truncate(columns[i].header, usize::from(w)))),
    )
    .style(Style::new().bold());
    let rows: Vec<Row<'_>> = rows
        .into_iter()
        .map(|row| {
            Row::new(shown.iter().map(|&(i, w)| match row.get(i) {
                Some(cell) => Cell::from(truncate(&cell.text, usize::from(w))).style(cell.style),
                None => Cell::from(""),
            }))
        })
        .collect();
    let widths = shown.iter().map(|&(_, w)| Constraint::Length(w));
    let table = Table::new(rows, widths)
        .header(header)
        .block(block)
        .column_spacing(SPACING)
        .row_highlight_style(if focused {
            SELECTED
        } else {
            Style::new().add_modifier(Modifier::BOLD)
        });
    let mut state = TableState::new().with_selected(selected);
    frame.render_stateful_widget(table, area, &mut state);
}

// === agents ===

fn sync_cell(a: &AgentView) -> TextCell {
    let state = a.state();
    let mut text = state.word().to_owned();
    if matches!(state, SyncState::Nacked | SyncState::Unsaved) && !a.reason.is_empty() {
        text.push_str(&format!(" ({})", a.reason));
    }
    TextCell::styled(text, sync_style(state))
}

fn sync_style(state: SyncState) -> Style {
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
fn enforced(a: &AgentView) -> &str {
    if a.state() == SyncState::Unsaved || a.last_good_version.is_empty() {
        &a.version
    } else {
        &a.last_good_version
    }
}

/// Narrow: the service, instance and sync state stay longest (and take the
/// space in that order).
const AGENT_COLUMNS: [Column; 7] = [
    shrinks("SERVICE", 8, 0),
    shrinks("INSTANCE", 10, 0),
    col("ADDRESS", 5),
    col("ENFORCES", 4),
    shrinks("SYNC", 12, 0),
    col("PHASE", 2),
    col("LAST SEEN", 3),
];

fn render_agents(app: &App, frame: &mut Frame<'_>, area: Rect, agents: &[&AgentView]) {
    let total = app.view.as_ref().map_or(0, |v| v.agents.len());
    let keys: Vec<String> = agents.iter().map(|a| agent_key(a)).collect();
    let selected = app.selected_in(Pane::Agents, keys.iter().map(String::as_str));
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
fn spark_text(samples: &[f64], width: usize) -> String {
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

fn in_flight_text(in_flight: u64, capacity: u64) -> String {
    if capacity == 0 {
        format!("{:>4} {in_flight}", "")
    } else {
        format!("{} {in_flight}/{capacity}", bar(in_flight, capacity, 4))
    }
}

/// Narrow: the rule's name and its rejections stay longest; the sparkline
/// goes first.
const RULE_COLUMNS: [Column; 8] = [
    shrinks("RULE", 16, 0),
    col("KIND", 3),
    col("IN FLIGHT", 2),
    col("WAIT", 6),
    col("ADM/s", 4),
    col("REJ/s", 1),
    col("P99", 5),
    col("REJECTIONS", 7),
];

fn render_rules(app: &App, frame: &mut Frame<'_>, area: Rect) {
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
            let shadow = r.mode() == crate::proto::Mode::Shadow;
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
fn is_shadow(app: &App, rule: &str) -> bool {
    app.view.as_ref().is_some_and(|v| {
        v.rules
            .iter()
            .any(|r| r.rule == rule && r.mode() == crate::proto::Mode::Shadow)
    })
}

/// `limit SHADOW 12m`: a rule in mode shadow and how long it has been.
fn shadow_text(app: &App, kind: RuleKind, since_unix_ms: u64) -> String {
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
fn remaining_text(app: &App, t: &Trip<'_>) -> String {
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
const TRIP_COLUMNS: [Column; 6] = [
    col("KIND", 5),
    shrinks("RULE", 16, 0),
    col("STATE", 1),
    col("SINCE", 4),
    col("AUTO", 3),
    shrinks("WHY", 10, 2),
];

fn render_trips(app: &App, frame: &mut Frame<'_>, area: Rect, trips: &[Trip<'_>]) {
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

// === detail ===

fn render_detail(app: &App, frame: &mut Frame<'_>, area: Rect) {
    let block = Block::new()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(Style::new().dark_gray());
    match app.focus {
        Pane::Agents => match app.selected_agent() {
            Some(a) => render_agent_detail(app, frame, area, block, a),
            None => frame.render_widget(block.title(" Detail "), area),
        },
        Pane::Rules => {
            let rule = app.selected_rule();
            let trip = rule.and_then(|r| app.trips().into_iter().find(|t| t.rule == r.rule));
            render_rule_detail(app, frame, area, block, rule, trip);
        }
        Pane::Trips => {
            let trip = app.selected_trip();
            let rule = trip.and_then(|t| {
                app.view
                    .as_ref()
                    .and_then(|v| v.rules.iter().find(|r| r.rule == t.rule))
            });
            render_rule_detail(app, frame, area, block, rule, trip);
        }
    }
}

/// The gRPC calls of a rule by the code they ended with (cumulative), the
/// codes seen only: `OK 120  UNAVAILABLE 3`. `None` when no gRPC call ended.
fn grpc_outcomes(counts: &[u64]) -> Option<String> {
    let seen: Vec<String> = gov_proto::grpc::CODES
        .iter()
        .zip(counts)
        .filter(|(_, n)| **n > 0)
        .map(|(code, n)| format!("{} {n}", gov_proto::grpc::name(*code)))
        .collect();
    (!seen.is_empty()).then(|| seen.join("  "))
}

fn field(name: &str, value: impl Into<String>) -> Line<'static> {
    Line::from(vec![
        Span::styled(format!("{name:<11}"), Style::new().dark_gray()),
        Span::raw(value.into()),
    ])
}

fn render_agent_detail(
    app: &App,
    frame: &mut Frame<'_>,
    area: Rect,
    block: Block<'_>,
    a: &AgentView,
) {
    let mut lines = vec![
        field("service", a.service.clone()),
        field("instance", a.instance.clone()),
        field("address", a.address.clone()),
        Line::from(vec![
            Span::styled(format!("{:<11}", "sync"), Style::new().dark_gray()),
            match a.state() {
                SyncState::Unspecified => Span::raw("-"),
                state => Span::styled(state.word(), sync_style(state)),
            },
        ]),
    ];
    if !a.reason.is_empty() {
        lines.push(field("reason", a.reason.clone()));
    }
    if !a.rule.is_empty() {
        lines.push(field("rule", a.rule.clone()));
    }
    lines.push(field("sent", a.version.clone()));
    lines.push(field("enforcing", enforced(a).to_owned()));
    if a.state() == SyncState::Unsaved {
        // In force but not saved: a restart without govd goes back to this.
        lines.push(Line::from(vec![
            Span::styled(format!("{:<11}", "on restart"), Style::new().dark_gray()),
            Span::raw(if a.last_good_version.is_empty() {
                "no config".to_owned()
            } else {
                a.last_good_version.clone()
            })
            .yellow(),
        ]));
    }
    lines.push(field("phase", a.phase().word()));
    lines.push(field("last seen", ago(app.now_ms, a.last_seen_unix_ms)));
    // Leaving: the callers that still route to it (they have not acknowledged
    // the endpoint set without it), as `govc status` shows them.
    if !a.removal_waiting_on.is_empty() {
        lines.push(Line::from(vec![
            Span::styled(format!("{:<11}", "removal"), Style::new().dark_gray()),
            Span::raw(format!("waiting on {}", a.removal_waiting_on.join(", "))).yellow(),
        ]));
    }
    for (k, v) in &a.labels {
        lines.push(field("label", format!("{k}={v}")));
    }
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block.title(format!(" Agent {} ", a.instance))),
        area,
    );
}

fn source_line(source: Option<&SourceRef>) -> String {
    match source {
        Some(s) if !s.file.is_empty() && s.line > 0 => format!("{}:{}", s.file, s.line),
        Some(s) if !s.file.is_empty() => s.file.clone(),
        _ => "-".into(),
    }
}

fn render_rule_detail(
    app: &App,
    frame: &mut Frame<'_>,
    area: Rect,
    block: Block<'_>,
    rule: Option<&RuleView>,
    trip: Option<Trip<'_>>,
) {
    let name = rule
        .map(|r| r.rule.as_str())
        .or(trip.map(|t| t.rule))
        .unwrap_or_default();
    if name.is_empty() {
        frame.render_widget(block.title(" Detail "), area);
        return;
    }
    let block = block.title(format!(" {name} "));
    let inner = block.inner(area);
    frame.render_widget(block, area);

    let stats = rule.and_then(|r| r.stats.clone()).unwrap_or_default();
    let rates = app.rates(name).copied().unwrap_or_default();
    let source = rule
        .and_then(|r| r.source.as_ref())
        .or(trip.and_then(|t| t.source));

    let mut top = vec![field(
        "kind",
        rule.map_or_else(
            || trip.map_or("-", |t| ReleaseKind::word(t.kind)).to_owned(),
            |r| RuleKind::word(r.kind()).to_owned(),
        ),
    )];
    top.push(field("source", source_line(source)));
    if let Some(t) = trip {
        top.push(Line::from(vec![
            Span::styled(format!("{:<11}", "state"), Style::new().dark_gray()),
            Span::raw(t.state).red().bold(),
            Span::raw(format!(" since {}", ago(app.now_ms, t.since_unix_ms))),
        ]));
        top.push(field("why", t.reason.to_owned()));
        top.push(field("auto", remaining_text(app, &t)));
    }
    top.push(field("waiting", stats.waiting.to_string()));
    top.push(field("admitted", format!("{}/s", rate(rates.admitted))));
    top.push(field("rejected", format!("{}/s", rate(rates.rejected))));
    for (reason, r) in REASONS.iter().zip(rates.by_reason) {
        if r > 0.0 {
            top.push(Line::styled(
                format!("{:<11}{reason} {}/s", "", rate(r)),
                Style::new().red(),
            ));
        }
    }
    if let Some(codes) = grpc_outcomes(&stats.grpc_outcomes) {
        top.push(field("grpc", codes));
    }
    // Long lines (a trip reason) wrap; count the rows they take.
    let width = usize::from(inner.width.max(1));
    let top_rows: usize = top.iter().map(|l| l.width().max(1).div_ceil(width)).sum();

    let latency = latency_lines(&stats.latency_buckets);
    let snippet: Vec<Line<'_>> = source
        .map(|s| s.snippet.lines().map(Line::raw).collect())
        .unwrap_or_default();

    let [top_area, gauge_area, latency_area, spark_area, snippet_area] = Layout::vertical([
        Constraint::Length(u16::try_from(top_rows).unwrap_or(u16::MAX)),
        Constraint::Length(1),
        Constraint::Length(u16::try_from(latency.len()).unwrap_or(u16::MAX)),
        Constraint::Length(3),
        Constraint::Fill(1),
    ])
    .areas(inner);

    frame.render_widget(Paragraph::new(top).wrap(Wrap { trim: false }), top_area);

    if stats.capacity == 0 {
        frame.render_widget(field("in flight", stats.in_flight.to_string()), gauge_area);
    } else {
        let ratio = (stats.in_flight as f64 / stats.capacity as f64).clamp(0.0, 1.0);
        let color = if ratio >= 1.0 {
            Color::Red
        } else if ratio >= 0.8 {
            Color::Yellow
        } else {
            Color::Green
        };
        frame.render_widget(
            Gauge::default()
                .ratio(ratio)
                .label(format!("in flight {}/{}", stats.in_flight, stats.capacity))
                .gauge_style(Style::new().fg(color).bg(Color::Black)),
            gauge_area,
        );
    }

    frame.render_widget(Paragraph::new(latency), latency_area);

    let samples: Vec<f64> = app.rejection_history(name).collect();
    let max = samples.iter().copied().fold(0.0, f64::max);
    let width = usize::from(spark_area.width);
    // Rates are scaled to integers for the widget; its bars are relative anyway.
    let data: Vec<u64> = samples[samples.len().saturating_sub(width)..]
        .iter()
        .map(|v| (v * 100.0).round() as u64)
        .collect();
    let [spark_label, spark_bars] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(2)]).areas(spark_area);
    frame.render_widget(
        Line::from(vec![
            Span::styled("rejections/s, last 5m", Style::new().dark_gray()),
            Span::raw(format!(" (max {})", rate(max))),
        ]),
        spark_label,
    );
    frame.render_widget(Sparkline::default().data(&data).red(), spark_bars);

    frame.render_widget(
        Paragraph::new(Text::from(snippet))
            .block(
                Block::new()
                    .borders(Borders::TOP)
                    .border_style(Style::new().dark_gray())
                    .title(Span::styled(" source ", Style::new().dark_gray())),
            )
            .style(Style::new().fg(Color::Gray)),
        snippet_area,
    );
}

/// Two lines: bucket bounds and the share of calls in each.
fn latency_lines(buckets: &[u64]) -> Vec<Line<'static>> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return vec![field("latency", "no finished calls")];
    }
    // Two rows of four buckets, so that it fits a narrow pane.
    let mut lines = Vec::new();
    let names: Vec<String> = (0..buckets.len()).map(latency_bound).collect();
    for (row, (names, counts)) in names.chunks(4).zip(buckets.chunks(4)).enumerate() {
        let mut bounds = format!("{:<11}", if row == 0 { "latency" } else { "" });
        let mut shares = format!("{:<11}", "");
        for (bound, n) in names.iter().zip(counts) {
            let share = format!("{}%", n * 100 / total);
            let w = bound.chars().count().max(share.len()) + 1;
            bounds.push_str(&format!("{bound:<w$}"));
            shares.push_str(&format!("{share:<w$}"));
        }
        lines.push(Line::styled(bounds, Style::new().dark_gray()));
        lines.push(Line::raw(shares));
    }
    lines
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
        spans.extend([
            key("<↑↓/jk>"),
            Span::raw(" select  "),
            key("<tab>"),
            Span::raw(" pane  "),
            key("</>"),
            Span::raw(" filter  "),
        ]);
        if !app.readonly {
            spans.extend([key("<r>"), Span::raw(" release  ")]);
        }
        spans.extend([
            key("<?>"),
            Span::raw(" help  "),
            key("<q>"),
            Span::raw(" quit"),
        ]);
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
    let mut rows = vec![
        ("↑ ↓  j k", "move the selection"),
        ("PgUp PgDn  g G", "page, first, last"),
        ("Tab  Shift-Tab", "next, previous pane"),
        ("/", "filter by service, instance or rule"),
        ("Esc", "back: close, clear the filter"),
        ("?", "this help"),
        ("q  Ctrl-C", "quit"),
    ];
    if app.readonly {
        rows.push(("", "read-only: release is disabled"));
    } else {
        rows.push(("r", "release the selected fuse or limit"));
        rows.push(("", "(asks first; the default is No)"));
    }
    let lines: Vec<Line<'_>> = rows
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
    use super::*;

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
