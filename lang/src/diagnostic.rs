//! Syntax errors as miette diagnostics.
//!
//! Pest reports the furthest position it reached and the rules it tried
//! there. [`SyntaxError::from_pest`] rewords those rules through
//! [`describe_rule`] (the model is tera's `renamed_rules`), points a label at
//! the offending token, and adds a help line when the mistake is a common one:
//! a misspelt keyword, a number without its unit, single quotes, an unclosed
//! block.

use std::fmt;
use std::sync::Arc;

use miette::{Diagnostic, LabeledSpan, NamedSource, SourceCode};
use pest::error::{ErrorVariant, InputLocation};

use crate::ast::Span;
use crate::grammar::{Rule, is_reserved, statement_words};
use crate::scan::{MAX_EXPR_TERMS, MAX_NESTING, code_bytes};

mod expected;

use self::expected::*;

/// A `.gov` file that cannot be parsed.
///
/// The details are boxed so that `Result<_, SyntaxError>` stays small.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.message)]
pub struct SyntaxError(Box<Details>);

#[derive(Debug)]
struct Details {
    message: String,
    help: Option<String>,
    span: Span,
    labels: Vec<LabeledSpan>,
    source_code: NamedSource<Arc<str>>,
}

impl Diagnostic for SyntaxError {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new("gov::syntax"))
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.0
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.0.source_code)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.0.labels.is_empty() {
            None
        } else {
            Some(Box::new(self.0.labels.iter().cloned()))
        }
    }
}

// === impl SyntaxError ===

impl SyntaxError {
    /// What went wrong, in words.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The offending text (empty at the end of the input or for an oversize file).
    pub fn span(&self) -> Span {
        self.0.span
    }

    /// The advice, if any.
    pub fn help_text(&self) -> Option<&str> {
        self.0.help.as_deref()
    }

    fn new(name: &str, src: &str, message: String, span: Span, label: String) -> Self {
        SyntaxError(Box::new(Details {
            message,
            help: None,
            span,
            labels: vec![LabeledSpan::new_primary_with_span(Some(label), span)],
            source_code: NamedSource::new(name, Arc::from(src)),
        }))
    }

    /// Shows the error in `src` (shared by every error of one file).
    pub(crate) fn with_source(mut self, name: &str, src: Arc<str>) -> Self {
        self.0.source_code = NamedSource::new(name, src);
        self
    }

    fn with_help(mut self, help: impl Into<String>) -> Self {
        self.0.help = Some(help.into());
        self
    }

    pub(crate) fn too_large(name: &str, len: usize, max: usize) -> Self {
        SyntaxError(Box::new(Details {
            message: format!("`{name}` is too large: {len} bytes, the limit is {max} bytes"),
            help: Some("split the policy into several files".to_owned()),
            span: Span::default(),
            labels: Vec::new(),
            // The text is not kept: it is not shown and could be huge.
            source_code: NamedSource::new(name, Arc::from("")),
        }))
    }

    pub(crate) fn too_deep(name: &str, src: &str, span: Span) -> Self {
        SyntaxError::new(
            name,
            src,
            format!("parentheses are nested more than {MAX_NESTING} deep"),
            span,
            "too deep".to_owned(),
        )
        .with_help("name parts of the expression with `match` and refer to them by name")
    }

    pub(crate) fn too_many_terms(name: &str, src: &str, span: Span) -> Self {
        SyntaxError::new(
            name,
            src,
            format!("match expression has more than {MAX_EXPR_TERMS} terms"),
            span,
            "one term too many".to_owned(),
        )
        .with_help("split the expression into several named matches")
    }

    pub(crate) fn number_too_large(name: &str, src: &str, span: Span) -> Self {
        let text = src.get(span.start..span.end).unwrap_or("");
        SyntaxError::new(
            name,
            src,
            format!("number `{text}` is too large"),
            span,
            "too large".to_owned(),
        )
        .with_help("numbers must fit in 64 bits")
    }

    /// A duration token the grammar let through that does not read as one
    /// (`2.5ms`, too large): the message and help of duration flags.
    pub(crate) fn duration(
        name: &str,
        src: &str,
        span: Span,
        error: &gov_common::duration::DurationError,
    ) -> Self {
        let help = miette::Diagnostic::help(error).map(|h| h.to_string());
        let e = SyntaxError::new(
            name,
            src,
            error.to_string(),
            span,
            "this duration".to_owned(),
        );
        match help {
            Some(help) => e.with_help(help),
            None => e,
        }
    }

    pub(crate) fn instant(
        name: &str,
        src: &str,
        span: Span,
        error: &gov_common::instant::InstantError,
    ) -> Self {
        let help = miette::Diagnostic::help(error).map(|h| h.to_string());
        let e = SyntaxError::new(
            name,
            src,
            error.to_string(),
            span,
            "this instant".to_owned(),
        );
        match help {
            Some(help) => e.with_help(help),
            None => e,
        }
    }

    pub(crate) fn internal(name: &str, src: &str, span: Span) -> Self {
        SyntaxError::new(
            name,
            src,
            "internal parser error".to_owned(),
            span,
            "the parser did not expect this".to_owned(),
        )
        .with_help("this is a bug in govc; please report it with this file")
    }

    pub(crate) fn from_pest(name: &str, src: &str, err: pest::error::Error<Rule>) -> Self {
        let pos = match err.location {
            InputLocation::Pos(p) => p,
            InputLocation::Span((s, _)) => s,
        };
        let pos = pos.min(src.len());
        SyntaxError::from_pest_at(name, src, pos, err.variant)
    }

    fn from_pest_at(name: &str, src: &str, pos: usize, variant: ErrorVariant<Rule>) -> Self {
        match variant {
            ErrorVariant::CustomError { message } => {
                let span = Span::new(pos, pos);
                SyntaxError::new(
                    name,
                    src,
                    format!("the policy is too complex to parse ({message})"),
                    span,
                    "here".into(),
                )
                .with_help("simplify or split the policy")
            }
            ErrorVariant::ParsingError {
                positives,
                negatives,
            } => {
                let expected = Expected::from_rules(&positives);
                let found = Token::at(src, pos);
                if positives.is_empty() && !negatives.is_empty() {
                    let message = format!("unexpected {}", found.describe());
                    return SyntaxError::new(
                        name,
                        src,
                        message,
                        found.span,
                        "not allowed here".into(),
                    );
                }
                unexpected(name, src, &expected, &found)
            }
        }
    }
}

/// The error for "expected X, found Y", with the help that fits.
fn unexpected(name: &str, src: &str, expected: &Expected, found: &Token<'_>) -> SyntaxError {
    let list = expected.list();
    // A string that is the problem itself gets its own message.
    if expected.has_phrase(STRING)
        && found.text.starts_with('"')
        && let Some(err) = bad_string(name, src, found)
    {
        return err;
    }
    if found.is_end()
        && expected.has_word("}")
        && let Some(open) = unclosed_brace(src)
    {
        let message = "the file ends inside a block: a `{` is never closed".to_owned();
        let label = "this `{` has no matching `}`".to_owned();
        return SyntaxError::new(name, src, message, open, label)
            .with_help("add `}` to close the block");
    }
    if let Some(err) = non_ascii_letter(name, src, expected, found) {
        return err;
    }
    let reserved = found.is_word() && expected.has_phrase(NAME) && is_reserved(found.text);
    let message = if reserved {
        format!("expected {list}, found the reserved word `{}`", found.text)
    } else {
        format!("expected {list}, found {}", found.describe())
    };
    let label = if found.is_end() {
        "the file ends here".to_owned()
    } else {
        expected.short()
    };
    let mut err = SyntaxError::new(name, src, message, found.span, label);
    err.0.help = help(expected, found);
    if reserved {
        let role = if statement_words().contains(&found.text) {
            "it starts a statement"
        } else {
            "it starts or joins a match expression"
        };
        err.0.help = Some(format!(
            "`{}` is a reserved word ({role}) and cannot be a name: choose another name",
            found.text
        ));
    }
    if let Some(help) = out_of_order(src, found) {
        err.0.help = Some(help);
    }
    // A statement keyword where the block could still close: its `}` is
    // probably lost. Show the `{` that is not closed.
    if found.is_word()
        && statement_words().contains(&found.text)
        && !reserved
        && expected.has_word("}")
        && let Some(open) = src
            .get(..found.span.start)
            .and_then(|before| unclosed(before, b'{', b'}'))
    {
        let (line, block) = opened_by(src, open.start);
        err.0.labels[0] = LabeledSpan::new_primary_with_span(
            Some("a `}` is missing before this".to_owned()),
            found.span,
        );
        err.0.labels.push(LabeledSpan::new_with_span(
            Some("this `{` is not closed".to_owned()),
            open,
        ));
        let opened = match block {
            Some(kw) => format!("the `{kw}` block opened on line {line}"),
            None => format!("the block opened on line {line}"),
        };
        let what = if matches!(found.text, "service" | "registry") {
            "definition"
        } else {
            "statement"
        };
        err.0.help = Some(format!(
            "`{}` starts a new {what}, but {opened} is not closed: add `}}` before `{}`",
            found.text, found.text
        ));
    }
    // A group still open where `)` would fit: show where it started.
    if expected.has_word(")")
        && let Some(open) = src
            .get(..found.span.start)
            .and_then(|before| unclosed(before, b'(', b')'))
    {
        let label = "this `(` is not closed".to_owned();
        err.0
            .labels
            .push(LabeledSpan::new_with_span(Some(label), open));
        err.0
            .help
            .get_or_insert_with(|| "add `)` to close the group".to_owned());
    }
    err
}

/// A letter outside ASCII, in or where a name or keyword should be.
fn non_ascii_letter(
    name: &str,
    src: &str,
    expected: &Expected,
    found: &Token<'_>,
) -> Option<SyntaxError> {
    let c = found.text.chars().next()?;
    if c.is_ascii() || !c.is_alphabetic() {
        return None;
    }
    let before = src.get(..found.span.start).unwrap_or("");
    let start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .map_or(0, |i| i + 1);
    let after = src.get(found.span.start..).unwrap_or("");
    let len = after
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(after.len());
    let word = src.get(start..found.span.start + len).unwrap_or(found.text);
    let message = if start < found.span.start || len > c.len_utf8() {
        format!("`{word}` contains `{c}`, which is not an ASCII letter")
    } else {
        format!("expected {}, found `{c}`", expected.list())
    };
    Some(
        SyntaxError::new(name, src, message, found.span, "not an ASCII letter".into()).with_help(
            format!(
                "names and keywords are ASCII letters, digits, `_` and `-` only: replace `{c}`"
            ),
        ),
    )
}

/// Statements whose options come in a fixed order: the first word, how the
/// statement reads, and the words of its options.
const ORDERED: [(&str, &str, &[&str]); 3] = [
    (
        "ready",
        "ready when http METHOD \"PATH\" is STATUS every D [after D] [timeout D]",
        &["every", "after", "timeout"],
    ),
    (
        "trip",
        "trip when METRIC OP VALUE over D [slower than D] [min_calls N]",
        &["over", "slower", "min_calls"],
    ),
    ("recover", "recover after D probe N", &["after", "probe"]),
];

/// The help for an option of a statement written out of its order: `found`
/// is one of the options of the statement its line starts with.
fn out_of_order(src: &str, found: &Token<'_>) -> Option<String> {
    if !found.is_word() {
        return None;
    }
    let line_start = src
        .get(..found.span.start)?
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = src.get(line_start..found.span.start)?;
    let first = line.split_whitespace().next()?;
    let (_, shape, options) = ORDERED.iter().find(|(word, ..)| *word == first)?;
    options
        .contains(&found.text)
        .then(|| format!("the parts of a `{first}` statement come in a fixed order: `{shape}`"))
}

/// The line (1-based) of the `{` at `open`, and the keyword that starts the
/// statement it opens (`bulkhead`, `service`...), if the line starts with one.
fn opened_by(src: &str, open: usize) -> (usize, Option<&str>) {
    let before = src.get(..open).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let keyword = before
        .get(line_start..)
        .and_then(|l| l.split_whitespace().next())
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
    (line, keyword)
}

/// An unterminated string or an unknown escape.
fn bad_string(name: &str, src: &str, found: &Token<'_>) -> Option<SyntaxError> {
    let text = found.text;
    let mut chars = text.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                let next = chars.next();
                if !matches!(next, Some((_, '"' | '\\'))) {
                    let len = next.map_or(1, |(_, n)| 1 + n.len_utf8());
                    let at = found.span.start + i;
                    let span = Span::new(at, at + len);
                    let esc = src.get(span.start..span.end).unwrap_or("\\");
                    return Some(
                        SyntaxError::new(
                            name,
                            src,
                            format!("unknown escape `{esc}` in a string"),
                            span,
                            "unknown escape".into(),
                        )
                        .with_help("strings know only the escapes `\\\"` and `\\\\`"),
                    );
                }
            }
            '"' => return None,
            _ => {}
        }
    }
    let span = Span::new(found.span.start, found.span.start + 1);
    Some(
        SyntaxError::new(
            name,
            src,
            "this string is never closed".to_owned(),
            span,
            "the string starts here".into(),
        )
        .with_help("a string ends on the line where it starts: add the closing `\"`"),
    )
}

/// The help line for common mistakes.
fn help(expected: &Expected, found: &Token<'_>) -> Option<String> {
    let text = found.text;
    let numeric = text.strip_prefix('-').unwrap_or(text);
    let starts_with_digit = numeric.starts_with(|c: char| c.is_ascii_digit());
    let all_digits = !numeric.is_empty() && numeric.bytes().all(|b| b.is_ascii_digit());
    if expected.has_phrase(DURATION) && starts_with_digit {
        return Some(if all_digits {
            // The words of a duration flag without a unit.
            let no_unit = gov_common::duration::DurationError::NoUnit(numeric.to_owned());
            miette::Diagnostic::help(&no_unit).map_or_else(String::new, |h| h.to_string())
        } else {
            "a duration is a number (a decimal fraction is allowed) followed directly by `ms`, `s`, `m` (or `min`) or `h`, as in `10ms` or `1.5s`".to_owned()
        });
    }
    if expected.has_phrase(SIZE) && starts_with_digit {
        return Some(
            "sizes need a unit: `B`, `kB`, `MB`, `GB`, `KiB`, `MiB` or `GiB`, as in `10MiB`"
                .to_owned(),
        );
    }
    if expected.has_phrase(PERCENT) && starts_with_digit {
        if let Some((_, decimals)) = numeric.trim_end_matches('%').split_once('.')
            && decimals.len() > 3
        {
            return Some("a percentage has at most three decimals, as in `12.125%`".to_owned());
        }
        if !text.ends_with('%') {
            // `0.3` is a ratio: the percentage meant is 30%, not 0.3%.
            if let Some(percent) = ratio_as_percent(numeric) {
                return Some(format!(
                    "write a ratio as a percentage: `{numeric}` is `{percent}%`"
                ));
            }
            return Some(format!("percentages end with `%`, as in `{numeric}%`"));
        }
    }
    if expected.has_phrase(INT) && starts_with_digit && !all_digits {
        return Some("write a whole number without a unit or decimals".to_owned());
    }
    if expected.has_phrase(STRING) && (text.starts_with('\'') || text.starts_with('`')) {
        return Some("strings use double quotes, as in `\"/orders\"`".to_owned());
    }
    if expected.has_phrase(STRING) && (found.is_word() || text.starts_with('/')) {
        return Some(format!("write text in double quotes, as in `\"{text}\"`"));
    }
    if found.is_word()
        && let Some(word) = did_you_mean(text, &expected.words)
    {
        return Some(format!("did you mean `{word}`?"));
    }
    if expected.has_phrase(DURATION) && found.is_word() {
        return Some("write a duration as a number and a unit, as in `1s` or `1m`".to_owned());
    }
    if expected.has_phrase(NAME) && text.starts_with('"') {
        let bare = text.trim_matches('"');
        return Some(format!("names are written without quotes, as in `{bare}`"));
    }
    // A value left out: the next statement, the block's end or the file's
    // end comes where it belongs.
    let value = [INT, DURATION, SIZE, PERCENT, STRING, NAME]
        .iter()
        .any(|v| expected.has_phrase(v));
    let next = found.is_end() || text == "}" || statement_words().contains(&text);
    if value && next && !expected.has_phrase(MATCH) {
        let before = if found.is_end() {
            "the end of the file".to_owned()
        } else {
            format!("`{text}`")
        };
        return Some(format!(
            "the value is missing: write {} before {before}",
            expected.list()
        ));
    }
    if expected.has_phrase(MATCH) {
        return Some(
            "a match expression is a match name, `any`, or conditions such as `path prefix \"/api\"`, `method GET`, `header \"x-tenant\" = \"gold\"`, `consumer \"crm\"` or `calls to inventory`, joined with `and` and `or`"
                .to_owned(),
        );
    }
    if expected.has_word(">=") && matches!(text, "=" | "==" | "<" | "<=") {
        return Some("a trip condition compares with `>` or `>=`, as in `errors >= 10`".to_owned());
    }
    if expected.has_word("prefix") && expected.has_word("exact") && text.starts_with('"') {
        return Some(format!(
            "say how the path matches: `path prefix {text}` (the path and everything below it) or `path exact {text}`"
        ));
    }
    if expected.has_word("batch") && expected.has_word("exact") {
        return Some(
            "`sync exact` counts every call in the shared store; `sync batch D` flushes local counts every D, as in `sync batch 100ms`"
                .to_owned(),
        );
    }
    if expected.has_word("allow") && expected.has_word("reject") {
        return Some(
            "a `sync exact` call the store does not answer within `timeout` is counted by this agent alone (`fallback local`), refused (`fallback reject`) or admitted (`fallback allow`)"
                .to_owned(),
        );
    }
    if text == "}" && expected.has_word("service") {
        return Some(
            "this `}` closes nothing: remove it, or look for a `{` missing above".to_owned(),
        );
    }
    None
}

/// `0.3` -> `30`, `0.125` -> `12.5`, `0.05` -> `5`: a ratio below 1 written
/// as a decimal, as a percentage. `None` for anything else.
fn ratio_as_percent(text: &str) -> Option<String> {
    let decimals = text.strip_prefix("0.")?;
    if decimals.is_empty() || !decimals.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let padded = format!("{decimals:0<2}");
    let (whole, fraction) = padded.split_at(2);
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    let fraction = fraction.trim_end_matches('0');
    Some(if fraction.is_empty() {
        whole.to_owned()
    } else {
        format!("{whole}.{fraction}")
    })
}

/// The closest expected keyword, if one is close enough to be a typo.
fn did_you_mean<'a>(found: &str, words: &'a [String]) -> Option<&'a str> {
    words
        .iter()
        .filter(|w| w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(|w| (strsim::damerau_levenshtein(found, w), w))
        .filter(|(d, w)| *d <= (w.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, w)| w.as_str())
}

/// The last `{` without its `}`.
fn unclosed_brace(src: &str) -> Option<Span> {
    unclosed(src, b'{', b'}')
}

/// The last `open` in `src` without its `close`.
fn unclosed(src: &str, open: u8, close: u8) -> Option<Span> {
    let mut stack = Vec::new();
    for (pos, b) in code_bytes(src) {
        if b == open {
            stack.push(pos);
        } else if b == close {
            stack.pop();
        }
    }
    stack.last().map(|&p| Span::new(p, p + 1))
}
