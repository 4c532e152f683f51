//! The keys of the main screen, listed once: what each does
//! ([`App`](crate::app::App) reads it from here), how the help popup names
//! it and the footer's hint for it. A key added here is handled, helped and
//! hinted, or it is not in the TUI at all.

use ratatui::crossterm::event::KeyCode;

/// What a key does on the main screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// Moves the selection by this many rows (`isize::MIN`/`MAX`: first,
    /// last).
    Move(isize),
    NextPane,
    PreviousPane,
    Filter,
    /// Back: clears the filter.
    Back,
    /// Releases the selected fuse or limit (asks first).
    Release,
    Help,
    Quit,
}

/// One line of the help: keys with the commands they run, as the help
/// names them, and the footer's hint when the footer shows one.
pub(crate) struct Binding {
    pub keys: &'static [(KeyCode, Command)],
    /// The keys as the help names them.
    pub names: &'static str,
    pub help: &'static str,
    /// A second line of the help under this one.
    pub note: Option<&'static str>,
    /// The footer's hint: the keys, then what they do.
    pub hint: Option<(&'static str, &'static str)>,
    /// The binding writes to the control plane: off in `--readonly`, where
    /// the help says so instead (`readonly`) and the footer says nothing.
    pub writes: Option<&'static str>,
}

/// The main screen's keys, in the help's order (and the footer's, for the
/// bindings with a hint). Ctrl-C quits from every screen, before these.
pub(crate) const MAIN: &[Binding] = &[
    Binding {
        keys: &[
            (KeyCode::Up, Command::Move(-1)),
            (KeyCode::Char('k'), Command::Move(-1)),
            (KeyCode::Down, Command::Move(1)),
            (KeyCode::Char('j'), Command::Move(1)),
        ],
        names: "↑ ↓  j k",
        help: "move the selection",
        note: None,
        hint: Some(("<↑↓/jk>", "select")),
        writes: None,
    },
    Binding {
        keys: &[
            (KeyCode::PageUp, Command::Move(-10)),
            (KeyCode::PageDown, Command::Move(10)),
            (KeyCode::Home, Command::Move(isize::MIN)),
            (KeyCode::Char('g'), Command::Move(isize::MIN)),
            (KeyCode::End, Command::Move(isize::MAX)),
            (KeyCode::Char('G'), Command::Move(isize::MAX)),
        ],
        names: "PgUp PgDn  g G",
        help: "page, first, last",
        note: None,
        hint: None,
        writes: None,
    },
    Binding {
        keys: &[
            (KeyCode::Tab, Command::NextPane),
            (KeyCode::BackTab, Command::PreviousPane),
        ],
        names: "Tab  Shift-Tab",
        help: "next, previous pane",
        note: None,
        hint: Some(("<tab>", "pane")),
        writes: None,
    },
    Binding {
        keys: &[(KeyCode::Char('/'), Command::Filter)],
        names: "/",
        help: "filter by service, instance or rule",
        note: None,
        hint: Some(("</>", "filter")),
        writes: None,
    },
    Binding {
        keys: &[(KeyCode::Esc, Command::Back)],
        names: "Esc",
        help: "back: close, clear the filter",
        note: None,
        hint: None,
        writes: None,
    },
    Binding {
        keys: &[(KeyCode::Char('r'), Command::Release)],
        names: "r",
        help: "release the selected fuse or limit",
        note: Some("(asks first; the default is No)"),
        hint: Some(("<r>", "release")),
        writes: Some("read-only: release is disabled"),
    },
    Binding {
        keys: &[(KeyCode::Char('?'), Command::Help)],
        names: "?",
        help: "this help",
        note: None,
        hint: Some(("<?>", "help")),
        writes: None,
    },
    Binding {
        keys: &[(KeyCode::Char('q'), Command::Quit)],
        names: "q  Ctrl-C",
        help: "quit",
        note: None,
        hint: Some(("<q>", "quit")),
        writes: None,
    },
];

/// The command `code` runs on the main screen.
pub(crate) fn command(code: KeyCode) -> Option<Command> {
    MAIN.iter()
        .flat_map(|b| b.keys)
        .find(|(k, _)| *k == code)
        .map(|(_, c)| *c)
}

/// The help's lines (keys, what they do) for a TUI that may write or not.
pub(crate) fn help(readonly: bool) -> Vec<(&'static str, &'static str)> {
    let mut rows = Vec::new();
    for b in MAIN {
        match b.writes {
            Some(off) if readonly => rows.push(("", off)),
            _ => {
                rows.push((b.names, b.help));
                rows.extend(b.note.map(|n| ("", n)));
            }
        }
    }
    rows
}

/// The footer's hints (keys, what they do) for a TUI that may write or not.
pub(crate) fn hints(readonly: bool) -> impl Iterator<Item = (&'static str, &'static str)> {
    MAIN.iter()
        .filter(move |b| !(readonly && b.writes.is_some()))
        .filter_map(|b| b.hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No key runs two commands, and every command has a key.
    #[test]
    fn every_key_runs_one_command_and_every_command_has_a_key() {
        let keys: Vec<KeyCode> = MAIN.iter().flat_map(|b| b.keys).map(|(k, _)| *k).collect();
        for (i, k) in keys.iter().enumerate() {
            assert!(!keys[i + 1..].contains(k), "{k:?} is bound twice");
        }
        for c in [
            Command::Move(1),
            Command::NextPane,
            Command::PreviousPane,
            Command::Filter,
            Command::Back,
            Command::Release,
            Command::Help,
            Command::Quit,
        ] {
            assert!(
                MAIN.iter().flat_map(|b| b.keys).any(|(_, x)| *x == c),
                "{c:?} has no key"
            );
        }
    }

    /// The read-only help says release is off, and the footer does not
    /// offer it.
    #[test]
    fn read_only_says_release_is_off() {
        assert!(help(true).contains(&("", "read-only: release is disabled")));
        assert!(!help(true).iter().any(|(k, _)| *k == "r"));
        assert!(!hints(true).any(|(k, _)| k == "<r>"));
        assert!(hints(false).any(|(k, _)| k == "<r>"));
    }
}
