//! How a diagnostic is shown: the snippet and its `file:line:col` header
//! name the primary label, the thing to change.
//!
//! miette sorts labels by offset and heads each snippet with its first
//! label's position when the labels are too far apart for one snippet. A
//! diagnostic whose context label (the `capacity` or `latency` line that
//! explains it) comes before the setting to change would then be headed by
//! the context line, and editors and CI annotate the untouched line.
//! [`Focused`] keeps in the snippet only the labels near the primary one
//! and turns the others into notes after it, so the first header always
//! names the primary label. [`position`] gives the 1-based line and column
//! of a span as that header shows them.

use std::fmt;

use miette::{Diagnostic, LabeledSpan, Severity, SourceCode, SourceSpan};

/// A diagnostic shown with its primary label first (see the module doc).
pub struct Focused<'a> {
    inner: &'a dyn Diagnostic,
    labels: Vec<LabeledSpan>,
    notes: Vec<Note>,
}

/// A context label too far from the primary label to share its snippet.
#[derive(Debug)]
struct Note {
    message: String,
    label: LabeledSpan,
}

/// Labels this many lines or fewer away from the primary label share its
/// snippet (miette shows one line of context on each side, and merges
/// snippets that touch).
const NEAR_LINES: usize = 2;

// === impl Focused ===

impl<'a> Focused<'a> {
    pub fn new(inner: &'a dyn Diagnostic) -> Self {
        let labels: Vec<LabeledSpan> = inner.labels().map(Iterator::collect).unwrap_or_default();
        let Some(source) = inner.source_code() else {
            return Focused {
                inner,
                labels,
                notes: Vec::new(),
            };
        };
        let Some(primary) = labels
            .iter()
            .find(|l| l.primary())
            .or_else(|| labels.first())
            .cloned()
        else {
            return Focused {
                inner,
                labels,
                notes: Vec::new(),
            };
        };
        let Some((first, last)) = lines(source, primary.inner()) else {
            return Focused {
                inner,
                labels,
                notes: Vec::new(),
            };
        };
        let (mut near, mut notes) = (Vec::new(), Vec::new());
        for label in labels {
            let far = lines(source, label.inner())
                .is_some_and(|(from, to)| from > last + NEAR_LINES || to + NEAR_LINES < first);
            if far {
                let message = label.label().unwrap_or("see here").to_owned();
                let bare = LabeledSpan::new_with_span(None, *label.inner());
                notes.push(Note {
                    message,
                    label: bare,
                });
            } else {
                near.push(label);
            }
        }
        Focused {
            inner,
            labels: near,
            notes,
        }
    }
}

impl fmt::Debug for Focused<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.inner, f)
    }
}

impl fmt::Display for Focused<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.inner, f)
    }
}

impl std::error::Error for Focused<'_> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

impl Diagnostic for Focused<'_> {
    fn code<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        self.inner.code()
    }

    fn severity(&self) -> Option<Severity> {
        self.inner.severity()
    }

    fn help<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        self.inner.help()
    }

    fn url<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        self.inner.url()
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.inner.source_code()
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() {
            None
        } else {
            Some(Box::new(self.labels.iter().cloned()))
        }
    }

    fn related<'b>(&'b self) -> Option<Box<dyn Iterator<Item = &'b dyn Diagnostic> + 'b>> {
        let notes = self.notes.iter().map(|n| n as &dyn Diagnostic);
        match self.inner.related() {
            Some(related) => Some(Box::new(notes.chain(related))),
            None if self.notes.is_empty() => None,
            None => Some(Box::new(notes)),
        }
    }

    fn diagnostic_source(&self) -> Option<&dyn Diagnostic> {
        self.inner.diagnostic_source()
    }
}

// === impl Note ===

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Note {}

impl Diagnostic for Note {
    fn severity(&self) -> Option<Severity> {
        Some(Severity::Advice)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(std::iter::once(self.label.clone())))
    }
}

/// The 1-based line and column where `span` starts, as miette's header
/// shows them (columns count UTF-8 bytes), or `None` when the span is not
/// in `source`.
pub fn position(source: &dyn SourceCode, span: &SourceSpan) -> Option<(usize, usize)> {
    let at = SourceSpan::new(span.offset().into(), 0);
    let contents = source.read_span(&at, 0, 0).ok()?;
    Some((contents.line() + 1, contents.column() + 1))
}

/// The first and last line of `span`.
fn lines(source: &dyn SourceCode, span: &SourceSpan) -> Option<(usize, usize)> {
    let (first, _) = position(source, span)?;
    let end = span.offset() + span.len().saturating_sub(1);
    let (last, _) = position(source, &SourceSpan::new(end.into(), 0))?;
    Some((first, last))
}
