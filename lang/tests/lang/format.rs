//! Golden tests of the formatter: every file in `fixtures/fmt/` formatted,
//! as a snapshot; formatting the result again changes nothing.

use super::common::{comment_texts, parse_ok};

#[test]
fn every_fmt_fixture_formats_canonically() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fmt");
    insta::glob!(fixtures, "*.gov", |path| {
        let src = std::fs::read_to_string(path).unwrap();
        let tree = parse_ok("fixture.gov", &src);
        let once = gov_lang::format(&tree, &src);
        let back = parse_ok("formatted.gov", &once);
        assert_eq!(back, tree);
        assert_eq!(comment_texts(&back), comment_texts(&tree), "comments lost");
        assert_eq!(gov_lang::format(&back, &once), once, "not idempotent");
        insta::assert_snapshot!(once);
    });
}

#[test]
fn literals_print_as_written() {
    let src = "service s { match m = any latency 1min fuse f on m { trip when errors > 12.500% over 90s } \
               limit l on m { bytes 10KiB per 2h calls -1 per 0ms } }";
    let out = gov_lang::format_source("s.gov", src).unwrap();
    assert!(out.contains("latency 1m\n"), "{out}");
    assert!(out.contains("> 12.5% over 90s\n"), "{out}");
    assert!(out.contains("bytes 10KiB per 2h\n"), "{out}");
    assert!(out.contains("calls -1 per 0ms\n"), "{out}");
}

/// A duration literal reads as a duration flag does (one parser,
/// `gov_common::duration`): the same milliseconds, the same errors. A fraction
/// is printed in the largest unit it is whole in.
#[test]
fn durations_read_as_flags_read_them() {
    let latency = |text: &str| {
        let src = format!("service s {{ match m = any latency {text} }}");
        gov_lang::parse("s.gov", &src).map(|tree| {
            let gov_lang::ast::Item::Service(s) = &tree.items[0] else {
                panic!()
            };
            let gov_lang::ast::ServiceStmt::Match(m) = &s.body[0] else {
                panic!()
            };
            m.latency.as_ref().unwrap().node
        })
    };
    for text in [
        "10ms", "5s", "2m", "2min", "1h", "1.5s", "0.25m", "1.5h", "0.0001h", "1.50s",
    ] {
        let d = latency(text).unwrap_or_else(|e| panic!("{text}: {e:?}"));
        let flag = gov_common::flag::parse_duration(text).unwrap();
        assert_eq!(
            d.as_millis(),
            i64::try_from(flag.as_millis()).ok(),
            "{text}"
        );
    }
    assert_eq!(latency("1.5s").unwrap().to_string(), "1500ms");
    assert_eq!(latency("0.25m").unwrap().to_string(), "15s");
    assert_eq!(latency("1.5h").unwrap().to_string(), "90m");
    assert_eq!(latency("2min").unwrap().to_string(), "2m");
    for bad in ["2.5ms", "0.00001s", "99999999999999999999s"] {
        let err = latency(bad).unwrap_err();
        let flag = gov_common::duration::parse_millis(bad).unwrap_err();
        assert_eq!(err.message(), flag.to_string(), "{bad}");
        assert_eq!(
            err.help_text(),
            miette::Diagnostic::help(&flag)
                .map(|h| h.to_string())
                .as_deref()
        );
    }
    // Without a unit: the flag's help, at the language's "expected" message.
    let err = latency("30").unwrap_err();
    let flag = gov_common::duration::parse_millis("30").unwrap_err();
    assert_eq!(
        err.help_text(),
        miette::Diagnostic::help(&flag)
            .map(|h| h.to_string())
            .as_deref()
    );
}

#[test]
fn kilobytes_are_one_unit_printed_kb() {
    let upper = parse_ok(
        "s.gov",
        "service s { limit l on any { bytes 10KB per 1s } }",
    );
    let lower = parse_ok(
        "s.gov",
        "service s { limit l on any { bytes 10kB per 1s } }",
    );
    assert_eq!(upper, lower);
    let out = gov_lang::format(&upper, "");
    assert!(out.contains("bytes 10kB per 1s\n"), "{out}");
}

#[test]
fn strings_are_escaped_again() {
    let src = r#"service s { domain "a\"b\\c" }"#;
    let tree = parse_ok("s.gov", src);
    let gov_lang::ast::Item::Service(s) = &tree.items[0] else {
        panic!()
    };
    let gov_lang::ast::ServiceStmt::Domain(d) = &s.body[0] else {
        panic!()
    };
    assert_eq!(d.name.node, r#"a"b\c"#);
    assert_eq!(
        gov_lang::format(&tree, src),
        "service s {\n  domain \"a\\\"b\\\\c\"\n}\n"
    );
}

/// An outlier block: its settings in the words written; a factor keeps its
/// `x`, and a factor without it (or a word where the callee goes) is an error.
#[test]
fn outlier_blocks_read_and_print_their_words() {
    let src = "service s { outlier to inventory { eject 30s growth 3x max 5m max_ejected 25% } }";
    let out = gov_lang::format_source("s.gov", src).unwrap();
    assert!(out.contains("  outlier to inventory {\n"), "{out}");
    assert!(out.contains("    eject 30s growth 3x max 5m\n"), "{out}");
    assert!(out.contains("    max_ejected 25%\n"), "{out}");
    for bad in [
        "service s { outlier { eject 30s growth 3 } }",
        "service s { outlier to { eject 30s } }",
        "service s { outlier { max_ejected 5 } }",
    ] {
        assert!(gov_lang::parse("s.gov", bad).is_err(), "{bad}");
    }
}
