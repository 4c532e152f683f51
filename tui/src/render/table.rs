//! Tables that fit their width: columns that shrink or drop by priority,
//! and only the visible rows built.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Span;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};

use crate::format::truncate;

use super::style::*;

/// The rows to build for a table of `len` rows in `area` (borders and header
/// excluded) so that `selected` is visible, and the selection within them.
pub(super) fn window(
    len: usize,
    selected: Option<usize>,
    area: Rect,
) -> (usize, usize, Option<usize>) {
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

pub(super) const fn col(header: &'static str, priority: u8) -> Column {
    Column {
        header,
        min: None,
        priority,
    }
}

pub(super) const fn shrinks(header: &'static str, min: u16, priority: u8) -> Column {
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
    pub(super) fn styled(text: impl Into<String>, style: Style) -> Self {
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
pub(super) fn fit(
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
pub(super) struct TableSpec<'a> {
    pub block: Block<'a>,
    pub columns: &'a [Column],
    pub rows: Vec<Vec<TextCell>>,
    /// Within `rows`.
    pub selected: Option<usize>,
    pub focused: bool,
    /// Shown instead of an empty table.
    pub empty: &'a str,
}

pub(super) fn render_table(frame: &mut Frame<'_>, area: Rect, spec: TableSpec<'_>) {
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
