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
}
