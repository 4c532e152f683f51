//! Rule kinds: one module per kind, behind one trait.
//!
//! The language reads every rule the same way (`KIND NAME on EXPR {
//! SETTING... }`, settings as words and values, see
//! [`gov_lang::ast::RuleDef`]). A kind's module gives them their meaning:
//! its typed settings (decoded from the words the grammar allows), their
//! defaults, what the checks shared by every kind read of them (the setting
//! that gives the rule its meaning, which settings may appear once, the
//! numbers to range-check, when two rules conflict), its lowering to the
//! wire's `Rule.spec` and its fields in a plan. Name resolution, the shared
//! checks, the lowering and the plan go over [`KINDS`] through [`Kind`] and
//! never name a kind. Checks about one kind only (`queueing_bulkhead`...)
//! read that kind's typed view (`bulkhead::Bulkhead::of`).
//!
//! A new kind: its grammar in `gov.pest`, a module here implementing
//! [`Kind`], and its entry in [`KINDS`]; a test fails when a kind the
//! grammar accepts has no entry.

use gov_proto::v1 as pb;

mod common;

pub(crate) mod bulkhead;
pub(crate) mod fuse;
pub(crate) mod keys;
pub(crate) mod limit;
pub(crate) mod retry;
pub(crate) mod share;
pub(crate) mod shares;

pub(crate) use common::{
    Bound, Kind, Large, LowerCx, Reject, Rule, RuleExpiry, RuleMode, Values, Words, decode,
    header_key, header_values,
};

/// Every rule kind, in the order of the wire's `Rule.spec`.
pub(crate) const KINDS: &[&dyn Kind] = &[&bulkhead::Kind, &limit::Kind, &fuse::Kind, &retry::Kind];

/// The kind whose keyword is `word`.
pub(crate) fn by_word(word: &str) -> Option<&'static dyn Kind> {
    KINDS.iter().copied().find(|k| k.wire().word() == word)
}

/// The kind of a spec.
pub(crate) fn of_spec(spec: &pb::rule::Spec) -> Option<&'static dyn Kind> {
    let wire = spec.kind();
    KINDS.iter().copied().find(|k| k.wire() == wire)
}

#[cfg(test)]
mod tests {
    use gov_lang::ast::{Item, ServiceStmt};

    use super::*;

    /// Every keyword that the grammar accepts as a rule's kind has a
    /// module here, and every kind of the wire has one.
    #[test]
    fn every_kind_the_grammar_accepts_has_a_module() {
        let mut words = Vec::new();
        for word in gov_lang::keywords() {
            let src = format!("service s {{ {word} r on any {{}} }}");
            let Ok(policy) = gov_lang::parse("k.gov", &src) else {
                continue;
            };
            let Some(Item::Service(s)) = policy.items.first() else {
                continue;
            };
            if let Some(ServiceStmt::Rule(r)) = s.body.first() {
                assert!(by_word(r.kind.node).is_some(), "no module for `{word}`");
                words.push(r.kind.node);
            }
        }
        assert_eq!(words.len(), KINDS.len(), "{words:?}");
        let wire: Vec<_> = KINDS.iter().map(|k| k.wire()).collect();
        assert_eq!(wire, pb::RuleKind::RULES);
    }

    /// Every setting of every example and fixture decodes to its end: the
    /// decoders and the grammar agree.
    #[test]
    fn every_written_setting_decodes() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let mut seen = 0;
        for dir in [
            "examples",
            "compiler/tests/fixtures",
            "lang/tests/fixtures/fmt",
        ] {
            let Ok(entries) = std::fs::read_dir(format!("{root}/{dir}")) else {
                panic!("no {dir}");
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let parsed = gov_lang::parse_partial("x.gov", &text);
                let Some(policy) = parsed.policy else {
                    continue;
                };
                for item in &policy.items {
                    let Item::Service(s) = item else { continue };
                    for stmt in &s.body {
                        let ServiceStmt::Rule(r) = stmt else { continue };
                        let kind = by_word(r.kind.node).expect("a known kind");
                        for setting in &r.settings {
                            seen += 1;
                            assert!(
                                kind.decodes(setting) || header_key(setting).is_some(),
                                "{}: `{setting}` does not decode",
                                path.display()
                            );
                        }
                    }
                }
            }
        }
        assert!(seen > 50, "only {seen} settings");
    }

    /// The ```gov blocks of docs/language.md, each with its line: a whole
    /// policy, or the body of a service (wrapped in one to be read).
    fn language_doc_blocks() -> Vec<(usize, String)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/language.md");
        let text = std::fs::read_to_string(path).expect("docs/language.md");
        let mut blocks = Vec::new();
        let mut open: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            match (&mut open, line.trim_end()) {
                (None, "```gov") => open = Some((i + 1, String::new())),
                (Some(_), "```") => blocks.extend(open.take()),
                (Some((_, block)), _) => {
                    block.push_str(line);
                    block.push('\n');
                }
                (None, _) => {}
            }
        }
        assert!(
            open.is_none(),
            "docs/language.md: a ```gov block is not closed"
        );
        blocks
    }

    /// Every example in docs/language.md reads, every setting of its rules
    /// decodes, and every kind has an example there: what the language
    /// reference shows is what the language takes.
    #[test]
    fn every_example_in_the_language_docs_reads_and_every_kind_has_one() {
        let blocks = language_doc_blocks();
        assert!(blocks.len() > 20, "only {} blocks", blocks.len());
        let mut kinds = std::collections::BTreeSet::new();
        for (line, block) in &blocks {
            let policy = gov_lang::parse("language.md", block)
                .or_else(|whole| {
                    gov_lang::parse("language.md", &format!("service doc {{\n{block}}}\n"))
                        .map_err(|body| (whole, body))
                })
                .unwrap_or_else(|(whole, body)| {
                    panic!(
                        "docs/language.md:{line}: the example reads neither as a policy ({whole}) \
                         nor as a service's body ({body})"
                    )
                });
            for item in &policy.items {
                let Item::Service(s) = item else { continue };
                for stmt in &s.body {
                    let ServiceStmt::Rule(r) = stmt else { continue };
                    let kind = by_word(r.kind.node).expect("a known kind");
                    kinds.insert(r.kind.node);
                    for setting in &r.settings {
                        assert!(
                            kind.decodes(setting) || header_key(setting).is_some(),
                            "docs/language.md:{line}: `{setting}` does not decode"
                        );
                    }
                }
            }
        }
        for kind in KINDS {
            let word = kind.wire().word();
            assert!(
                kinds.contains(word),
                "docs/language.md has no example of a `{word}` rule"
            );
        }
    }
}
