//! The pest parser generated from `gov.pest`. Its types never leave the crate:
//! `parser.rs` turns pairs into the syntax tree and `diagnostic.rs` turns pest
//! errors into [`crate::SyntaxError`].

#[derive(pest_derive::Parser)]
#[grammar = "gov.pest"]
pub(crate) struct GovParser;

/// Reserved words that start or join match expressions (the first half of
/// the `reserved` rule of `gov.pest`).
pub(crate) const MATCH_WORDS: [&str; 8] = [
    "path", "method", "header", "consumer", "calls", "any", "and", "or",
];

/// Reserved words that start a definition or a service statement (the
/// second half of the `reserved` rule).
pub(crate) const STATEMENT_WORDS: [&str; 10] = [
    "service", "registry", "domain", "capacity", "match", "bulkhead", "limit", "fuse", "warmup",
    "shutdown",
];

/// Every keyword of the language, sorted: the grammar's `kw_*` rules (so the
/// list is never written a second time).
pub fn keywords() -> Vec<String> {
    let mut words: Vec<String> = Rule::all_rules()
        .iter()
        .filter_map(|r| format!("{r:?}").strip_prefix("kw_").map(str::to_owned))
        .collect();
    words.sort();
    words
}

/// Whether `word` starts a definition or a statement of a service.
pub fn starts_statement(word: &str) -> bool {
    STATEMENT_WORDS.contains(&word) || word == "consumer"
}

/// Whether `word` can never be a name.
pub(crate) fn is_reserved(word: &str) -> bool {
    MATCH_WORDS.contains(&word) || STATEMENT_WORDS.contains(&word)
}

#[cfg(test)]
mod tests {
    use pest::Parser as _;

    use super::*;

    /// The lists above and the grammar's `reserved` rule name the same words.
    #[test]
    fn the_reserved_lists_match_the_grammar() {
        let is_name = |w: &str| {
            GovParser::parse(Rule::ident, w)
                .is_ok_and(|mut p| p.as_str() == w && p.next().is_some())
        };
        for word in MATCH_WORDS.iter().chain(&STATEMENT_WORDS) {
            assert!(
                !is_name(word),
                "`{word}` is in a reserved list but the grammar takes it as a name"
            );
            assert!(is_reserved(word));
        }
        let keywords = keywords();
        assert!(keywords.iter().any(|k| k == "max_concurrent"));
        for word in MATCH_WORDS.iter().chain(&STATEMENT_WORDS) {
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
