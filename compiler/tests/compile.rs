//! Lowering, version hashes and plans, on the real examples.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::{Path, PathBuf};

use gov_compiler::plan::{Change, RuleKind};
use gov_compiler::{Bundle, SourceFile, compile, plan};

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gov"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty());
    paths
}

fn source(path: &Path) -> SourceFile {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    SourceFile::new(name, std::fs::read_to_string(path).unwrap())
}

fn bundle(files: &[SourceFile]) -> Bundle {
    match compile(files) {
        Ok(c) => c.bundle,
        Err(d) => panic!(
            "does not compile: {:?}",
            d.iter().map(|d| d.to_string()).collect::<Vec<_>>()
        ),
    }
}

fn versions(b: &Bundle) -> Vec<(String, String)> {
    b.targets
        .iter()
        .map(|t| (t.service.clone(), t.version.clone()))
        .collect()
}

#[test]
fn the_same_input_gives_the_same_bytes() {
    for path in examples() {
        let a = bundle(&[source(&path)]);
        let b = bundle(&[source(&path)]);
        assert_eq!(a, b);
        for t in &a.targets {
            // Recomputing a version (from a config with its source references
            // in place) gives the stored one.
            assert_eq!(gov_compiler::lower::target_version(t), t.version);
            assert!(t.rules.iter().all(|r| r.source.is_some()));
        }
        assert_eq!(gov_compiler::lower::bundle_version(&a.targets), a.version);
        assert_eq!(
            serde_yaml::to_string(&a).unwrap(),
            serde_yaml::to_string(&b).unwrap()
        );
    }
}

#[test]
fn reformatting_keeps_every_version() {
    for path in examples() {
        let file = source(&path);
        let before = bundle(std::slice::from_ref(&file));
        // The canonical layout, then a deliberately different one: every
        // line indented further and blank lines doubled.
        let formatted = gov_lang::format_source(&file.name, &file.text).unwrap();
        let scrambled: String = file
            .text
            .lines()
            .map(|l| {
                if l.trim().is_empty() {
                    "\n\n".to_string()
                } else {
                    format!("    {l}\n")
                }
            })
            .collect();
        for text in [formatted, scrambled] {
            let after = bundle(&[SourceFile::new(file.name.clone(), text)]);
            assert_eq!(versions(&before), versions(&after), "{}", path.display());
            assert_eq!(before.version, after.version);
        }
    }
}

/// Splits a policy into one file per top-level item (registry or service).
fn split_items(text: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut current = String::new();
    let mut depth = 0i32;
    for line in text.lines() {
        let code = line.split('#').next().unwrap_or_default();
        current.push_str(line);
        current.push('\n');
        depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
        if depth == 0 && code.contains('}') {
            items.push(std::mem::take(&mut current));
        }
    }
    items
}

#[test]
fn reordering_services_and_files_keeps_every_version() {
    let shop = source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shop.gov"));
    let before = bundle(std::slice::from_ref(&shop));
    let items = split_items(&shop.text);
    assert!(
        items.len() >= 3,
        "shop.gov should hold a registry and two services"
    );
    // All items in reverse order in one file.
    let reversed: String = items.iter().rev().cloned().collect();
    let after = bundle(&[SourceFile::new("shop.gov", reversed)]);
    assert_eq!(versions(&before), versions(&after));
    assert_eq!(before.version, after.version);
    // One file per item, in reverse order.
    let files: Vec<SourceFile> = items
        .iter()
        .enumerate()
        .rev()
        .map(|(i, text)| SourceFile::new(format!("part{i}.gov"), text.clone()))
        .collect();
    let after = bundle(&files);
    assert_eq!(versions(&before), versions(&after));
    assert_eq!(before.version, after.version);
    // Source references do follow the text.
    let order = |b: &Bundle| {
        b.targets
            .iter()
            .find(|t| t.service == "order")
            .unwrap()
            .rules
            .clone()
    };
    assert_ne!(order(&before), order(&after));
}

#[test]
fn changing_one_number_changes_exactly_that_service_and_rule() {
    let shop = source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shop.gov"));
    let old = bundle(std::slice::from_ref(&shop));
    let needle = "max_concurrent 10\n";
    assert_eq!(shop.text.matches(needle).count(), 1);
    let changed = SourceFile::new("shop.gov", shop.text.replace(needle, "max_concurrent 12\n"));
    let new = bundle(&[changed]);

    let (o, n) = (versions(&old), versions(&new));
    let differing: Vec<&str> = o
        .iter()
        .zip(&n)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.0.as_str())
        .collect();
    assert_eq!(differing, ["order"]);
    assert_ne!(old.version, new.version);

    let p = plan(&old, &new);
    assert!(p.has_changes());
    let changed: Vec<_> = p
        .services
        .iter()
        .filter(|s| s.change != Change::Unchanged)
        .collect();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].service, "order");
    assert_eq!(changed[0].rules.len(), 1);
    let rule = &changed[0].rules[0];
    assert_eq!(
        (rule.kind, rule.rule.as_str(), rule.change),
        (RuleKind::Bulkhead, "order/slow_calls", Change::Changed)
    );
    assert_eq!(rule.fields.len(), 1);
    assert_eq!(rule.fields[0].field, "max_concurrent");
    assert_eq!(
        (rule.fields[0].old.as_deref(), rule.fields[0].new.as_deref()),
        (Some("10"), Some("12"))
    );
    insta::assert_snapshot!(p.render(), @r"
    ~ service order
      ~ bulkhead order/slow_calls: max_concurrent 10 -> 12

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
    assert!(!plan(&old, &old).has_changes());
}

#[test]
fn plan_shows_added_and_removed_parts() {
    let old = bundle(&[SourceFile::new(
        "a.gov",
        "service a {\n  match api = path prefix \"/api\"\n  limit l on api { calls 10 per 1s }\n}\nservice gone {}\n",
    )]);
    let new = bundle(&[SourceFile::new(
        "a.gov",
        "service a {\n  match api = path prefix \"/v2\"\n  bulkhead b on api { max_concurrent 4 }\n}\nservice fresh {}\n",
    )]);
    let p = plan(&old, &new);
    insta::assert_snapshot!(p.render(), @r#"
    ~ service a
      ~ match a/api: expr path prefix "/api" -> path prefix "/v2"
      + bulkhead a/b
      - limit a/l
    + service fresh
    - service gone

    Plan: 1 service(s) to add, 1 to change, 1 to remove.
    "#);
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["services"][0]["change"], "changed");
    assert_eq!(
        json["services"][0]["rules"][0]["fields"][0]["old"],
        "path prefix \"/api\""
    );
    let proto = p.to_proto();
    assert_eq!(proto.services.len(), 3);
}

/// A plan prints, for each service whose retry amplification a change
/// moves, the attempts one call at the top of its worst path can cause
/// there, and the same with the budgets' shares.
#[test]
fn plan_shows_the_retry_amplification_a_change_moves() {
    let tiers = |attempts: u32| {
        let retry = |name: &str, to: &str| {
            format!(
                "  retry {name} on calls to {to} {{\n    attempts {attempts}\n    budget 10% min 5 per 1s\n  }}\n"
            )
        };
        format!(
            "service edge {{\n{}}}\nservice t1 {{\n{}}}\nservice t2 {{\n  capacity amplification 27\n{}}}\nservice t3 {{\n  capacity amplification 27\n}}\n",
            retry("to_t1", "t1"),
            retry("to_t2", "t2"),
            retry("to_t3", "t3")
        )
    };
    let old = bundle(&[SourceFile::new("a.gov", tiers(2))]);
    let new = bundle(&[SourceFile::new("a.gov", tiers(3))]);
    let p = plan(&old, &new);
    let rendered = p.render();
    let table = rendered
        .split_once("Retry amplification")
        .expect("the plan has an amplification section")
        .1;
    insta::assert_snapshot!(table, @r"
     (attempts one call at the top of the worst path can cause; with the budgets' shares):
      ~ t1: 2 (1.1x) -> 3 (1.1x) via edge -> t1
      ~ t2: 4 (1.21x) -> 9 (1.21x) via edge -> t1 -> t2
      ~ t3: 8 (1.331x) -> 27 (1.331x) via edge -> t1 -> t2 -> t3

    Plan: 0 service(s) to add, 3 to change, 0 to remove.
    ");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["amplification"][2]["new"]["worst"], 27);
    assert!(plan(&new, &new).amplification.is_empty());
}

#[test]
fn the_checked_model_lowers_to_the_compiled_bundle() {
    let shop = source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shop.gov"));
    let checked = gov_compiler::check(std::slice::from_ref(&shop));
    let model = checked.model.expect("shop.gov has no errors");
    assert_eq!(model.service_names(), ["inventory", "order"]);
    assert_eq!(model.lower(), bundle(&[shop]));
}

#[test]
fn mode_shadow_lowers_to_the_rule_header_and_shows_in_a_plan() {
    let text = |mode: &str| {
        format!(
            "service a {{\n  match api = path prefix \"/api\"\n  limit l on api {{\n    calls 10 per 1s\n{mode}  }}\n  fuse f on api {{\n    trip when errors >= 5 over 10s\n  }}\n}}\n"
        )
    };
    let enforce = bundle(&[SourceFile::new("a.gov", text(""))]);
    let shadow = bundle(&[SourceFile::new("a.gov", text("    mode shadow stamp\n"))]);
    let explicit = bundle(&[SourceFile::new("a.gov", text("    mode enforce\n"))]);
    let rules = |b: &Bundle| {
        b.targets[0]
            .rules
            .iter()
            .map(|r| (r.name.clone(), r.mode(), r.stamp_would_reject))
            .collect::<Vec<_>>()
    };
    use gov_proto::v1::Mode;
    assert_eq!(
        rules(&shadow),
        [
            ("a/l".to_owned(), Mode::Shadow, true),
            ("a/f".to_owned(), Mode::Enforce, false)
        ]
    );
    // `mode enforce` is the default, written or not.
    assert_eq!(versions(&enforce), versions(&explicit));
    insta::assert_snapshot!(plan(&enforce, &shadow).render(), @r"
    ~ service a
      ~ limit a/l: mode (none) -> shadow stamp

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");

    // `govc apply --shadow`: every rule, with new versions.
    let mut all = enforce.clone();
    gov_compiler::lower::shadow_all(&mut all);
    assert!(
        all.targets[0]
            .rules
            .iter()
            .all(|r| r.mode() == Mode::Shadow)
    );
    assert_ne!(all.version, enforce.version);
    assert_eq!(
        all.targets[0].version,
        gov_compiler::lower::target_version(&all.targets[0])
    );
}

#[test]
fn a_mode_written_twice_is_a_duplicate_setting() {
    let Err(d) = compile(&[SourceFile::new(
        "a.gov",
        "service a {\n  bulkhead b on any {\n    max_concurrent 2\n    mode shadow\n    mode enforce\n  }\n}\n",
    )]) else {
        panic!("two modes compile")
    };
    let codes: Vec<String> = d
        .iter()
        .filter_map(|d| miette::Diagnostic::code(d).map(|c| c.to_string()))
        .collect();
    assert_eq!(codes, ["gov::duplicate-setting"], "{d:?}");
    assert!(
        d.iter()
            .any(|d| d.to_string().contains("`mode` is set twice"))
    );
}

#[test]
fn paths_servlet_lowers_to_the_config_shows_in_a_plan_and_reads_match_paths_as_a_servlet() {
    let text = |paths: &str| {
        format!(
            "service a {{\n{paths}  limit l on path prefix \"/admin\" {{\n    calls 10 per 1s\n  }}\n}}\n"
        )
    };
    let default = bundle(&[SourceFile::new("a.gov", text(""))]);
    let strict = bundle(&[SourceFile::new("a.gov", text("  paths strict\n"))]);
    let servlet = bundle(&[SourceFile::new("a.gov", text("  paths servlet\n"))]);
    use gov_proto::v1::PathDialect;
    assert_eq!(default.targets[0].paths(), PathDialect::Strict);
    assert_eq!(servlet.targets[0].paths(), PathDialect::Servlet);
    // `paths strict` is the default, written or not.
    assert_eq!(versions(&default), versions(&strict));
    assert_ne!(versions(&default), versions(&servlet));
    insta::assert_snapshot!(plan(&default, &servlet).render(), @r"
    ~ service a
      ~ settings a: paths (none) -> servlet

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");

    // A match path with parameters can never match a servlet service's paths.
    let Err(d) = compile(&[SourceFile::new(
        "a.gov",
        "service a {\n  paths servlet\n  limit l on path prefix \"/a;v=1\" { calls 1 per 1s }\n}\n",
    )]) else {
        panic!("a path with parameters compiles for a servlet service")
    };
    let codes: Vec<String> = d
        .iter()
        .filter_map(|d| miette::Diagnostic::code(d).map(|c| c.to_string()))
        .collect();
    assert_eq!(codes, ["gov::path-not-normal"], "{d:?}");

    // Twice is a duplicate setting.
    let Err(d) = compile(&[SourceFile::new(
        "a.gov",
        "service a {\n  paths servlet\n  paths strict\n}\n",
    )]) else {
        panic!("two `paths` compile")
    };
    assert!(
        d.iter()
            .any(|d| d.to_string().contains("`paths` is set twice")),
        "{d:?}"
    );
}

/// `max_keys` and `overflow` reach the wire (issue 29); without them the
/// wire says 0 (the agent's `--max-keys-per-rule`) and share.
#[test]
fn key_caps_are_lowered() {
    use gov_proto::v1::{KeyOverflow, rule::Spec};
    let text = r#"
service order {
  match api = path prefix "/api"
  limit capped on api {
    calls 100 per 1m
    per consumer
    max_keys 20000
    overflow reject
  }
  limit plain on api {
    calls 5 per 1s
    per consumer
  }
}
"#;
    let b = bundle(&[SourceFile::new("caps.gov", text.to_owned())]);
    let rules = &b.targets[0].rules;
    let limit = |name: &str| match rules.iter().find(|r| r.name == name).unwrap().spec.as_ref() {
        Some(Spec::Limit(l)) => l.clone(),
        other => panic!("{other:?}"),
    };
    let capped = limit("order/capped");
    assert_eq!(
        (capped.max_keys, capped.overflow()),
        (20000, KeyOverflow::Reject)
    );
    let plain = limit("order/plain");
    assert_eq!((plain.max_keys, plain.overflow()), (0, KeyOverflow::Share));
}

/// `consumer from jwt` reaches the wire (issue 29); `consumer from header`
/// stays the header as before (no source on the wire).
#[test]
fn consumer_sources_are_lowered() {
    use gov_proto::v1::{OnInvalid, consumer_source::Kind};
    let text = r#"
service order {
  consumer from jwt header "Authorization" issuer "https://idp" audience "order" keys "idp.jwks" claim "client_id" on invalid count
}
service billing {
  consumer from header "X-Caller"
}
"#;
    let b = bundle(&[SourceFile::new("consumers.gov", text.to_owned())]);
    let order = b.targets.iter().find(|t| t.service == "order").unwrap();
    assert_eq!(order.consumer_header, "x-gov-consumer");
    let Some(Kind::Jwt(jwt)) = order.consumer_source.as_ref().and_then(|s| s.kind.as_ref()) else {
        panic!("{order:?}");
    };
    assert_eq!(
        (
            jwt.header.as_str(),
            jwt.issuer.as_str(),
            jwt.audience.as_str(),
            jwt.keys_file.as_str(),
            jwt.claim.as_str(),
            jwt.on_invalid()
        ),
        (
            "authorization",
            "https://idp",
            "order",
            "idp.jwks",
            "client_id",
            OnInvalid::Count
        )
    );
    let billing = b.targets.iter().find(|t| t.service == "billing").unwrap();
    assert_eq!(billing.consumer_header, "x-caller");
    assert!(billing.consumer_source.is_none());
}

#[test]
fn paths_case_insensitive_lowers_alone_or_with_servlet_and_conflicts_are_reported() {
    use gov_proto::v1::PathDialect;
    let text = |paths: &str| {
        format!(
            "service a {{\n{paths}  limit l on path prefix \"/admin\" {{\n    calls 10 per 1s\n  }}\n}}\n"
        )
    };
    let reading = |paths: &str| bundle(&[SourceFile::new("a.gov", text(paths))]).targets[0].paths();
    assert_eq!(
        reading("  paths case-insensitive\n"),
        PathDialect::StrictCaseInsensitive
    );
    assert_eq!(
        reading("  paths strict case-insensitive\n"),
        PathDialect::StrictCaseInsensitive
    );
    assert_eq!(
        reading("  paths servlet case-insensitive\n"),
        PathDialect::ServletCaseInsensitive
    );
    assert_eq!(
        reading("  paths case-insensitive servlet\n"),
        PathDialect::ServletCaseInsensitive
    );
    let default = bundle(&[SourceFile::new("a.gov", text(""))]);
    let both = bundle(&[SourceFile::new(
        "a.gov",
        text("  paths servlet case-insensitive\n"),
    )]);
    insta::assert_snapshot!(plan(&default, &both).render(), @r"
    ~ service a
      ~ settings a: paths (none) -> servlet case-insensitive

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");

    let codes = |paths: &str| -> Vec<String> {
        match compile(&[SourceFile::new("a.gov", text(paths))]) {
            Ok(_) => Vec::new(),
            Err(d) => d
                .iter()
                .filter_map(|d| miette::Diagnostic::code(d).map(|c| c.to_string()))
                .collect(),
        }
    };
    assert_eq!(
        codes("  paths strict servlet\n"),
        ["gov::conflicting-paths"]
    );
    assert_eq!(
        codes("  paths servlet case-insensitive case-insensitive\n"),
        ["gov::conflicting-paths"]
    );
    assert_eq!(
        codes("  paths servlet case_insensitive\n"),
        ["gov::unknown-paths"]
    );
    // The words are one line: the next line starts another statement.
    assert_eq!(
        codes("  paths servlet\n  capacity workers 4\n"),
        Vec::<String>::new()
    );
    // A letter that folds to ASCII in a match path can never match.
    assert_eq!(
        codes(
            "  paths case-insensitive\n  limit m on path prefix \"/adm%C4%B1n\" { calls 1 per 1s }\n"
        ),
        ["gov::path-not-normal"]
    );
}

/// The algorithm a limit lowers to: the token bucket by default, with a
/// burst of 5% of the amount (at least 10, or the amount if smaller), or the
/// declared one, in every scope (`sync batch` leases every algorithm);
/// a `plan` shows a change of algorithm.
#[test]
fn a_limit_lowers_its_declared_or_default_algorithm() {
    use gov_proto::v1::{LimitAlgorithm, rule::Spec};
    let lowered = |settings: &str| {
        let b = bundle(&[SourceFile::new(
            "a.gov",
            format!("service a {{\n  limit l on any {{\n{settings}\n  }}\n}}\n"),
        )]);
        let Some(Spec::Limit(l)) = b.targets[0].rules[0].spec.clone() else {
            panic!("a limit")
        };
        (l.algorithm(), l.burst)
    };
    use LimitAlgorithm::{FixedWindow, SlidingWindow, TokenBucket};
    assert_eq!(lowered("calls 100 per 1s"), (TokenBucket, 10));
    assert_eq!(lowered("calls 4 per 1m"), (TokenBucket, 4));
    assert_eq!(lowered("calls 1000 per 1s"), (TokenBucket, 50));
    assert_eq!(lowered("calls 1001 per 1s"), (TokenBucket, 51));
    assert_eq!(lowered("calls 100 per 1s burst 30"), (TokenBucket, 30));
    assert_eq!(
        lowered("calls 100 per 1s\n    algorithm token bucket"),
        (TokenBucket, 10)
    );
    assert_eq!(
        lowered("calls 100 per 1s\n    algorithm fixed window"),
        (FixedWindow, 0)
    );
    assert_eq!(
        lowered("calls 100 per 1s\n    algorithm sliding window"),
        (SlidingWindow, 0)
    );
    assert_eq!(
        lowered("calls 100 per 1s\n    scope cluster sync batch 100ms"),
        (TokenBucket, 10)
    );
    assert_eq!(
        lowered(
            "calls 100 per 1s\n    algorithm sliding window\n    scope cluster sync batch 100ms"
        ),
        (SlidingWindow, 0)
    );
    assert_eq!(lowered("bytes 1MiB per 1s"), (FixedWindow, 0));

    let text = |algorithm: &str| {
        SourceFile::new(
            "a.gov",
            format!(
                "service a {{\n  limit l on any {{\n    calls 10 per 1s\n{algorithm}  }}\n}}\n"
            ),
        )
    };
    let before = bundle(&[text("")]);
    let after = bundle(&[text("    algorithm sliding window\n")]);
    insta::assert_snapshot!(plan(&before, &after).render(), @r"
    ~ service a
      ~ limit a/l: algorithm token bucket burst 10 -> sliding window

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
}

/// `headers always` lowers to `ratelimit_headers_always` (`headers on
/// reject`, the default, to its absence) and shows in a plan; a misspelt
/// value is an error, not a silent default.
#[test]
fn a_limit_lowers_whether_admitted_calls_carry_the_ratelimit_headers() {
    use gov_proto::v1::rule::Spec;
    let text = |settings: &str| {
        SourceFile::new(
            "a.gov",
            format!("service a {{\n  limit l on any {{\n    calls 10 per 1s\n{settings}  }}\n}}\n"),
        )
    };
    let always = |settings: &str| {
        let b = bundle(&[text(settings)]);
        let Some(Spec::Limit(l)) = b.targets[0].rules[0].spec.clone() else {
            panic!("a limit")
        };
        l.ratelimit_headers_always
    };
    assert!(!always(""));
    assert!(always("    headers always\n"));
    assert!(!always("    headers on reject\n"));
    let before = bundle(&[text("")]);
    let after = bundle(&[text("    headers always\n")]);
    insta::assert_snapshot!(plan(&before, &after).render(), @r"
    ~ service a
      ~ limit a/l: headers on reject -> always

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
    assert!(
        compile(&[text("    headers sometimes\n")]).is_err(),
        "`headers sometimes` compiles"
    );
}

/// `expires T` is written as is; `for D` is anchored by the apply that
/// introduces it, and a later apply that keeps the rule's name and `for`
/// keeps the anchor (and the version), whatever else changed; a changed
/// `for` starts again.
#[test]
fn expiry_is_lowered_and_a_for_keeps_its_anchor_across_applies() {
    let policy = |rate: u32, life: &str| {
        let text = format!(
            "service s {{\n  limit a on any {{ calls {rate} per 1s  {life} }}\n  limit b on path prefix \"/b\" {{ calls 1 per 1s  expires 2026-12-31T00:00Z }}\n}}\n"
        );
        bundle(&[SourceFile::new("s.gov", text)])
    };
    let rule = |b: &Bundle, i: usize| b.targets[0].rules[i].clone();
    let first = policy(10, "for 2h");
    assert_eq!(rule(&first, 1).expires_at_unix_ms, 1_798_675_200_000);
    assert_eq!(
        (rule(&first, 0).for_ms, rule(&first, 0).expires_at_unix_ms),
        (7_200_000, 0)
    );
    let mut applied = first.clone();
    gov_compiler::lower::anchor_expiry(&mut applied, &Bundle::default(), 1_000);
    assert_eq!(rule(&applied, 0).expires_at_unix_ms, 7_201_000);
    assert_ne!(applied.version, first.version);
    // The same policy applied later: the same anchor, the same version.
    let mut again = first.clone();
    gov_compiler::lower::anchor_expiry(&mut again, &applied, 5_000_000);
    assert_eq!(rule(&again, 0).expires_at_unix_ms, 7_201_000);
    assert_eq!(again.version, applied.version);
    // Another rate, the same `for`: the clock does not restart.
    let mut tuned = policy(20, "for 2h");
    gov_compiler::lower::anchor_expiry(&mut tuned, &applied, 5_000_000);
    assert_eq!(rule(&tuned, 0).expires_at_unix_ms, 7_201_000);
    // Another `for`: it starts at this apply.
    let mut longer = policy(10, "for 3h");
    gov_compiler::lower::anchor_expiry(&mut longer, &applied, 5_000_000);
    assert_eq!(rule(&longer, 0).expires_at_unix_ms, 15_800_000);
}

/// Keys on attributes lower to their wire parts: a segment with every
/// prefix of the match (through references) that captures it, gRPC
/// metadata as the header it travels in (lower case), a query by its name.
#[test]
fn keys_on_attributes_lower_to_parts() {
    use gov_proto::v1::limit_key_part::Kind;
    use gov_proto::v1::rule::Spec;
    let text = r#"
service order {
  consumer from peer on invalid reject
  match eu = path prefix "/eu/" segment "tenant"
  match us = path prefix "/us/v1/" segment "tenant"
  match tenants = eu or us
  match lookup = grpc method "order.v1.Orders/Get"

  limit by_tenant on tenants {
    calls 5 per 1s
    per segment "tenant", query "api_key", consumer
  }
  limit by_metadata on lookup {
    calls 5 per 1s
    per metadata "X-Tenant"
  }
}
"#;
    let b = bundle(&[SourceFile::new("keys.gov", text.to_owned())]);
    let rules = &b.targets[0].rules;
    let parts = |name: &str| match rules.iter().find(|r| r.name == name).unwrap().spec.as_ref() {
        Some(Spec::Limit(l)) => {
            assert_eq!(l.key, 0, "LIMIT_KEY_ALL beside parts");
            l.key_parts
                .iter()
                .map(|p| p.kind.clone().unwrap())
                .collect::<Vec<_>>()
        }
        other => panic!("{other:?}"),
    };
    let tenant = parts("order/by_tenant");
    match &tenant[0] {
        Kind::Segment(s) => {
            assert_eq!(s.name, "tenant");
            assert_eq!(s.prefixes, ["/eu/", "/us/v1/"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tenant[1], Kind::Query("api_key".into()));
    assert_eq!(
        tenant[2],
        Kind::Key(gov_proto::v1::LimitKey::Consumer as i32)
    );
    assert_eq!(
        parts("order/by_metadata"),
        [Kind::Header("x-tenant".into())]
    );
}

#[test]
fn a_slow_call_trip_lowers_its_threshold_and_shows_it_in_a_plan() {
    let policy = |slower: &str| {
        bundle(&[SourceFile::new(
            "a.gov",
            format!(
                "service a {{\n  match report = path prefix \"/report\"\n  fuse f on report {{\n    trip when slow_call_ratio > 50% over 1m slower than {slower} min_calls 20\n    trip when slow_calls >= 100 over 1m slower than 2s\n    trip when errors >= 5 over 10s\n  }}\n}}\n"
            ),
        )])
    };
    let old = policy("2s");
    let gov_proto::v1::rule::Spec::Fuse(f) = old.targets[0].rules[0].spec.as_ref().unwrap() else {
        panic!("a fuse");
    };
    let lowered: Vec<_> = f
        .trips
        .iter()
        .map(|t| (t.metric(), t.slow_ms, t.count, t.ratio_milli_percent))
        .collect();
    assert_eq!(
        lowered,
        [
            (gov_proto::v1::TripMetric::SlowCallRatio, 2_000, 0, 50_000),
            (gov_proto::v1::TripMetric::SlowCalls, 2_000, 100, 0),
            (gov_proto::v1::TripMetric::Errors, 0, 5, 0),
        ]
    );
    insta::assert_snapshot!(plan(&old, &policy("1500ms")).render(), @r"
    ~ service a
      ~ fuse a/f: trip 1 slow_call_ratio > 50% over 1m slower than 2s min_calls 20 -> slow_call_ratio > 50% over 1m slower than 1.5s min_calls 20

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
}

/// `outlier` blocks lower to `TargetConfig.outlier` and `outlier_targets`,
/// every value written (a callee's block takes what it leaves out from the
/// service-wide one, then the defaults), and show in a plan; without a block
/// the wire has none (the agent's defaults, the fixed rule of before).
#[test]
fn outlier_blocks_lower_every_value_and_show_in_a_plan() {
    let text = |outlier: &str| {
        format!(
            "service web {{\n  match co = calls to checkout\n{outlier}}}\n\nservice checkout {{}}\n\nservice billing {{}}\n"
        )
    };
    let none = bundle(&[SourceFile::new("a.gov", text(""))]);
    let web = |b: &Bundle| {
        b.targets
            .iter()
            .find(|t| t.service == "web")
            .unwrap()
            .clone()
    };
    assert_eq!(web(&none).outlier, None);
    assert!(web(&none).outlier_targets.is_empty());

    let declared = bundle(&[SourceFile::new(
        "a.gov",
        text(
            "  outlier { consecutive_failures 3 }\n  \
             outlier to checkout {\n    eject 30s growth 3x max 5m\n    max_ejected 50%\n    on status 500..599 429\n  }\n",
        ),
    )]);
    use gov_proto::v1::{OutlierPolicy, StatusRange};
    let defaults = gov_proto::compiled::outlier_defaults();
    let wide = OutlierPolicy {
        consecutive_failures: 3,
        ..defaults.clone()
    };
    assert_eq!(web(&declared).outlier, Some(wide));
    let t = &web(&declared).outlier_targets;
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].service, "checkout");
    assert_eq!(
        t[0].policy,
        Some(OutlierPolicy {
            consecutive_failures: 3,
            eject_ms: 30_000,
            growth: 3,
            max_eject_ms: 300_000,
            max_ejected_milli_percent: 50_000,
            status: vec![
                StatusRange { from: 500, to: 599 },
                StatusRange { from: 429, to: 429 }
            ],
        })
    );
    // An ejection above the inherited ceiling raises it.
    let long = bundle(&[SourceFile::new(
        "a.gov",
        text("  outlier to checkout { eject 2m }\n"),
    )]);
    let p = web(&long).outlier_targets[0].policy.clone().unwrap();
    assert_eq!((p.eject_ms, p.max_eject_ms), (120_000, 120_000));
    // A callee no file defines is an unknown service.
    let Err(d) = compile(&[SourceFile::new(
        "a.gov",
        text("  outlier to checkuot { eject 2m }\n"),
    )]) else {
        panic!("an outlier block to an unknown service compiles")
    };
    let codes: Vec<String> = d
        .iter()
        .filter_map(|d| miette::Diagnostic::code(d).map(|c| c.to_string()))
        .collect();
    assert_eq!(codes, ["gov::unknown-service"], "{d:?}");

    insta::assert_snapshot!(plan(&none, &declared).render(), @r"
    ~ service web
      ~ settings web: outlier (none) -> consecutive_failures 3 eject 1s growth 2x max 1m
      ~ settings web: outlier to checkout (none) -> consecutive_failures 3 eject 30s growth 3x max 5m max_ejected 50% on status 500..599 429

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
}

/// `max_concurrent adaptive min N max M` lowers to `max_concurrent M` (the
/// ceiling an older agent enforces) and `adaptive {min, max}`; a plan shows
/// a fixed bulkhead turning adaptive; the bounds are checked.
#[test]
fn an_adaptive_bulkhead_lowers_its_bounds_shows_in_a_plan_and_is_checked() {
    use gov_proto::v1::{AdaptiveLimit, rule::Spec};
    let text = |max: &str| {
        SourceFile::new(
            "a.gov",
            format!(
                "service a {{\n  capacity workers 64\n  bulkhead b on any {{\n    max_concurrent {max}\n  }}\n}}\n"
            ),
        )
    };
    let fixed = bundle(&[text("10")]);
    let adaptive = bundle(&[text("adaptive min 4 max 64")]);
    let Some(Spec::Bulkhead(b)) = adaptive.targets[0].rules[0].spec.clone() else {
        panic!("a bulkhead")
    };
    assert_eq!(b.max_concurrent, 64);
    assert_eq!(b.adaptive, Some(AdaptiveLimit { min: 4, max: 64 }));
    let Some(Spec::Bulkhead(b)) = fixed.targets[0].rules[0].spec.clone() else {
        panic!("a bulkhead")
    };
    assert_eq!(b.adaptive, None);
    insta::assert_snapshot!(plan(&fixed, &adaptive).render(), @r"
    ~ service a
      ~ bulkhead a/b: max_concurrent 10 -> adaptive 4..64

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
    let codes = |max: &str| match compile(&[text(max)]) {
        Ok(_) => Vec::new(),
        Err(d) => d.iter().map(|d| d.code_str()).collect::<Vec<_>>(),
    };
    assert_eq!(codes("adaptive min 0 max 8"), ["gov::non-positive"]);
    assert_eq!(codes("adaptive min 9 max 8"), ["gov::adaptive-range"]);
    assert_eq!(
        codes("adaptive min 4 max 65"),
        ["gov::adaptive-over-workers"]
    );
    assert_eq!(
        codes("adaptive min 4 max 99999999999"),
        ["gov::adaptive-over-workers", "gov::too-large"]
    );
    assert_eq!(codes("adaptive max 8"), ["gov::syntax"]);
}

/// `share by consumer { ... }` lowers to the wire's `FairShare` (`default`
/// 1 unless written, the names as written, a string too), formats back as
/// written, and shows in a plan.
#[test]
fn a_fair_share_lowers_formats_and_shows_in_a_plan() {
    use gov_proto::v1::{FairShare, ShareWeight, rule::Spec};
    let text = |share: &str| {
        SourceFile::new(
            "a.gov",
            format!(
                "service a {{\n  consumer from header \"x-gov-consumer\"\n  match crm = consumer \"crm\"\n  match eu = consumer \"crm-eu\"\n  bulkhead b on any {{\n    max_concurrent 10\n    max_wait 20ms\n{share}  }}\n}}\n"
            ),
        )
    };
    let plain = bundle(&[text("")]);
    let shared = bundle(&[text("    share by consumer { crm 3 \"crm-eu\" 2 }\n")]);
    let Some(Spec::Bulkhead(b)) = shared.targets[0].rules[0].spec.clone() else {
        panic!("a bulkhead")
    };
    let w = |c: &str, weight| ShareWeight {
        consumer: c.into(),
        weight,
    };
    assert_eq!(
        b.share,
        Some(FairShare {
            weights: vec![w("crm", 3), w("crm-eu", 2)],
            default_weight: 1,
        })
    );
    let with_default = bundle(&[text("    share by consumer { crm 3 default 5 }\n")]);
    let Some(Spec::Bulkhead(b)) = with_default.targets[0].rules[0].spec.clone() else {
        panic!("a bulkhead")
    };
    assert_eq!(b.share.map(|s| s.default_weight), Some(5));
    insta::assert_snapshot!(plan(&plain, &shared).render(), @r"
    ~ service a
      ~ bulkhead a/b: share by consumer (none) -> crm 3, crm-eu 2, default 1

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
    let src = "service a {\n  bulkhead b on any {\n    max_concurrent 10\n    share by consumer {  crm 3\n  web 1 }\n  }\n}\n";
    let formatted = gov_lang::format(&gov_lang::parse("a.gov", src).unwrap(), src);
    assert!(
        formatted.contains("    share by consumer { crm 3 web 1 }\n"),
        "{formatted}"
    );
}
