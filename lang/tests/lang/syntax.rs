//! Golden tests of syntax errors: every fixture in `fixtures/syntax/` fails
//! to parse, and its rendered diagnostic is a snapshot.

use super::common::render;

#[test]
fn every_syntax_fixture_has_its_diagnostic() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/syntax");
    insta::glob!(fixtures, "*.gov", |path| {
        let src = std::fs::read_to_string(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        let err = gov_lang::parse(&name, &src).expect_err("a syntax fixture must not parse");
        insta::assert_snapshot!(render(&err));
    });
}

#[test]
fn oversize_input_is_refused_before_parsing() {
    let src = "#".repeat(gov_lang::MAX_SOURCE_BYTES + 1);
    let err = gov_lang::parse("big.gov", &src).unwrap_err();
    insta::assert_snapshot!(render(&err));
}

#[test]
fn deep_nesting_is_refused() {
    let depth = gov_lang::MAX_NESTING + 1;
    let src = format!(
        "service s {{\n  match m = {}any{}\n}}\n",
        "(".repeat(depth),
        ")".repeat(depth)
    );
    let err = gov_lang::parse("deep.gov", &src).unwrap_err();
    insta::assert_snapshot!(render(&err));
    // One level less is fine.
    let ok = src.replacen('(', "", 1).replacen(')', "", 1);
    gov_lang::parse("deep.gov", &ok).unwrap();
}

#[test]
fn very_long_match_expressions_are_refused() {
    let terms = vec!["any"; gov_lang::MAX_EXPR_TERMS + 1].join(" or ");
    let src = format!("service s {{\n  match m = {terms}\n}}\n");
    let err = gov_lang::parse("long.gov", &src).unwrap_err();
    assert_eq!(err.message(), "match expression has more than 256 terms");
    let ok = vec!["any"; gov_lang::MAX_EXPR_TERMS].join(" or ");
    gov_lang::parse("long.gov", &format!("service s {{ match m = {ok} }}")).unwrap();
}
