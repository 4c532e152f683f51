//! Error recovery: which part of the text to skip after a syntax error.
//!
//! Pest stops at the first error. To report the others, the parser blanks
//! out the region that holds the error (spaces, newlines kept, so every
//! offset stays the same) and parses again. Regions follow the layout that
//! `govc fmt` writes: a statement starts its own line, indented, with a
//! keyword (`bulkhead`, `limit`, ...); an item starts at column 0 with
//! `service` or `registry`. A statement's region runs to the next statement
//! at its indentation or less; an item's to the next item. Text laid out
//! otherwise (a whole service on one line) falls back to the item.

use std::ops::Range;

/// Words that start a statement inside a service.
const STATEMENT_KEYWORDS: [&str; 10] = [
    "domain", "registry", "consumer", "capacity", "match", "bulkhead", "limit", "fuse", "warmup",
    "shutdown",
];

/// Words that start an item at column 0.
const ITEM_KEYWORDS: [&str; 2] = ["service", "registry"];

/// One line of the text, as recovery sees it.
#[derive(Clone, Copy)]
struct Line<'s> {
    start: usize,
    indent: usize,
    /// The offset of the first token.
    first: usize,
    /// The first word, empty if the line starts with something else.
    word: &'s str,
    /// Empty, only whitespace or only a comment.
    blank: bool,
    /// Starts with `}`.
    closing: bool,
}

impl<'s> Line<'s> {
    fn at(src: &'s str, start: usize) -> Self {
        let rest = src.get(start..).unwrap_or("");
        let rest = rest.split('\n').next().unwrap_or("");
        let indent = rest.len() - rest.trim_start_matches([' ', '\t']).len();
        let body = rest.get(indent..).unwrap_or("");
        let word_len = if body.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            body.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(body.len())
        } else {
            0
        };
        let trimmed = body.trim_end();
        Line {
            start,
            indent,
            first: start + indent,
            word: body.get(..word_len).unwrap_or(""),
            blank: trimmed.is_empty() || trimmed.starts_with('#'),
            closing: trimmed.starts_with('}'),
        }
    }

    fn is_statement(&self) -> bool {
        self.indent > 0 && STATEMENT_KEYWORDS.contains(&self.word)
    }

    fn is_item(&self) -> bool {
        self.indent == 0 && ITEM_KEYWORDS.contains(&self.word)
    }

    /// Column 0 and not blank: an item, or text at the top level.
    fn is_top(&self) -> bool {
        self.indent == 0 && !self.blank
    }
}

/// The start of the line that holds `pos`.
fn line_start(src: &str, pos: usize) -> usize {
    src.get(..pos)
        .and_then(|before| before.rfind('\n'))
        .map_or(0, |i| i + 1)
}

/// The start of the line after the one starting at `start`.
fn next_line(src: &str, start: usize) -> Option<usize> {
    let rest = src.get(start..)?;
    rest.find('\n').map(|i| start + i + 1)
}

/// The start of the line before the one starting at `start`.
fn prev_line(src: &str, start: usize) -> Option<usize> {
    (start > 0).then(|| line_start(src, start - 1))
}

/// The region to blank out for the error at `pos`.
pub(crate) fn region(src: &str, pos: usize) -> Range<usize> {
    statement_region(src, pos).unwrap_or_else(|| item_region(src, pos))
}

/// The statement inside a service that holds `pos`, if the layout shows one.
fn statement_region(src: &str, pos: usize) -> Option<Range<usize>> {
    let line = Line::at(src, line_start(src, pos));
    let at_first = pos <= line.first;
    if at_first && line.closing && line.indent == 0 {
        // The service's `}` came too early: its last statement is incomplete.
        let anchor = statement_before(src, line.start, usize::MAX)?;
        return Some(anchor.start..line.start);
    }
    if line.indent == 0 || line.blank {
        return None;
    }
    if at_first && line.is_statement() {
        // A statement that starts well: the one before it is incomplete.
        let anchor = statement_before(src, line.start, line.indent)?;
        return Some(anchor.start..line.start);
    }
    let anchor = if line.is_statement() {
        line
    } else {
        // A setting, a continuation line or a `}` belongs to the statement
        // above it; a line at statement level that is none of these is a
        // region itself.
        let max_indent = if line.closing {
            line.indent
        } else {
            line.indent - 1
        };
        statement_before(src, line.start, max_indent).unwrap_or(line)
    };
    Some(anchor.start..statement_end(src, line.start, anchor.indent))
}

/// Whether an error at `at`, found after `skipped` was blanked out for an
/// error at `last`, is a follow-on of that region rather than a new error:
/// it comes before the region's end, or it is the `}` right after it.
pub(crate) fn is_follow_on(src: &str, at: usize, last: usize, skipped: &Range<usize>) -> bool {
    if at < skipped.end.max(last + 1) {
        return true;
    }
    let line = Line::at(src, line_start(src, at));
    line.start == skipped.end && at <= line.first && line.closing
}

/// The nearest statement above the line at `start`, indented at most
/// `max_indent`, without leaving the item.
fn statement_before(src: &str, start: usize, max_indent: usize) -> Option<Line<'_>> {
    let mut cur = prev_line(src, start)?;
    loop {
        let line = Line::at(src, cur);
        if line.is_top() {
            return None;
        }
        if line.is_statement() && line.indent <= max_indent {
            return Some(line);
        }
        cur = prev_line(src, cur)?;
    }
}

/// Where the statement indented `indent` that holds the line at `start`
/// ends: at the next statement indented as much or less, or the next line
/// indented less (the service's `}`, the next item).
fn statement_end(src: &str, start: usize, indent: usize) -> usize {
    let mut cur = start;
    while let Some(next) = next_line(src, cur) {
        let line = Line::at(src, next);
        if !line.blank && (line.indent < indent || (line.is_statement() && line.indent <= indent)) {
            return next;
        }
        cur = next;
    }
    src.len()
}

/// The item (service or registry) that holds `pos`, from its first line to
/// the next item.
pub(crate) fn item_region(src: &str, pos: usize) -> Range<usize> {
    let line = Line::at(src, line_start(src, pos));
    if line.is_item() && pos <= line.first {
        // An item that starts well: the one before it is incomplete.
        let start = item_before(src, line.start).unwrap_or(line.start);
        return start..line.start;
    }
    let start = if line.is_top() {
        // The header of an item, or stray text at the top level.
        line.start
    } else {
        item_before(src, line.start).unwrap_or(line.start)
    };
    start..item_end(src, line.start)
}

/// The start of the item that holds `pos`: the nearest `service` or
/// `registry` at column 0 at or above its line, or 0.
pub(crate) fn item_start(src: &str, pos: usize) -> usize {
    let mut cur = line_start(src, pos);
    loop {
        if Line::at(src, cur).is_item() {
            return cur;
        }
        match prev_line(src, cur) {
            Some(prev) => cur = prev,
            None => return 0,
        }
    }
}

/// The start of the nearest line above `start` at column 0 that is not blank.
fn item_before(src: &str, start: usize) -> Option<usize> {
    let mut cur = prev_line(src, start)?;
    loop {
        if Line::at(src, cur).is_top() {
            return Some(cur);
        }
        cur = prev_line(src, cur)?;
    }
}

/// The start of the next item after the line at `start`, or the end. A
/// word at column 0 starts an item even if misspelt (`servce b {`), so that
/// its own error is reported.
fn item_end(src: &str, start: usize) -> usize {
    let mut cur = start;
    while let Some(next) = next_line(src, cur) {
        let line = Line::at(src, next);
        if line.indent == 0 && !line.word.is_empty() {
            return next;
        }
        cur = next;
    }
    src.len()
}

/// Replaces `range` of `text` with spaces, keeping newlines and every
/// offset. `range` must start and end on line boundaries or at the end.
pub(crate) fn blank(text: &mut String, range: Range<usize>) {
    let Some(old) = text.get(range.clone()) else {
        return;
    };
    let spaces: String = old
        .chars()
        .flat_map(|c| {
            let (fill, n) = if c == '\n' {
                ('\n', 1)
            } else {
                (' ', c.len_utf8())
            };
            std::iter::repeat_n(fill, n)
        })
        .collect();
    text.replace_range(range, &spaces);
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "service a {\n  capacity workers 4\n  bulkhead b on any {\n    max_concurrent x\n  }\n  limit l on any { calls 1 per 1s }\n}\nservice c {}\n";

    fn at(needle: &str) -> usize {
        SRC.find(needle).unwrap()
    }

    #[test]
    fn a_setting_takes_its_statement() {
        let r = region(SRC, at("x\n"));
        assert_eq!(
            &SRC[r],
            "  bulkhead b on any {\n    max_concurrent x\n  }\n"
        );
    }

    #[test]
    fn an_error_at_a_statement_start_takes_the_one_before() {
        let r = region(SRC, at("limit"));
        assert_eq!(
            &SRC[r],
            "  bulkhead b on any {\n    max_concurrent x\n  }\n"
        );
    }

    #[test]
    fn the_last_statement_stops_at_the_closing_brace() {
        let r = region(SRC, at("calls"));
        assert_eq!(&SRC[r], "  limit l on any { calls 1 per 1s }\n");
    }

    #[test]
    fn a_closing_brace_takes_the_statement_before() {
        let src = "service a {\n  capacity workers\n}\n";
        let r = region(src, src.rfind('}').unwrap());
        assert_eq!(&src[r], "  capacity workers\n");
        let src = "service a {\n  bulkhead b on any {\n    queue\n  }\n  domain \"d\"\n}\n";
        let r = region(src, src.find("  }").unwrap() + 2);
        assert_eq!(&src[r], "  bulkhead b on any {\n    queue\n  }\n");
    }

    #[test]
    fn an_item_runs_to_the_next_item() {
        let r = item_region(SRC, at("workers"));
        assert_eq!(&SRC[r], &SRC[..at("service c")]);
        let r = region(SRC, SRC.len());
        assert_eq!(&SRC[r], "service c {}\n");
    }

    #[test]
    fn blanking_keeps_offsets() {
        let mut text = "ab\ncé\nd".to_owned();
        blank(&mut text, 0..6);
        assert_eq!(text, "  \n   \nd");
    }
}
