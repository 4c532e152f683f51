//! The pest parser generated from `gov.pest`. Its types never leave the crate:
//! `parser.rs` turns pairs into the syntax tree and `diagnostic.rs` turns pest
//! errors into [`crate::SyntaxError`].

use std::sync::OnceLock;

use pest::Parser as _;

#[derive(pest_derive::Parser)]
#[grammar = "gov.pest"]
pub(crate) struct GovParser;

/// Reserved words that start or join match expressions (the first half of
/// the `reserved` rule of `gov.pest`).
pub(crate) const MATCH_WORDS: [&str; 9] = [
    "path", "method", "header", "consumer", "calls", "grpc", "any", "and", "or",
];

/// Every keyword of the grammar by rule: the text of each `kw_*` rule,
/// indexed by the rule's number, made once.
fn keyword_table() -> &'static [Option<String>] {
    static TABLE: OnceLock<Vec<Option<String>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let rules = Rule::all_rules();
        let len = rules.iter().map(|&r| r as usize + 1).max().unwrap_or(0);
        let mut table = vec![None; len];
        for &rule in rules {
            if let Some(word) = format!("{rule:?}").strip_prefix("kw_")
                && let Some(slot) = table.get_mut(rule as usize)
            {
                *slot = Some(word.to_owned());
            }
        }
        table
    })
}

/// The word a keyword rule (`kw_*`) matches; `None` for any other rule.
pub(crate) fn keyword(rule: Rule) -> Option<&'static str> {
    keyword_table()
        .get(rule as usize)
        .and_then(|w| w.as_deref())
}

/// Reserved words that start a definition or a service statement (the
/// `statement_word` rule of `gov.pest`, so a new statement or rule kind is
/// named in the grammar only): the keywords that rule accepts.
pub(crate) fn statement_words() -> &'static [&'static str] {
    static WORDS: OnceLock<Vec<&'static str>> = OnceLock::new();
    WORDS.get_or_init(|| {
        keyword_table()
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|w| GovParser::parse(Rule::statement_word_probe, w).is_ok())
            .collect()
    })
}

/// Every keyword of the language, sorted: the grammar's `kw_*` rules (so the
/// list is never written a second time).
pub fn keywords() -> Vec<String> {
    let mut words: Vec<String> = keyword_table().iter().flatten().cloned().collect();
    words.sort();
    words
}

/// Whether `word` starts a definition or a statement of a service.
pub fn starts_statement(word: &str) -> bool {
    statement_words().contains(&word) || word == "consumer"
}

/// Whether `word` can never be a name.
pub(crate) fn is_reserved(word: &str) -> bool {
    MATCH_WORDS.contains(&word) || statement_words().contains(&word)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists above and the grammar's `reserved` rule name the same words.
    #[test]
    fn the_reserved_lists_match_the_grammar() {
        let is_name = |w: &str| {
            GovParser::parse(Rule::ident, w)
                .is_ok_and(|mut p| p.as_str() == w && p.next().is_some())
        };
        let statements = statement_words();
        for word in ["service", "registry", "match", "bulkhead", "warmup"] {
            assert!(statements.contains(&word), "`{word}` starts a statement");
        }
        for word in MATCH_WORDS.iter().chain(statements) {
            assert!(
                !is_name(word),
                "`{word}` is in a reserved list but the grammar takes it as a name"
            );
            assert!(is_reserved(word));
        }
        let keywords = keywords();
        assert!(keywords.iter().any(|k| k == "max_concurrent"));
        for word in MATCH_WORDS.iter().chain(statements) {
            assert!(keywords.iter().any(|k| k == word), "`{word}` is no keyword");
        }
        // Keywords that are not reserved stay names; so do reserved words
        // with more letters.
        for word in [
            "slow",
            "timeout",
            "stop",
            "kafka",
            "limits",
            "path_a",
            "service-x",
        ] {
            assert!(is_name(word), "`{word}` should be a name");
            assert!(!is_reserved(word));
        }
    }
}
