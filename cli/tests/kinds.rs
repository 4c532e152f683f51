//! Every rule kind goes through the whole pipeline the same way: `.gov` text
//! -> compiled config (gov-compiler) -> engine (gov-engine, one governed
//! call per rule) -> stats -> a row of the TUI's rules table that shows the
//! kind's word and the rule's name.
//!
//! Written over the list [`kinds`], never over a kind: a new rule kind is
//! covered by adding its generator there, and
//! `every_rule_kind_has_a_generator` fails until it is.

use gov_compiler::SourceFile;
use gov_engine::{CompiledConfig, Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::{ClusterView, RuleKind, RuleView};
use gov_tui::{App, Msg, update};
use http::{HeaderMap, Method};
use proptest::prelude::*;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

/// One generator per rule kind: the `.gov` text of a rule of that kind,
/// with `NAME` for its name and `ON` for its match.
fn kinds() -> Vec<(RuleKind, BoxedStrategy<String>)> {
    vec![
        (
            RuleKind::Bulkhead,
            (
                1u32..500,
                0u32..50,
                prop::option::of(prop::sample::select(vec![408u32, 429, 503])),
            )
                .prop_map(|(max, wait, reject)| {
                    let reject = reject.map_or(String::new(), |s| format!("    reject with {s}\n"));
                    format!(
                        "  bulkhead NAME on ON {{\n    max_concurrent {max}\n    max_wait {wait}ms\n{reject}  }}\n"
                    )
                })
                .boxed(),
        ),
        (
            RuleKind::Limit,
            (
                1u64..10_000,
                prop::sample::select(vec!["100ms", "1s", "1m"]),
                any::<bool>(),
            )
                .prop_map(|(calls, window, latched)| {
                    let release = if latched { "    release after 2h\n" } else { "" };
                    format!("  limit NAME on ON {{\n    calls {calls} per {window}\n{release}  }}\n")
                })
                .boxed(),
        ),
        (
            RuleKind::Fuse,
            (1u64..100, 1u32..100, any::<bool>())
                .prop_map(|(count, percent, auto)| {
                    let recover = if auto {
                        "    recover after 30s probe 2\n"
                    } else {
                        ""
                    };
                    format!(
                        "  fuse NAME on ON {{\n    trip when errors >= {count} over 10s\n    trip when error_ratio > {percent}% over 1m min_calls 5\n{recover}  }}\n"
                    )
                })
                .boxed(),
        ),
        (
            // Outbound only: `ON` is a match on `calls to` (see `outbound`).
            RuleKind::Retry,
            (2u32..5, 0u32..100, 0u32..20)
                .prop_map(|(attempts, percent, min)| {
                    format!(
                        "  retry NAME on ON {{\n    attempts {attempts}\n    budget {percent}% min {min} per 1s\n  }}\n"
                    )
                })
                .boxed(),
        ),
    ]
}

/// The kinds whose rules apply to outbound calls only: their match is
/// `calls to inv and ...`, and their call is one to `inv`.
fn outbound(kind: RuleKind) -> bool {
    kind == RuleKind::Retry
}

#[test]
fn every_rule_kind_has_a_generator() {
    let covered: Vec<RuleKind> = kinds().into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        covered,
        RuleKind::RULES,
        "add a generator for every rule kind"
    );
}

/// The cells of a rendered line (borders and quotes dropped).
fn cells(line: &str) -> Vec<&str> {
    line.split(|c: char| c.is_whitespace() || c == '│' || c == '"')
        .filter(|c| !c.is_empty())
        .collect()
}

/// 1 or 2 rules of every kind.
fn policies() -> impl Strategy<Value = Vec<(RuleKind, Vec<String>)>> {
    kinds()
        .into_iter()
        .map(|(kind, rule)| prop::collection::vec(rule, 1..3).prop_map(move |r| (kind, r)))
        .collect::<Vec<_>>()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_kind_round_trips_text_to_a_tui_row(policy in policies()) {
        // Each rule on its own path, so that no two rules conflict.
        let mut text = String::from("service shop {\n");
        let mut rules = Vec::new();
        for (kind, bodies) in &policy {
            for body in bodies {
                let i = rules.len();
                let name = format!("{}{i}", kind.word());
                let to = if outbound(*kind) { "calls to inv and " } else { "" };
                text.push_str(&format!("  match m{i} = {to}path prefix \"/p{i}\"\n"));
                text.push_str(&body.replace("NAME", &name).replace("ON", &format!("m{i}")));
                rules.push((*kind, format!("shop/{name}"), format!("/p{i}")));
            }
        }
        text.push_str("}\nservice inv {\n}\n");

        let compiled = gov_compiler::compile(&[SourceFile::new("kinds.gov", text.as_str())])
            .map_err(|d| TestCaseError::fail(format!("{d:?}\n{text}")))?;
        let target = compiled.bundle.targets.iter().find(|t| t.service == "shop").unwrap();
        let config = CompiledConfig::try_from(target)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let engine = Engine::new(config);

        // One call through each rule.
        let headers = HeaderMap::new();
        for (kind, _, path) in &rules {
            let info = if outbound(*kind) {
                RequestInfo::outbound(&Method::GET, path, &headers, "inv", None)
            } else {
                RequestInfo::inbound(&Method::GET, path, &headers)
            };
            match engine.try_admit(&info) {
                Decision::Admitted(a) => a.finish(Outcome::Status(200)),
                _ => return Err(TestCaseError::fail(format!("a first call to {path} was not admitted"))),
            }
        }

        let stats = engine.stats().rules;
        prop_assert_eq!(stats.len(), rules.len());
        let view = ClusterView {
            at_unix_ms: 1,
            rules: stats
                .iter()
                .map(|s| RuleView {
                    rule: s.rule.to_string(),
                    kind: s.kind as i32,
                    source: target.rule(&s.rule).and_then(|r| r.source.clone()),
                    stats: Some(s.to_proto()),
                    ..Default::default()
                })
                .collect(),
            ..ClusterView::default()
        };
        let mut app = App::new("http://127.0.0.1:1", true, 1);
        update(&mut app, Msg::View(view));
        let mut terminal = Terminal::new(TestBackend::new(160, 60)).unwrap();
        terminal.draw(|f| gov_tui::render(&app, f)).unwrap();
        let screen = terminal.backend().to_string();

        for (kind, rule, _) in &rules {
            let s = stats.iter().find(|s| &*s.rule == rule.as_str());
            prop_assert_eq!(s.map(|s| (s.kind, s.admitted)), Some((*kind, 1)), "{}", rule);
            // The row of the rule, in cells: its name, then its kind.
            let row = screen.lines().map(cells).find(|c| c.first() == Some(&rule.as_str()));
            prop_assert!(
                row.is_some_and(|c| c.get(1) == Some(&kind.word())),
                "no row with `{}` and `{}`:\n{}", rule, kind.word(), screen
            );
        }
    }
}
