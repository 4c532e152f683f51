//! Golden tests of syntax errors: every fixture in `fixtures/syntax/` fails
//! to parse, and its rendered diagnostics (all of them, from `parse_all`)
//! are a snapshot.

use super::common::render;

#[test]
fn every_syntax_fixture_has_its_diagnostic() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/syntax");
    insta::glob!(fixtures, "*.gov", |path| {
        let src = std::fs::read_to_string(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        super::common::same_as_strict(&src);
        let first = gov_lang::parse(&name, &src).expect_err("a syntax fixture must not parse");
        let all = gov_lang::parse_all(&name, &src).expect_err("parse_all agrees with parse");
        assert_eq!(
            render(&first),
            render(&all[0]),
            "parse reports the first error"
        );
        let rendered: Vec<String> = all.iter().map(render).collect();
        for (err, text) in all.iter().zip(&rendered) {
            assert_header_names_primary(&name, err, text);
        }
        insta::assert_snapshot!(rendered.join("\n"));
    });
}

/// The first `[file:line:col]` header of a rendering names the primary
/// label: the text to change, not the context around it.
fn assert_header_names_primary(name: &str, err: &gov_lang::SyntaxError, rendered: &str) {
    use miette::Diagnostic as _;
    let labels: Vec<_> = err.labels().into_iter().flatten().collect();
    if labels.is_empty() {
        return;
    }
    let primary: Vec<_> = labels.iter().filter(|l| l.primary()).collect();
    assert_eq!(primary.len(), 1, "{name}: `{err}` needs one primary label");
    let source = err.source_code().expect("syntax errors carry their source");
    let (line, col) = gov_lang::report::position(source, primary[0].inner()).expect("in the file");
    let header = rendered
        .split_once("╭─[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(h, _)| h);
    assert_eq!(
        header,
        Some(format!("{name}:{line}:{col}").as_str()),
        "{rendered}"
    );
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
    super::common::same_as_strict(&src);
    let ok = vec!["any"; gov_lang::MAX_EXPR_TERMS].join(" or ");
    super::common::same_as_strict(&format!("service s {{ match m = {ok} }}"));
    gov_lang::parse("long.gov", &format!("service s {{ match m = {ok} }}")).unwrap();
}

#[test]
fn independent_errors_are_all_reported_in_order() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/syntax/three_errors.gov"
    ))
    .unwrap();
    let errors = gov_lang::parse_all("three_errors.gov", &src).unwrap_err();
    let lines: Vec<usize> = errors
        .iter()
        .map(|e| src[..e.span().start].matches('\n').count() + 1)
        .collect();
    assert_eq!(lines, [5, 10, 16], "{errors:?}");
}

#[test]
fn recovery_stops_at_the_limit() {
    let bad = "service s {\n  capacity workers x\n}\n".repeat(gov_lang::MAX_SYNTAX_ERRORS + 5);
    let errors = gov_lang::parse_all("many.gov", &bad).unwrap_err();
    assert_eq!(errors.len(), gov_lang::MAX_SYNTAX_ERRORS);
}

#[test]
fn valid_text_after_errors_is_still_checked() {
    // The good statements between the broken ones raise nothing.
    let src = "service s {\n  capacity workers x\n  domain \"d\"\n  limit l on any { calls 1 per 1s }\n  fuse f on any { trip when errors > 5 over 10 }\n}\n";
    let errors = gov_lang::parse_all("s.gov", src).unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:?}");
}

#[test]
fn no_follow_on_errors_after_an_incomplete_statement() {
    for src in [
        "service order {\n  capacity workers\n}\n",
        "service a {\n  bulkhead b on any {\n    queue\n  }\n  domain \"d\"\n}\n",
        "service a {\n  bulkhead b on any {\n    queue 1\n  limit l on any { calls 1 per 1s }\n}\n",
        "service a {\n  match m = any or\n  capacity workers 4\n}\n",
        "service a {\n  capacity workers 4\n\nservice b {}\n",
    ] {
        let errors = gov_lang::parse_all("a.gov", src).unwrap_err();
        assert_eq!(errors.len(), 1, "{src}: {errors:#?}");
    }
    // Two statements broken on one line are two errors, not a follow-on.
    let src = "service a { capacity workers 4x } service b { domain }\n";
    let errors = gov_lang::parse_all("a.gov", src).unwrap_err();
    assert_eq!(errors.len(), 2, "{src}: {errors:#?}");
}

#[test]
fn ready_options_come_in_order() {
    let ok = "service s {\n  warmup {\n    ready when http GET \"/r\" is 200 every 1s after 2s timeout 3s\n  }\n}\n";
    super::common::parse_ok("s.gov", ok);
    let swapped = ok.replace("after 2s timeout 3s", "timeout 3s after 2s");
    let err = gov_lang::parse("s.gov", &swapped).unwrap_err();
    assert!(
        err.message().ends_with("found `after`"),
        "{}",
        err.message()
    );
}

#[test]
fn errors_the_builder_finds_are_reported_after_syntax_errors() {
    let src = "service a {\n  capacity workers x\n}\nservice b {\n  capacity workers 99999999999999999999\n}\n";
    let errors = gov_lang::parse_all("s.gov", src).unwrap_err();
    let messages: Vec<&str> = errors.iter().map(gov_lang::SyntaxError::message).collect();
    assert_eq!(
        messages,
        [
            "expected a whole number, found `x`",
            "number `99999999999999999999` is too large"
        ]
    );
}

#[test]
fn misspelt_items_in_a_row_are_each_reported() {
    let src =
        "servce a {\n  capacity workers 1\n}\nservce b {}\nservice c { capacity workers x }\n";
    let errors = gov_lang::parse_all("s.gov", src).unwrap_err();
    let lines: Vec<usize> = errors
        .iter()
        .map(|e| src[..e.span().start].matches('\n').count() + 1)
        .collect();
    assert_eq!(lines, [1, 4, 5], "{errors:?}");
}

#[test]
fn the_partial_tree_keeps_what_parsed_and_lists_what_was_skipped() {
    let src = "service a {\n  capacity workers x\n  match m = path prefix \"/m\"\n  match n = path prefix /n\n}\nservice b {}\n";
    let parsed = gov_lang::parse_partial("p.gov", src);
    assert_eq!(parsed.errors.len(), 2);
    let policy = parsed.policy.expect("the rest parses");
    assert_eq!(policy.items.len(), 2);
    let gov_lang::ast::Item::Service(a) = &policy.items[0] else {
        panic!("a service first")
    };
    // Only `match m` is left of service `a`.
    assert_eq!(a.body.len(), 1);
    let skipped: Vec<_> = parsed
        .skipped
        .iter()
        .map(|s| (s.keyword.as_deref(), s.name.as_deref(), s.item))
        .collect();
    assert_eq!(
        skipped,
        [
            (Some("capacity"), Some("workers"), false),
            (Some("match"), Some("n"), false)
        ]
    );
}

#[test]
fn spans_end_at_the_last_token_not_at_trailing_space_or_comments() {
    let src =
        "service a {\n  match m = any   # why\n  capacity workers 4   \n  domain \"d # e\"  \n}\n";
    let policy = gov_lang::parse("s.gov", src).unwrap();
    let gov_lang::ast::Item::Service(s) = &policy.items[0] else {
        panic!("a service")
    };
    let texts: Vec<&str> = s
        .body
        .iter()
        .map(|stmt| {
            let span = match stmt {
                gov_lang::ast::ServiceStmt::Match(m) => m.span,
                gov_lang::ast::ServiceStmt::Capacity(gov_lang::ast::Capacity::Workers {
                    span,
                    ..
                }) => *span,
                gov_lang::ast::ServiceStmt::Domain(d) => d.span,
                _ => panic!("unexpected statement"),
            };
            &src[span.start..span.end]
        })
        .collect();
    assert_eq!(
        texts,
        ["match m = any", "capacity workers 4", "domain \"d # e\""]
    );
}
