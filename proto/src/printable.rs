//! Text that agents (or anyone who reaches govd) wrote, made safe to print
//! on a terminal: an instance name, an address, a label or an event reason
//! may hold `ESC[2J` (clear the screen), `ESC]0;...` (retitle the window),
//! `ESC[8m` (hide what follows) or a CR/LF that forges a row. Every reader
//! that prints such text (`govc status`, `govc audit`, the TUI) passes it
//! through [`printable`] (or [`view`] for a whole cluster view) first.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::v1 as pb;

/// `text` with every control character (C0 including ESC, CR, LF and TAB,
/// DEL, C1) and every bidirectional override written as a visible escape
/// (`\x1b`, `\r`, `\n`, `\t`, `\u{202e}`); the rest as it is. Borrowed when
/// there is nothing to escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x80 && needs_escape(c) => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Escapes, in place, every string of `view` that an agent supplied (or
/// that carries what an agent supplied: reasons, keys, who waits on whom).
pub fn view(view: &mut pb::ClusterView) {
    for a in &mut view.agents {
        for s in [
            &mut a.service,
            &mut a.instance,
            &mut a.address,
            &mut a.reason,
            &mut a.rule,
            &mut a.version,
            &mut a.last_good_version,
        ] {
            in_place(s);
        }
        for s in &mut a.removal_waiting_on {
            in_place(s);
        }
        a.labels = std::mem::take(&mut a.labels)
            .into_iter()
            .map(|(k, v)| (printable(&k).into_owned(), printable(&v).into_owned()))
            .collect();
    }
    for f in &mut view.fuses {
        in_place(&mut f.rule);
        in_place(&mut f.reason);
    }
    for l in &mut view.limits {
        in_place(&mut l.rule);
        in_place(&mut l.key);
        in_place(&mut l.reason);
    }
}

fn in_place(s: &mut String) {
    if let Cow::Owned(escaped) = printable(s) {
        *s = escaped;
    }
}

/// A character a terminal would act on rather than show.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escapes_and_line_breaks_are_shown_not_obeyed() {
        assert_eq!(printable("\u{1b}[2Jgone"), "\\x1b[2Jgone");
        assert_eq!(printable("\u{1b}]0;owned\u{7}"), "\\x1b]0;owned\\x07");
        assert_eq!(printable("\u{1b}[8mhidden"), "\\x1b[8mhidden");
        assert_eq!(printable("a\r\nfake row"), "a\\r\\nfake row");
        assert_eq!(printable("tab\there\u{7f}"), "tab\\there\\x7f");
        assert_eq!(printable("c1 \u{9b}2J"), "c1 \\u{9b}2J");
        assert_eq!(printable("\u{202e}txt.exe"), "\\u{202e}txt.exe");
        // Nothing to escape: the same text, not copied.
        assert!(matches!(
            printable("order-1 10.0.0.1:80 é"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn every_agent_supplied_string_of_a_view_is_escaped() {
        let mut v = pb::ClusterView {
            agents: vec![pb::AgentView {
                instance: "i\u{1b}[2J".into(),
                address: "a\n".into(),
                reason: "r\r".into(),
                labels: [("k\u{1b}".to_owned(), "v\u{1b}".to_owned())].into(),
                removal_waiting_on: vec!["w\u{1b}".into()],
                ..Default::default()
            }],
            limits: vec![pb::LimitView {
                key: "k\n".into(),
                reason: "x\u{1b}]0;".into(),
                ..Default::default()
            }],
            fuses: vec![pb::FuseView {
                reason: "f\u{1b}".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        view(&mut v);
        let text = format!("{v:?}");
        assert!(!text.contains("\\u{1b}"), "{text}");
        assert_eq!(v.agents[0].instance, "i\\x1b[2J");
        assert_eq!(v.agents[0].labels["k\\x1b"], "v\\x1b");
        assert_eq!(v.limits[0].reason, "x\\x1b]0;");
    }
}
