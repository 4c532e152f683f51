//! The detail pane: the selected agent or rule.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, BorderType, Borders, Gauge, Paragraph, Sparkline, Wrap};

use crate::app::{App, Pane, Trip};
use crate::format::{ago, latency_bound, rate};
use gov_proto::rejections::LABELS;
use gov_proto::v1::{AgentView, ReleaseKind, RuleKind, RuleView, SourceRef, SyncState};

use super::panes::*;

// === detail ===

pub(super) fn render_detail(app: &App, frame: &mut Frame<'_>, area: Rect) {
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
pub(super) fn grpc_outcomes(counts: &[u64]) -> Option<String> {
    let seen: Vec<String> = gov_proto::grpc::CODES
        .iter()
        .zip(counts)
        .filter(|(_, n)| **n > 0)
        .map(|(code, n)| format!("{} {n}", gov_proto::grpc::name(*code)))
        .collect();
    (!seen.is_empty()).then(|| seen.join("  "))
}

pub(super) fn field(name: &str, value: impl Into<String>) -> Line<'static> {
    Line::from(vec![
        Span::styled(format!("{name:<11}"), Style::new().dark_gray()),
        Span::raw(value.into()),
    ])
}

pub(super) fn render_agent_detail(
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
    // Where its service's consumers come from, and whether this instance
    // verifies its callers (mutual TLS), as `govc status` shows them.
    if let Some(source) = app
        .view
        .as_ref()
        .and_then(|v| v.consumer_sources.get(&a.service))
    {
        lines.push(field("consumers", source.clone()));
    }
    if a.inbound_mtls {
        lines.push(field("inbound", "mutual TLS from agents"));
    }
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

pub(super) fn source_line(source: Option<&SourceRef>) -> String {
    match source {
        Some(s) if !s.file.is_empty() && s.line > 0 => format!("{}:{}", s.file, s.line),
        Some(s) if !s.file.is_empty() => s.file.clone(),
        _ => "-".into(),
    }
}

pub(super) fn render_rule_detail(
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
    for (reason, r) in LABELS.iter().zip(rates.by_reason) {
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

    render_in_flight(frame, gauge_area, stats.in_flight, stats.capacity);

    frame.render_widget(Paragraph::new(latency), latency_area);

    render_rejections(app, name, frame, spark_area);

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

/// Calls in flight: a gauge against the capacity, or the count alone.
fn render_in_flight(frame: &mut Frame<'_>, area: Rect, in_flight: u64, capacity: u64) {
    if capacity == 0 {
        frame.render_widget(field("in flight", in_flight.to_string()), area);
    } else {
        let ratio = (in_flight as f64 / capacity as f64).clamp(0.0, 1.0);
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
                .label(format!("in flight {}/{}", in_flight, capacity))
                .gauge_style(Style::new().fg(color).bg(Color::Black)),
            area,
        );
    }
}

/// The rule's rejections per second over the last five minutes.
fn render_rejections(app: &App, name: &str, frame: &mut Frame<'_>, area: Rect) {
    let samples: Vec<f64> = app.rejection_history(name).collect();
    let max = samples.iter().copied().fold(0.0, f64::max);
    let width = usize::from(area.width);
    // Rates are scaled to integers for the widget; its bars are relative anyway.
    let data: Vec<u64> = samples[samples.len().saturating_sub(width)..]
        .iter()
        .map(|v| (v * 100.0).round() as u64)
        .collect();
    let [spark_label, spark_bars] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(2)]).areas(area);
    frame.render_widget(
        Line::from(vec![
            Span::styled("rejections/s, last 5m", Style::new().dark_gray()),
            Span::raw(format!(" (max {})", rate(max))),
        ]),
        spark_label,
    );
    frame.render_widget(Sparkline::default().data(&data).red(), spark_bars);
}

/// Two lines: bucket bounds and the share of calls in each.
pub(super) fn latency_lines(buckets: &[u64]) -> Vec<Line<'static>> {
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
