//! Golden tests of what users read: every invalid fixture under
//! `tests/fixtures/` is checked, must report the diagnostic its file is
//! named after, and its rendered diagnostics are an insta snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::Path;

use gov_compiler::{Checked, Diagnostics, SourceFile, check};
use gov_lang::report::{Focused, position};
use miette::{Diagnostic as _, GraphicalReportHandler, GraphicalTheme};

/// One diagnostic as `govc check` prints it, without colour.
fn render_one(d: &dyn miette::Diagnostic) -> String {
    let mut out = String::new();
    GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
        .with_width(100)
        .render_report(&mut out, &Focused::new(d))
        .unwrap();
    out
}

fn render(diagnostics: &Diagnostics) -> String {
    let mut out = String::new();
    for d in diagnostics {
        out.push_str(&render_one(d));
        out.push('\n');
    }
    out
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn every_fixture_reports_its_code() {
    insta::glob!("fixtures/*.gov", |path| {
        let text = std::fs::read_to_string(path).unwrap();
        let checked = check(&[SourceFile::new(file_name(path), text)]);
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let codes: Vec<String> = checked.diagnostics.iter().map(|d| d.code_str()).collect();
        assert!(
            codes
                .iter()
                .any(|c| c.rsplit("::").next() == Some(stem.as_str())),
            "{stem}.gov must report `{stem}`, got {codes:?}"
        );
        // A fixture for one check should not trip over other checks.
        assert!(
            codes
                .iter()
                .all(|c| c.rsplit("::").next() == Some(stem.as_str())),
            "{stem}.gov reports other codes too: {codes:?}"
        );
        assert!(checked.model.is_none() || checked.diagnostics.iter().all(|d| d.is_warning()));
        insta::assert_snapshot!(render(&checked.diagnostics));
    });
}

#[test]
fn every_code_has_a_fixture_and_a_doc() {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/checks.md")).unwrap();
    for code in gov_compiler::check::CODES {
        let short = code.rsplit("::").next().unwrap();
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{short}.gov"));
        assert!(fixture.exists(), "no fixture for {code}");
        assert!(
            docs.contains(&format!("`{code}`")),
            "docs/checks.md does not document {code}"
        );
    }
}

#[test]
fn syntax_errors_come_first_and_semantic_checks_still_run() {
    let files = [
        SourceFile::new("broken.gov", "service a {"),
        SourceFile::new("ok.gov", "service b { capacity workers 0 }"),
    ];
    let checked = check(&files);
    let codes: Vec<String> = checked.diagnostics.iter().map(|d| d.code_str()).collect();
    assert_eq!(codes, ["gov::syntax", "gov::non-positive"]);
    assert!(checked.model.is_none());
}

#[test]
fn unknown_services_are_not_reported_when_a_file_did_not_parse() {
    let files = [
        SourceFile::new("broken.gov", "service inventory {"),
        SourceFile::new(
            "ok.gov",
            "service b { bulkhead x on calls to inventory { max_concurrent 1 } }",
        ),
    ];
    let codes: Vec<String> = check(&files)
        .diagnostics
        .iter()
        .map(|d| d.code_str())
        .collect();
    assert_eq!(codes, ["gov::syntax"]);
}

#[test]
fn a_duplicate_across_files_points_into_both() {
    let files = [
        SourceFile::new("a.gov", "service order {}\n"),
        SourceFile::new("b.gov", "\n\nservice order {}\n"),
    ];
    let checked = check(&files);
    let rendered = render(&checked.diagnostics);
    assert!(rendered.contains("[b.gov:3:9]"), "{rendered}");
    assert!(rendered.contains("[a.gov:1:9]"), "{rendered}");
    assert!(rendered.contains("first defined here"), "{rendered}");
    assert!(rendered.contains("defined again here"), "{rendered}");
}

#[test]
fn warnings_do_not_block() {
    let text = "service a {\n  capacity workers 2\n  bulkhead b on any { max_concurrent 5 }\n}\n";
    let checked = check(&[SourceFile::new("a.gov", text)]);
    assert_eq!(checked.diagnostics.warning_count(), 1);
    assert!(!checked.diagnostics.has_errors());
    assert!(checked.model.is_some());
}

#[test]
fn large_policies_parse_in_parallel_and_report_in_file_order() {
    // Over the parallel-parse threshold: 6 files of about 60KB each.
    let service = |f: usize, i: usize| {
        format!(
            "service s{f}_{i} {{\n  match m = path prefix \"/x\"\n  bulkhead b on m {{\n    max_concurrent 1\n  }}\n}}\n"
        )
    };
    let mut files: Vec<SourceFile> = (0..6)
        .map(|f| {
            let text: String = (0..700).map(|i| service(f, i)).collect();
            SourceFile::new(format!("f{f}.gov"), text)
        })
        .collect();
    assert!(files.iter().map(|f| f.text.len()).sum::<usize>() > 300 * 1024);
    assert!(check(&files).model.is_some());
    files[4].text.push_str("service broken {");
    files[1].text.push_str("service broken {");
    files[3].text.push_str("service s3_0 {}\n");
    let checked = check(&files);
    let codes: Vec<String> = checked.diagnostics.iter().map(|d| d.code_str()).collect();
    assert_eq!(
        codes,
        ["gov::syntax", "gov::syntax", "gov::duplicate-service"]
    );
    let rendered = render(&checked.diagnostics);
    let (one, four) = (
        rendered.find("[f1.gov:").unwrap(),
        rendered.find("[f4.gov:").unwrap(),
    );
    assert!(one < four, "{rendered}");
}

#[test]
fn errors_come_in_text_order_then_warnings() {
    let text = "service a {\n  capacity workers 2\n  bulkhead wide on any { max_concurrent 5 }\n  limit l on nowhere { calls 1 per 1s }\n  bulkhead zero on path prefix \"/z\" { max_concurrent 0 }\n}\n";
    let b = SourceFile::new(
        "b.gov",
        "service b {\n  limit l on nowhere { calls 0 per 1s }\n}\n",
    );
    let checked = check(&[SourceFile::new("a.gov", text), b]);
    let codes: Vec<String> = checked.diagnostics.iter().map(|d| d.code_str()).collect();
    assert_eq!(
        codes,
        [
            "gov::unknown-match",
            "gov::non-positive",
            "gov::unknown-match",
            "gov::non-positive",
            "gov::lint::bulkhead-over-workers",
        ]
    );
    let rendered = render(&checked.diagnostics);
    let a4 = rendered.find("[a.gov:4:").unwrap();
    let a5 = rendered.find("[a.gov:5:").unwrap();
    let b2 = rendered.find("[b.gov:2:").unwrap();
    assert!(a4 < a5 && a5 < b2, "{rendered}");
}

/// The codes `check` reports for one file.
fn codes(text: &str) -> Vec<String> {
    check(&[SourceFile::new("t.gov", text)])
        .diagnostics
        .iter()
        .map(|d| d.code_str())
        .collect()
}

#[test]
fn lint_thresholds_at_their_boundaries() {
    let queueing = |latency: &str, wait: &str| {
        codes(&format!(
            "service s {{\n  match m = path prefix \"/m\" latency {latency}\n  bulkhead b on m {{\n    max_concurrent 1\n    max_wait {wait}\n  }}\n}}\n"
        ))
    };
    let q = ["gov::lint::queueing-bulkhead"];
    assert_eq!(queueing("200ms", "100ms"), [""; 0]);
    assert_eq!(queueing("200ms", "101ms"), q);
    assert_eq!(queueing("50ms", "49ms"), [""; 0]);
    assert_eq!(queueing("50ms", "50ms"), q);
    assert_eq!(queueing("10s", "0ms"), [""; 0]);

    let workers = |max: u32| {
        codes(&format!(
            "service s {{\n  capacity workers 20\n  bulkhead b on any {{ max_concurrent {max} }}\n}}\n"
        ))
    };
    assert!(workers(20).is_empty());
    assert_eq!(workers(21), ["gov::lint::bulkhead-over-workers"]);

    let min_calls = |n: u32| {
        codes(&format!(
            "service s {{\n  capacity rate 10 per 1s\n  fuse f on any {{ trip when errors >= 5 over 5s min_calls {n} }}\n}}\n"
        ))
    };
    assert!(min_calls(50).is_empty());
    assert_eq!(min_calls(51), ["gov::lint::unreachable-min-calls"]);

    // `slower than` against the calls' timeout (same calls, any spelling;
    // a shadow bulkhead sets no deadline) and their declared latency.
    let slow = |on: &str, slower: &str, bulkhead: &str| {
        codes(&format!(
            "service s {{\n  match m = path prefix \"/m\" latency 200ms\n  bulkhead b on {on} {{ max_concurrent 5{bulkhead} }}\n  fuse f on m {{ trip when slow_calls >= 5 over 1m slower than {slower} }}\n}}\n"
        ))
    };
    let t = ["gov::lint::slow-above-timeout"];
    let l = ["gov::lint::slow-within-latency"];
    assert!(slow("m", "999ms", "  timeout 1s").is_empty());
    assert_eq!(slow("m", "1s", "  timeout 1s"), t);
    assert_eq!(slow("path prefix \"/m\"", "2s", "  timeout 1s"), t);
    assert!(slow("m", "2s", "  timeout 1s  mode shadow").is_empty());
    assert!(slow("path prefix \"/other\"", "2s", "  timeout 1s").is_empty());
    assert!(slow("m", "201ms", "").is_empty());
    assert_eq!(slow("m", "200ms", ""), l);
    // Through `or`, only a latency every side declares counts.
    let either = |slower: &str, b: &str| {
        codes(&format!(
            "service s {{\n  match a = path prefix \"/a\" latency 2s\n  match b = path prefix \"/b\"{b}\n  fuse f on a or b {{ trip when slow_calls >= 5 over 1m slower than {slower} }}\n}}\n"
        ))
    };
    assert!(either("1s", "").is_empty());
    assert_eq!(either("1s", " latency 1s"), l);
    assert!(either("1001ms", " latency 1s").is_empty());

    let cluster = |global: u32| {
        codes(&format!(
            "service s {{\n  capacity instances 3\n  limit a on any {{ calls 100 per 1s }}\n  limit b on any {{ calls {global} per 1m  scope cluster sync exact }}\n}}\n"
        ))
    };
    // 3 x 100/s = 18000/min.
    assert!(cluster(17_999).is_empty());
    assert_eq!(cluster(18_000), ["gov::lint::cluster-limit-inconsistent"]);

    let wait = |w: &str| {
        codes(&format!(
            "registry r {{ server_cache 30s client_refresh 30s balancer_refresh 30s }}\nservice s {{\n  registry r\n  shutdown {{\n    deregister\n    wait {w}\n    drain 5s\n  }}\n}}\n"
        ))
    };
    assert!(wait("90s").is_empty());
    assert!(wait("2m").is_empty());
    assert_eq!(wait("89s"), ["gov::lint::shutdown-wait"]);
}

#[test]
fn limits_on_different_windows_or_keys_do_not_conflict() {
    let two = |a: &str, b: &str| {
        codes(&format!(
            "service s {{\n  consumer from header \"x-gov-consumer\"\n  limit a on any {{ {a} }}\n  limit b on any {{ {b} }}\n}}\n"
        ))
    };
    assert!(two("calls 10 per 1s", "calls 500 per 1m").is_empty());
    assert!(two("calls 10 per 1s  per consumer", "calls 20 per 1s").is_empty());
    assert!(two("calls 10 per 1s", "bytes 1MiB per 1s").is_empty());
    assert_eq!(
        two("calls 10 per 1s", "calls 10 per 1s"),
        ["gov::conflicting-rules"]
    );
    assert_eq!(
        two(
            "calls 10 per 1s",
            "calls 9 per 1m  action reject  reject with 429"
        ),
        [""; 0]
    );
}

#[test]
fn every_syntax_error_of_a_file_is_reported() {
    let text =
        "service a {\n  capacity workers x\n  limit l on any { calls 1 per 1 }\n}\nservce b {}\n";
    let checked = check(&[SourceFile::new("three.gov", text)]);
    let rendered = render(&checked.diagnostics);
    let codes: Vec<String> = checked.diagnostics.iter().map(|d| d.code_str()).collect();
    assert_eq!(codes, ["gov::syntax"; 3], "{rendered}");
    for at in ["[three.gov:2:20]", "[three.gov:3:32]", "[three.gov:5:1]"] {
        assert!(rendered.contains(at), "{at} missing in {rendered}");
    }
}

#[test]
fn n_conflicting_rules_give_one_diagnostic_per_rule_after_the_first() {
    let limits: String = (0..30)
        .map(|i| format!("  limit l{i} on any {{ calls {} per 1s }}\n", i + 1))
        .collect();
    let text = format!("service s {{\n{limits}}}\n");
    let checked = check(&[SourceFile::new("t.gov", text)]);
    let messages: Vec<String> = checked.diagnostics.iter().map(|d| d.to_string()).collect();
    assert_eq!(messages.len(), 29, "{messages:#?}");
    for (i, m) in messages.iter().enumerate() {
        let second = format!("`l{}`", i + 1);
        assert!(m.starts_with("limit rules `l0` and "), "{m}");
        assert!(m.contains(&second), "{m} should name {second}");
    }
}

/// The `[file:line:col]` of the first snippet header in a rendering.
fn first_header(rendered: &str) -> Option<&str> {
    let start = rendered.find("╭─[")? + "╭─[".len();
    let len = rendered[start..].find(']')?;
    Some(&rendered[start..start + len])
}

#[test]
fn the_header_of_every_diagnostic_names_its_primary_label() {
    insta::glob!("fixtures/*.gov", |path| {
        let name = file_name(path);
        let text = std::fs::read_to_string(path).unwrap();
        let checked = check(&[SourceFile::new(name.clone(), text)]);
        for d in &checked.diagnostics {
            let labels: Vec<_> = d.labels().into_iter().flatten().collect();
            let primary: Vec<_> = labels.iter().filter(|l| l.primary()).collect();
            assert_eq!(primary.len(), 1, "{name}: `{d}` needs one primary label");
            let (line, col) = position(d.source_code().unwrap(), primary[0].inner()).unwrap();
            let rendered = render_one(d);
            assert_eq!(
                first_header(&rendered),
                Some(format!("{name}:{line}:{col}").as_str()),
                "{rendered}"
            );
        }
    });
}

/// `tests/partial/NAME` checked, and the codes of its diagnostics in order.
fn check_partial(name: &str) -> (Checked, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/partial")
        .join(name);
    let text = std::fs::read_to_string(path).unwrap();
    let checked = check(&[SourceFile::new(name, text)]);
    let codes = checked.diagnostics.iter().map(|d| d.code_str()).collect();
    (checked, codes)
}

#[test]
fn a_block_that_takes_its_services_brace_hides_no_error_of_that_service() {
    let (checked, codes) = check_partial("unclosed-block-before-a-service.gov");
    assert_eq!(
        codes,
        [
            "gov::syntax",
            "gov::syntax",
            "gov::syntax",
            "gov::percent-out-of-range",
            "gov::non-positive",
            "gov::unknown-match",
        ],
        "{}",
        render(&checked.diagnostics)
    );
}

#[test]
fn three_syntax_and_three_semantic_errors_are_reported_in_one_run() {
    let (checked, codes) = check_partial("three-syntax-three-semantic.gov");
    assert_eq!(
        codes,
        [
            "gov::syntax",
            "gov::syntax",
            "gov::syntax",
            "gov::non-positive",
            "gov::unknown-match",
            "gov::percent-out-of-range",
        ]
    );
    assert!(checked.model.is_none());
    insta::assert_snapshot!(render(&checked.diagnostics));
}

#[test]
fn names_whose_definitions_were_skipped_are_not_unknown_and_others_are() {
    // `broken` is defined in a statement with a syntax error; `missing` is
    // defined nowhere.
    let text = "service a {\n  match broken = path prefix /x\n  limit l on broken { calls 1 per 1s }\n  limit m on missing { calls 1 per 1m }\n}\n";
    assert_eq!(codes(text), ["gov::syntax", "gov::unknown-match"]);
    // A misspelt statement keyword may define any match: none is unknown.
    let text =
        "service a {\n  mtch slow = path prefix \"/x\"\n  limit l on slow { calls 1 per 1s }\n}\n";
    assert_eq!(codes(text), ["gov::syntax"]);
    // A service skipped whole hides its own name only.
    let files = [
        SourceFile::new("broken.gov", "service inventory {"),
        SourceFile::new(
            "ok.gov",
            "service b {\n  bulkhead x on calls to inventory { max_concurrent 1 }\n  bulkhead y on calls to stock { max_concurrent 1 }\n}\n",
        ),
    ];
    let codes: Vec<String> = check(&files)
        .diagnostics
        .iter()
        .map(|d| d.code_str())
        .collect();
    assert_eq!(codes, ["gov::syntax", "gov::unknown-service"]);
}

/// A share's consumer names: an empty one is an error the agent would
/// otherwise refuse at apply (`gov::share-weights`), and only the share's
/// own checks fire beside `share-weights` for a well-formed share.
#[test]
fn a_share_that_names_an_empty_consumer_is_refused_before_apply() {
    let share = |names: &str| {
        codes(&format!(
            "service s {{\n  consumer from header \"x-gov-consumer\"\n  match crm = consumer \"crm\"\n  match web = consumer \"web\"\n  bulkhead b on any {{\n    max_concurrent 10\n    max_wait 20ms\n    share by consumer {{ {names} }}\n  }}\n}}\n"
        ))
    };
    assert!(
        share("crm 3 \"\" 1").contains(&"gov::share-weights".to_string()),
        "{:?}",
        share("crm 3 \"\" 1")
    );
    assert!(
        !share("crm 3 web 1").contains(&"gov::share-weights".to_string()),
        "{:?}",
        share("crm 3 web 1")
    );
}
