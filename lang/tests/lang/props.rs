//! Property tests over generated syntax trees: the formatter prints a tree
//! that parses back to the same tree, and formatting is idempotent.

use gov_lang::ast::*;
use proptest::prelude::*;

use super::common::parse_ok;

/// Words that can never be names (see `reserved` in `gov.pest`).
const RESERVED: &[&str] = &[
    "path", "method", "header", "consumer", "calls", "any", "and", "or", "service", "registry",
    "domain", "capacity", "match", "bulkhead", "limit", "fuse", "warmup", "shutdown",
];

fn sp<T>(node: T) -> Spanned<T> {
    Spanned::new(node, Span::default())
}

fn ident() -> impl Strategy<Value = Ident> {
    "[A-Za-z_][A-Za-z0-9_-]{0,8}"
        .prop_filter("reserved word", |s| !RESERVED.contains(&s.as_str()))
        .prop_map(sp)
}

/// Any text without line breaks, with quotes, backslashes and `#` common.
fn string() -> impl Strategy<Value = Str> {
    let ch = prop_oneof![
        Just('"'),
        Just('\\'),
        Just('#'),
        Just(' '),
        any::<char>().prop_filter("no line breaks", |c| !matches!(c, '\n' | '\r')),
    ];
    proptest::collection::vec(ch, 0..10).prop_map(|cs| sp(cs.into_iter().collect()))
}

fn int() -> impl Strategy<Value = Spanned<i64>> {
    prop_oneof![any::<i64>(), -5i64..1000].prop_map(sp)
}

fn duration() -> impl Strategy<Value = Spanned<Duration>> {
    let unit = prop_oneof![
        Just(TimeUnit::Millis),
        Just(TimeUnit::Seconds),
        Just(TimeUnit::Minutes),
        Just(TimeUnit::Hours)
    ];
    (any::<i64>(), unit).prop_map(|(value, unit)| sp(Duration { value, unit }))
}

fn size() -> impl Strategy<Value = Spanned<Size>> {
    let unit = prop_oneof![
        Just(SizeUnit::B),
        Just(SizeUnit::KB),
        Just(SizeUnit::MB),
        Just(SizeUnit::GB),
        Just(SizeUnit::KiB),
        Just(SizeUnit::MiB),
        Just(SizeUnit::GiB)
    ];
    (any::<i64>(), unit).prop_map(|(value, unit)| sp(Size { value, unit }))
}

fn percent() -> impl Strategy<Value = Spanned<Percent>> {
    prop_oneof![any::<i64>(), -1000i64..200_000].prop_map(|milli| sp(Percent { milli }))
}

fn rate<T: std::fmt::Debug + Clone>(
    amount: impl Strategy<Value = Spanned<T>>,
) -> impl Strategy<Value = Rate<T>> {
    (amount, duration()).prop_map(|(amount, window)| Rate { amount, window })
}

// === Matches ===

fn leaf() -> impl Strategy<Value = MatchExpr> {
    let span = Span::default();
    prop_oneof![
        (
            prop_oneof![Just(PathKind::Exact), Just(PathKind::Prefix)],
            string()
        )
            .prop_map(move |(kind, value)| MatchExpr::Path {
                kind,
                value,
                segment: None,
                span
            }),
        (string(), string()).prop_map(move |(value, name)| MatchExpr::Path {
            kind: PathKind::Prefix,
            value,
            segment: Some(name),
            span
        }),
        ident().prop_map(move |method| MatchExpr::Method { method, span }),
        (string(), string()).prop_map(move |(name, value)| MatchExpr::Header { name, value, span }),
        string().prop_map(move |name| MatchExpr::Consumer { name, span }),
        ident().prop_map(move |service| MatchExpr::CallsTo { service, span }),
        Just(MatchExpr::Any { span }),
        ident().prop_map(|name| MatchExpr::Ref { name }),
    ]
}

/// `a and b or c and d`, folded to the left as the parser does; operands
/// are atoms or groups, so the tree is one the parser can produce.
fn or_of(atom: impl Strategy<Value = MatchExpr> + Clone) -> impl Strategy<Value = MatchExpr> {
    let and = proptest::collection::vec(atom, 1..4).prop_map(|atoms| {
        fold(atoms, |lhs, rhs| MatchExpr::And {
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
            span: Span::default(),
        })
    });
    proptest::collection::vec(and, 1..3).prop_map(|ands| {
        fold(ands, |lhs, rhs| MatchExpr::Or {
            lhs: Box::new(lhs),
            rhs: Box::new(rhs),
            span: Span::default(),
        })
    })
}

fn fold(items: Vec<MatchExpr>, join: impl Fn(MatchExpr, MatchExpr) -> MatchExpr) -> MatchExpr {
    let mut it = items.into_iter();
    let first = it.next().unwrap();
    it.fold(first, join)
}

fn match_expr() -> impl Strategy<Value = MatchExpr> {
    let atom = leaf().prop_recursive(3, 24, 4, |atom| {
        or_of(atom).prop_map(|inner| MatchExpr::Group {
            inner: Box::new(inner),
            span: Span::default(),
        })
    });
    or_of(atom)
}

// === Statements ===

// A rule's settings are words and values; the generators below write
// the shapes the grammar gives each kind.

fn key(k: &'static str) -> Spanned<Word> {
    sp(Word::Key(k))
}

fn keys(ks: &[&'static str]) -> Vec<Spanned<Word>> {
    ks.iter().map(|k| key(k)).collect()
}

fn int_w() -> impl Strategy<Value = Spanned<Word>> {
    int().prop_map(|n| sp(Word::Int(n.node)))
}

fn duration_w() -> impl Strategy<Value = Spanned<Word>> {
    duration().prop_map(|d| sp(Word::Duration(d.node)))
}

fn setting(words: Vec<Spanned<Word>>) -> Setting {
    Setting {
        words,
        span: Span::default(),
    }
}

/// `words` then `value`.
fn then(
    words: &'static [&'static str],
    value: impl Strategy<Value = Spanned<Word>>,
) -> impl Strategy<Value = Setting> {
    value.prop_map(move |v| {
        let mut w = keys(words);
        w.push(v);
        setting(w)
    })
}

fn fixed(words: &'static [&'static str]) -> impl Strategy<Value = Setting> {
    Just(()).prop_map(move |()| setting(keys(words)))
}

/// `KEY AMOUNT per WINDOW`
fn rate_w(
    k: &'static str,
    amount: impl Strategy<Value = Spanned<Word>>,
) -> impl Strategy<Value = Setting> {
    (amount, duration_w()).prop_map(move |(a, d)| setting(vec![key(k), a, key("per"), d]))
}

fn bulkhead_setting() -> impl Strategy<Value = Setting> {
    prop_oneof![
        then(&["max_concurrent"], int_w()),
        then(&["max_wait"], duration_w()),
        then(&["queue"], int_w()),
        then(&["timeout"], duration_w()),
        then(&["reject", "with"], int_w()),
        fixed(&["per", "operation"]),
        fixed(&["per", "instance"]),
        fixed(&["per", "instance", "path"]),
        fixed(&["isolation", "semaphore"]),
        fixed(&["isolation", "pool"]),
        fixed(&["queue", "fifo"]),
        fixed(&["queue", "lifo"]),
        then(&["queue", "lifo", "interval"], duration_w()),
        (duration_w(), duration_w()).prop_map(|(t, i)| setting(vec![
            key("queue"),
            key("codel"),
            key("target"),
            t,
            key("interval"),
            i,
        ])),
    ]
}

fn limit_setting() -> impl Strategy<Value = Setting> {
    prop_oneof![
        rate_w("calls", int_w()),
        rate_w("bytes", size().prop_map(|s| sp(Word::Size(s.node)))),
        fixed(&["per", "all"]),
        fixed(&["per", "domain"]),
        fixed(&["per", "service"]),
        fixed(&["per", "consumer"]),
        (string(), string()).prop_map(|(h, q)| setting(vec![
            key("per"),
            key("header"),
            sp(Word::Str(h.node)),
            key(","),
            key("query"),
            sp(Word::Str(q.node)),
            key(","),
            key("consumer"),
        ])),
        string().prop_map(|c| setting(vec![
            key("per"),
            key("service"),
            key(","),
            key("claim"),
            sp(Word::Str(c.node)),
        ])),
        (string(), string()).prop_map(|(m, s)| setting(vec![
            key("per"),
            key("metadata"),
            sp(Word::Str(m.node)),
            key(","),
            key("segment"),
            sp(Word::Str(s.node)),
        ])),
        fixed(&["action", "reject"]),
        then(&["action", "shape", "max_delay"], duration_w()),
        then(&["reject", "with"], int_w()),
        then(&["release", "after"], duration_w()),
        fixed(&["release", "manual"]),
        fixed(&["scope", "local"]),
        fixed(&["scope", "cluster"]),
        fixed(&["scope", "cluster", "sync", "exact"]),
        then(&["scope", "cluster", "sync", "batch"], duration_w()),
    ]
}

fn fuse_setting() -> impl Strategy<Value = Setting> {
    let metric = prop::sample::select(vec![
        "business_errors",
        "business_error_ratio",
        "system_errors",
        "system_error_ratio",
        "errors",
        "error_ratio",
        "slow_calls",
        "slow_call_ratio",
    ]);
    let threshold = prop_oneof![int_w(), percent().prop_map(|p| sp(Word::Percent(p.node))),];
    let trip = (
        metric,
        prop::sample::select(vec![">", ">="]),
        threshold,
        duration_w(),
        proptest::option::of(duration_w()),
        proptest::option::of(int_w()),
    )
        .prop_map(|(metric, op, threshold, window, slower, min_calls)| {
            let mut w = vec![key("trip"), key("when"), key(metric), key(op), threshold];
            w.extend([key("over"), window]);
            if let Some(d) = slower {
                w.extend([key("slower"), key("than"), d]);
            }
            if let Some(n) = min_calls {
                w.extend([key("min_calls"), n]);
            }
            setting(w)
        });
    let range = (int(), proptest::option::of(int()))
        .prop_map(|(from, to)| vec![sp(Word::Range { from, to })]);
    let item = prop_oneof![
        proptest::collection::vec(range, 1..4).prop_map(|codes| {
            let mut w = vec![key("status")];
            w.extend(codes.into_iter().flatten());
            w
        }),
        Just(vec![key("connect_failure")]),
        Just(vec![key("timeout")]),
        Just(vec![key("reset")]),
    ];
    let classify = (
        prop::sample::select(vec!["business", "system"]),
        proptest::collection::vec(item, 1..4),
    )
        .prop_map(|(class, items)| {
            let mut w = vec![key("classify"), key(class)];
            w.extend(items.into_iter().flatten());
            setting(w)
        });
    let recover_after = (duration_w(), int_w()).prop_map(|(after, probes)| {
        setting(vec![
            key("recover"),
            key("after"),
            after,
            key("probe"),
            probes,
        ])
    });
    prop_oneof![
        trip,
        classify,
        fixed(&["recover", "manual"]),
        recover_after,
        then(&["reject", "with"], int_w()),
    ]
}

/// `KIND NAME on EXPR { SETTING... }`
fn rule_def(
    kind: &'static str,
    settings: impl Strategy<Value = Setting>,
) -> impl Strategy<Value = ServiceStmt> {
    (
        ident(),
        match_expr(),
        proptest::collection::vec(settings, 0..5),
    )
        .prop_map(move |(name, on, settings)| {
            ServiceStmt::Rule(RuleDef {
                kind: sp(kind),
                name,
                on,
                settings,
                span: Span::default(),
            })
        })
}

fn http_call() -> impl Strategy<Value = HttpCall> {
    (ident(), string()).prop_map(|(method, path)| HttpCall {
        method,
        path,
        span: Span::default(),
    })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        http_call().prop_map(Action::Http),
        ident().prop_map(|signal| Action::Signal {
            signal,
            span: Span::default()
        }),
    ]
}

fn warmup_step() -> impl Strategy<Value = WarmupStep> {
    let span = Span::default();
    prop_oneof![
        (
            http_call(),
            int(),
            duration(),
            proptest::option::of(duration()),
            proptest::option::of(duration())
        )
            .prop_map(
                move |(probe, status, every, after, timeout)| WarmupStep::Ready {
                    probe,
                    status,
                    every,
                    after,
                    timeout,
                    span,
                }
            ),
        Just(WarmupStep::Register { span }),
        (duration(), percent()).prop_map(move |(over, from)| WarmupStep::Ramp { over, from, span }),
        (ident(), action()).prop_map(move |(what, action)| WarmupStep::Start {
            what,
            action,
            span
        }),
    ]
}

fn shutdown_step() -> impl Strategy<Value = ShutdownStep> {
    let span = Span::default();
    prop_oneof![
        Just(ShutdownStep::Deregister { span }),
        duration().prop_map(move |duration| ShutdownStep::Wait { duration, span }),
        ident().prop_map(move |registry| ShutdownStep::WaitFor { registry, span }),
        (ident(), action()).prop_map(move |(what, action)| ShutdownStep::Stop {
            what,
            action,
            span
        }),
        duration().prop_map(move |deadline| ShutdownStep::Drain { deadline, span }),
    ]
}

fn service_stmt() -> impl Strategy<Value = ServiceStmt> {
    let span = Span::default();
    let capacity = prop_oneof![
        int().prop_map(move |count| Capacity::Workers { count, span }),
        int().prop_map(move |count| Capacity::Instances { count, span }),
        rate(int()).prop_map(move |rate| Capacity::Rate { rate, span }),
        int().prop_map(move |count| Capacity::Amplification { count, span }),
    ];
    let settings = |n| 0..n;
    prop_oneof![
        string().prop_map(move |name| ServiceStmt::Domain(DomainStmt { name, span })),
        ident().prop_map(move |name| ServiceStmt::Registry(UsesRegistry { name, span })),
        (string(), prop::collection::vec(string(), 0..3)).prop_map(move |(header, trusted)| {
            ServiceStmt::Consumer(ConsumerStmt {
                source: ConsumerSource::Header { header, trusted },
                span,
            })
        }),
        any::<bool>().prop_map(move |count| ServiceStmt::Consumer(ConsumerStmt {
            source: ConsumerSource::Peer {
                on_invalid: sp(if count {
                    OnInvalid::Count
                } else {
                    OnInvalid::Reject
                }),
            },
            span
        })),
        (
            string(),
            string(),
            string(),
            string(),
            string(),
            any::<bool>()
        )
            .prop_map(move |(header, issuer, audience, keys, claim, count)| {
                ServiceStmt::Consumer(ConsumerStmt {
                    source: ConsumerSource::Jwt(JwtSource {
                        header,
                        issuer,
                        audience,
                        keys,
                        claim,
                        on_invalid: sp(if count {
                            OnInvalid::Count
                        } else {
                            OnInvalid::Reject
                        }),
                    }),
                    span,
                })
            }),
        capacity.prop_map(ServiceStmt::Capacity),
        (
            ident(),
            match_expr(),
            proptest::option::of(duration()),
            proptest::option::of(prop_oneof![
                Just(Criticality::Critical),
                Just(Criticality::Default),
                Just(Criticality::Sheddable),
            ]),
        )
            .prop_map(move |(name, expr, latency, criticality)| {
                ServiceStmt::Match(MatchDef {
                    name,
                    expr,
                    latency,
                    criticality: criticality.map(|c| Spanned::new(c, span)),
                    span,
                })
            }),
        rule_def("bulkhead", bulkhead_setting()),
        rule_def("limit", limit_setting()),
        rule_def("fuse", fuse_setting()),
        proptest::collection::vec(warmup_step(), settings(5))
            .prop_map(move |steps| ServiceStmt::Warmup(Warmup { steps, span })),
        proptest::collection::vec(shutdown_step(), settings(5))
            .prop_map(move |steps| ServiceStmt::Shutdown(Shutdown { steps, span })),
    ]
}

fn item() -> impl Strategy<Value = Item> {
    let span = Span::default();
    let key = prop_oneof![
        Just(RegistryKey::ServerCache),
        Just(RegistryKey::ClientRefresh),
        Just(RegistryKey::BalancerRefresh)
    ];
    let setting = (key, duration()).prop_map(move |(key, value)| RegistrySetting {
        key: sp(key),
        value,
        span,
    });
    prop_oneof![
        (ident(), proptest::collection::vec(setting, 0..4)).prop_map(move |(name, settings)| {
            Item::Registry(Registry {
                name,
                settings,
                span,
            })
        }),
        (ident(), proptest::collection::vec(service_stmt(), 0..8))
            .prop_map(move |(name, body)| Item::Service(Service { name, body, span })),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    proptest::collection::vec(item(), 0..4).prop_map(|items| Policy {
        items,
        comments: Comments::default(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `parse(fmt(tree)) == tree` and `fmt(parse(fmt(tree))) == fmt(tree)`.
    #[test]
    fn format_then_parse_gives_the_same_tree(tree in policy()) {
        let text = gov_lang::format(&tree, "");
        let back = parse_ok("generated.gov", &text);
        prop_assert_eq!(&back, &tree, "text:\n{}", text);
        let again = gov_lang::format(&back, &text);
        prop_assert_eq!(again, text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Comments, blank lines and odd indentation added to formatted text:
    /// the tree is the same, every comment survives in order, and the
    /// result is stable.
    #[test]
    fn comments_and_blank_lines_survive_formatting(
        tree in policy(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), 0u8..5), 0..24),
    ) {
        let text = gov_lang::format(&tree, "");
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.is_empty() {
            lines.push(String::new());
        }
        for (i, (at, kind)) in edits.into_iter().enumerate() {
            let at = at.index(lines.len());
            match kind {
                0 => lines[at].push_str(&format!(" # trailing {i}")),
                1 => lines.insert(at, format!("# own line {i}")),
                2 => lines.insert(at, String::new()),
                3 => lines.insert(at, "\t ".to_owned()),
                _ => lines[at] = format!("      {}", lines[at].trim_start()),
            }
        }
        let src = lines.join("\n");
        let parsed = parse_ok("edited.gov", &src);
        prop_assert_eq!(&parsed, &tree, "source:\n{}", src);
        let texts = |p: &Policy| p.comments.0.iter().map(|c| c.text.clone()).collect::<Vec<_>>();
        let out = gov_lang::format(&parsed, &src);
        let back = parse_ok("formatted.gov", &out);
        prop_assert_eq!(&back, &tree);
        prop_assert_eq!(texts(&back), texts(&parsed), "source:\n{}\nformatted:\n{}", src, out);
        prop_assert_eq!(gov_lang::format(&back, &out), out.clone(), "source:\n{}", src);
    }
}
