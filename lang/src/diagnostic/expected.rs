//! What a syntax error says was expected at a place, and what was found there.

use crate::ast::Span;
use crate::grammar::{MATCH_WORDS, Rule, statement_words};

// === What was expected ===

pub(super) const DURATION: &str = "a duration such as `10ms`";
pub(super) const SIZE: &str = "a size such as `10MiB`";
pub(super) const PERCENT: &str = "a percentage such as `50%`";
pub(super) const FACTOR: &str = "a factor such as `2x`";
pub(super) const INSTANT: &str = "an instant such as `2026-12-31T00:00Z`";
pub(super) const INT: &str = "a whole number";
pub(super) const STRING: &str = "a string such as `\"/orders\"`";
pub(super) const MATCH: &str = "a match expression";
pub(super) const NAME: &str = "a name";

/// How a rule reads in "expected ...".
pub(super) enum Phrase {
    /// A keyword or a punctuation mark, printed in backticks.
    Word(String),
    /// A description, printed as is.
    Text(&'static str),
}

/// Rule names to phrases. Keywords (`kw_*`) read as themselves.
pub(super) fn describe_rule(rule: Rule) -> Vec<Phrase> {
    use Phrase::{Text, Word};
    let words = |ws: &[&str]| ws.iter().map(|w| Word((*w).to_owned())).collect();
    match rule {
        Rule::ident | Rule::match_ref => vec![Text(NAME)],
        Rule::string | Rule::string_body => vec![Text(STRING)],
        Rule::int | Rule::status_range => vec![Text(INT)],
        Rule::duration => vec![Text(DURATION)],
        Rule::size => vec![Text(SIZE)],
        Rule::percent => vec![Text(PERCENT)],
        Rule::factor => vec![Text(FACTOR)],
        Rule::instant => vec![Text(INSTANT)],
        Rule::compare_op => words(&[">", ">="]),
        Rule::lbrace => words(&["{"]),
        Rule::rbrace => words(&["}"]),
        Rule::lparen | Rule::group => words(&["("]),
        Rule::rparen => words(&[")"]),
        Rule::equals => words(&["="]),
        Rule::range_dots => words(&[".."]),
        Rule::EOI => vec![Text("end of input")],
        // Reported instead of its alternatives when nothing at all parsed.
        Rule::policy | Rule::file | Rule::item_probe => vec![
            Word("registry".to_owned()),
            Word("service".to_owned()),
            Text("end of input"),
        ],
        // Reported instead of its alternatives when a broken statement is
        // explained from its own start: a statement or the service's `}`.
        Rule::stmt_probe => statement_words()
            .iter()
            .filter(|w| **w != "service")
            .chain(&["consumer", "}"])
            .map(|w| Word((*w).to_owned()))
            .collect(),
        Rule::match_expr | Rule::and_expr => vec![Text(MATCH)],
        Rule::registry_setting => [
            Rule::kw_server_cache,
            Rule::kw_client_refresh,
            Rule::kw_balancer_refresh,
        ]
        .into_iter()
        .flat_map(describe_rule)
        .collect(),
        other => {
            let name = format!("{other:?}");
            match name.strip_prefix("kw_") {
                Some(word) => vec![Word(word.to_owned())],
                // Every other rule starts with a keyword and is never
                // reported itself; keep a readable fallback anyway.
                None => vec![Word(name.replace('_', " "))],
            }
        }
    }
}

/// The phrases of the rules pest tried at the error position.
pub(super) struct Expected {
    pub(super) words: Vec<String>,
    pub(super) texts: Vec<&'static str>,
}

/// The keywords that start a match atom (the match words less `and` and
/// `or`); when all are expected, "a match expression" says it better.
pub(super) fn is_match_starter(word: &str) -> bool {
    MATCH_WORDS.contains(&word) && !matches!(word, "and" | "or")
}

impl Expected {
    pub(super) fn from_rules(rules: &[Rule]) -> Self {
        let mut words: Vec<String> = Vec::new();
        let mut texts: Vec<&'static str> = Vec::new();
        for &rule in rules {
            for phrase in describe_rule(rule) {
                match phrase {
                    Phrase::Word(w) if !words.contains(&w) => words.push(w),
                    Phrase::Text(t) if !texts.contains(&t) => texts.push(t),
                    _ => {}
                }
            }
        }
        let starters = MATCH_WORDS.iter().filter(|w| is_match_starter(w));
        if starters.clone().all(|s| words.iter().any(|w| w == s)) {
            words.retain(|w| !is_match_starter(w) && w != "(");
            texts.retain(|t| *t != NAME);
            texts.insert(0, MATCH);
        }
        // Keywords in alphabetical order, then punctuation.
        words.sort_by_key(|w| (!w.starts_with(|c: char| c.is_ascii_alphabetic()), w.clone()));
        Expected { words, texts }
    }

    pub(super) fn has_word(&self, w: &str) -> bool {
        self.words.iter().any(|x| x == w)
    }

    pub(super) fn has_phrase(&self, t: &str) -> bool {
        self.texts.contains(&t)
    }

    pub(super) fn items(&self) -> Vec<String> {
        let mut items: Vec<String> = self.words.iter().map(|w| format!("`{w}`")).collect();
        items.extend(self.texts.iter().map(|t| (*t).to_owned()));
        items
    }

    /// "one of `a`, `b` or `c`"
    pub(super) fn list(&self) -> String {
        let items = self.items();
        match items.as_slice() {
            [] => "something else".to_owned(),
            [one] => one.clone(),
            [rest @ .., last] => {
                let prefix = if self.texts.is_empty() && items.len() > 2 {
                    "one of "
                } else {
                    ""
                };
                format!("{prefix}{} or {last}", rest.join(", "))
            }
        }
    }

    /// The label text: the list, or "not valid here" when the list is long.
    pub(super) fn short(&self) -> String {
        if self.items().len() <= 3 {
            format!("expected {}", self.list())
        } else {
            "not valid here".to_owned()
        }
    }
}

// === What was found ===

/// The token at the error position.
pub(super) struct Token<'s> {
    pub(super) text: &'s str,
    pub(super) span: Span,
}

impl<'s> Token<'s> {
    pub(super) fn at(src: &'s str, pos: usize) -> Self {
        let rest = src.get(pos..).unwrap_or("");
        let line = rest.split('\n').next().unwrap_or("").trim_end_matches('\r');
        let len = match line.chars().next() {
            None => 0,
            Some('"') => {
                // Up to the closing quote, or the line end.
                let mut end = line.len();
                let mut escaped = false;
                for (i, c) in line.char_indices().skip(1) {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => {
                            end = i + 1;
                            break;
                        }
                        _ => escaped = false,
                    }
                }
                end
            }
            Some('\'') => line[1..].find('\'').map_or(line.len(), |i| i + 2),
            // An unquoted path: up to the next space or delimiter.
            Some('/') => line
                .find(|c: char| c.is_whitespace() || "{}()=\"#".contains(c))
                .unwrap_or(line.len()),
            Some(c) if is_word_char(c) => {
                line.find(|c: char| !is_word_char(c)).unwrap_or(line.len())
            }
            Some(c) => c.len_utf8(),
        };
        let text = line.get(..len).unwrap_or("");
        if len == 0 {
            // At the end of the file, point at its last character: a label
            // past the last line would not show.
            let last = src.trim_end().char_indices().next_back();
            let span = last.map_or(Span::new(pos, pos), |(i, c)| Span::new(i, i + c.len_utf8()));
            return Token { text, span };
        }
        Token {
            text,
            span: Span::new(pos, pos + len),
        }
    }

    pub(super) fn is_end(&self) -> bool {
        self.text.is_empty()
    }

    pub(super) fn is_word(&self) -> bool {
        self.text
            .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    }

    pub(super) fn describe(&self) -> String {
        if self.is_end() {
            "the end of the file".to_owned()
        } else {
            format!("`{}`", self.text)
        }
    }
}

pub(super) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '%')
}
