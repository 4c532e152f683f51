//! The colours and the pane frame every part of the screen shares.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, BorderType, Borders};

use crate::app::{App, Pane};

pub(super) const FOCUS: Color = Color::Cyan;
pub(super) const SELECTED: Style = Style::new().add_modifier(Modifier::REVERSED);
pub(super) fn pane_block(app: &App, pane: Pane, title: String) -> Block<'static> {
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

pub(super) fn count_title(name: &str, shown: usize, total: usize) -> String {
    if shown == total {
        format!("{name} ({total})")
    } else {
        format!("{name} ({shown}/{total})")
    }
}
