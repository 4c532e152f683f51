//! TargetConfig survives YAML and JSON (the formats of `govc compile` and
//! `gov-agent --config`) unchanged, and the text is readable: enum names,
//! snake_case fields, numbers as numbers.

use gov_proto::v1::{
    Action, AdaptiveLimit, AutoRecovery, Bulkhead, BulkheadKey, ClusterSync, CompareOp, Direction,
    ErrorClass, Fuse, HeaderMatch, HttpCall, Invoke, LimitScope, Match, MatchExpr, MatchList,
    PathKind, PathMatch, Rate, ReadyProbe, Recovery, Release, Shutdown, ShutdownStep, SourceRef,
    StatusRange, TargetConfig, Trip, TripMetric, Wait, Warmup, WarmupStep, action, match_expr,
    recovery, release, shutdown_step, warmup_step,
};
use gov_proto::v1::{
    Criticality, GrpcCode, KeyOverflow, Limit, LimitAction, LimitKey, Mode, Queue, QueueCodel,
    Retry, RetryBudget, Rule, queue, rule::Spec,
};

fn src(line: u32, snippet: &str) -> Option<SourceRef> {
    Some(SourceRef {
        file: "shop.gov".into(),
        line,
        column: 3,
        snippet: snippet.into(),
    })
}

fn prefix(p: &str) -> MatchExpr {
    MatchExpr {
        kind: Some(match_expr::Kind::Path(PathMatch {
            kind: PathKind::Prefix as i32,
            value: p.into(),
        })),
    }
}

fn kind(k: match_expr::Kind) -> MatchExpr {
    MatchExpr { kind: Some(k) }
}

/// The `order` service of examples/shop.gov, compiled by hand.
fn order() -> TargetConfig {
    let supplier = kind(match_expr::Kind::And(MatchList {
        exprs: vec![
            prefix("/mdm/supplier"),
            kind(match_expr::Kind::Consumer("crm".into())),
        ],
    }));
    let writes = kind(match_expr::Kind::And(MatchList {
        exprs: vec![
            kind(match_expr::Kind::Or(MatchList {
                exprs: vec![
                    kind(match_expr::Kind::Method("POST".into())),
                    kind(match_expr::Kind::Method("PUT".into())),
                ],
            })),
            prefix("/orders"),
            kind(match_expr::Kind::Header(HeaderMatch {
                name: "x-tenant".into(),
                value: "gold".into(),
            })),
        ],
    }));
    let inventory = kind(match_expr::Kind::CallsTo("inventory".into()));
    TargetConfig {
        service: "order".into(),
        domain: "trade".into(),
        version: "5f1c0ffee".into(),
        consumer_header: "x-gov-consumer".into(),
        consumer_source: Some(gov_proto::v1::ConsumerSource {
            kind: Some(gov_proto::v1::consumer_source::Kind::Jwt(
                gov_proto::v1::JwtSource {
                    header: "authorization".into(),
                    issuer: "https://idp".into(),
                    audience: "order".into(),
                    keys_file: "idp.jwks".into(),
                    claim: "client_id".into(),
                    on_invalid: gov_proto::v1::OnInvalid::Count as i32,
                },
            )),
        }),
        registry: "eureka".into(),
        outlier: Some(gov_proto::v1::OutlierPolicy {
            consecutive_failures: 3,
            eject_ms: 10_000,
            growth: 2,
            max_eject_ms: 300_000,
            max_ejected_milli_percent: 50_000,
            status: Vec::new(),
        }),
        outlier_targets: vec![gov_proto::v1::OutlierTarget {
            service: "inventory".into(),
            policy: Some(gov_proto::v1::OutlierPolicy {
                consecutive_failures: 5,
                eject_ms: 30_000,
                growth: 3,
                max_eject_ms: 600_000,
                max_ejected_milli_percent: 100_000,
                status: vec![StatusRange { from: 500, to: 599 }],
            }),
        }],
        paths: gov_proto::v1::PathDialect::Servlet as i32,
        matches: vec![
            Match {
                name: "slow".into(),
                expr: Some(prefix("/benchmark/delay/z100")),
                latency_ms: 100,
                source: src(
                    23,
                    "match slow = path prefix \"/benchmark/delay/z100\" latency 100ms",
                ),
                criticality: Criticality::Sheddable as i32,
            },
            Match {
                name: "writes".into(),
                expr: Some(writes),
                latency_ms: 0,
                source: src(25, ""),
                criticality: 0,
            },
        ],
        rules: vec![
            Rule {
                name: "order/slow_calls".into(),
                source: src(30, "bulkhead slow_calls on slow {\n  max_concurrent 10\n}"),
                on: Some(prefix("/benchmark/delay/z100")),
                match_name: "slow".into(),
                direction: Direction::Inbound as i32,
                mode: Mode::Enforce as i32,
                stamp_would_reject: false,
                expires_at_unix_ms: 1_798_675_200_000,
                for_ms: 7_200_000,
                spec: Some(Spec::Bulkhead(Bulkhead {
                    key: BulkheadKey::Operation as i32,
                    max_concurrent: 10,
                    max_wait_ms: 10,
                    max_queue: None,
                    timeout_ms: 0,
                    reject_status: 408,
                    isolation: 0,
                    reject_grpc_status: GrpcCode::ResourceExhausted as i32,
                    max_keys: 0,
                    overflow: 0,
                    adaptive: Some(AdaptiveLimit { min: 4, max: 10 }),
                    share: None,
                    queue: Some(Queue {
                        kind: Some(queue::Kind::Codel(QueueCodel {
                            target_ms: 5,
                            interval_ms: 100,
                        })),
                    }),
                })),
            },
            Rule {
                name: "order/per_instance".into(),
                source: src(37, "bulkhead per_instance on calls to inventory { ... }"),
                on: Some(inventory.clone()),
                match_name: String::new(),
                direction: Direction::Outbound as i32,
                mode: Mode::Enforce as i32,
                stamp_would_reject: false,
                expires_at_unix_ms: 0,
                for_ms: 0,
                spec: Some(Spec::Bulkhead(Bulkhead {
                    key: BulkheadKey::Instance as i32,
                    max_concurrent: 20,
                    max_wait_ms: 50,
                    max_queue: Some(5),
                    timeout_ms: 2000,
                    reject_status: 0,
                    isolation: 0,
                    reject_grpc_status: 0,
                    max_keys: 300,
                    overflow: KeyOverflow::Reject as i32,
                    adaptive: None,
                    share: None,
                    queue: None,
                })),
            },
            Rule {
                name: "order/crm_supplier".into(),
                source: src(48, "limit crm_supplier on supplier { ... }"),
                on: Some(supplier.clone()),
                match_name: "supplier".into(),
                direction: 0,
                mode: Mode::Enforce as i32,
                stamp_would_reject: false,
                expires_at_unix_ms: 0,
                for_ms: 0,
                spec: Some(Spec::Limit(Limit {
                    calls: Some(Rate {
                        amount: 100,
                        window_ms: 1000,
                    }),
                    bytes: Some(Rate {
                        amount: 10 * 1024 * 1024,
                        window_ms: 60_000,
                    }),
                    key: LimitKey::Consumer as i32,
                    action: LimitAction::Reject as i32,
                    max_delay_ms: 0,
                    reject_status: 429,
                    reject_grpc_status: GrpcCode::ResourceExhausted as i32,
                    release: Some(Release {
                        kind: Some(release::Kind::AfterMs(7_200_000)),
                    }),
                    scope: LimitScope::Cluster as i32,
                    sync: ClusterSync::Batch as i32,
                    sync_batch_ms: 100,
                    sync_timeout_ms: 0,
                    fallback: 0,
                    max_keys: 20_000,
                    overflow: KeyOverflow::Share as i32,
                    algorithm: 0,
                    burst: 0,
                    warmup_scale: true,
                    ratelimit_headers_always: true,
                    key_parts: vec![
                        gov_proto::v1::LimitKeyPart {
                            kind: Some(gov_proto::v1::limit_key_part::Kind::Header(
                                "x-tenant".into(),
                            )),
                        },
                        gov_proto::v1::LimitKeyPart {
                            kind: Some(gov_proto::v1::limit_key_part::Kind::Segment(
                                gov_proto::v1::PathSegment {
                                    name: "region".into(),
                                    prefixes: vec!["/mdm/supplier/".into()],
                                },
                            )),
                        },
                    ],
                    share: Some(gov_proto::v1::FairShare {
                        weights: vec![gov_proto::v1::ShareWeight {
                            consumer: "crm".into(),
                            weight: 3,
                        }],
                        default_weight: 1,
                    }),
                })),
            },
            Rule {
                name: "order/inventory_pace".into(),
                source: src(57, "limit inventory_pace on calls to inventory { ... }"),
                on: Some(inventory),
                direction: Direction::Outbound as i32,
                mode: Mode::Enforce as i32,
                stamp_would_reject: false,
                expires_at_unix_ms: 0,
                for_ms: 0,
                spec: Some(Spec::Limit(Limit {
                    calls: Some(Rate {
                        amount: 500,
                        window_ms: 1000,
                    }),
                    action: LimitAction::Shape as i32,
                    max_delay_ms: 200,
                    release: Some(Release {
                        kind: Some(release::Kind::Manual(true)),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            },
            Rule {
                name: "order/mdm".into(),
                source: src(65, "fuse mdm on supplier { ... }"),
                on: Some(supplier),
                match_name: "supplier".into(),
                direction: 0,
                mode: Mode::Enforce as i32,
                stamp_would_reject: false,
                expires_at_unix_ms: 0,
                for_ms: 0,
                spec: Some(Spec::Fuse(Fuse {
                    trips: vec![
                        Trip {
                            metric: TripMetric::BusinessErrorRatio as i32,
                            op: CompareOp::Gt as i32,
                            count: 0,
                            ratio_milli_percent: 50_000,
                            window_ms: 60_000,
                            min_calls: 20,
                            source: src(
                                66,
                                "trip when business_error_ratio > 50% over 1m min_calls 20",
                            ),
                            slow_ms: 0,
                        },
                        Trip {
                            metric: TripMetric::SystemErrors as i32,
                            op: CompareOp::Ge as i32,
                            count: 10,
                            ratio_milli_percent: 0,
                            window_ms: 10_000,
                            min_calls: 0,
                            source: src(67, "trip when system_errors >= 10 over 10s"),
                            slow_ms: 0,
                        },
                        Trip {
                            metric: TripMetric::SlowCallRatio as i32,
                            op: CompareOp::Gt as i32,
                            count: 0,
                            ratio_milli_percent: 50_000,
                            window_ms: 60_000,
                            min_calls: 20,
                            source: src(
                                68,
                                "trip when slow_call_ratio > 50% over 1m slower than 2s min_calls 20",
                            ),
                            slow_ms: 2_000,
                        },
                    ],
                    business: Some(ErrorClass {
                        status: vec![StatusRange { from: 500, to: 599 }],
                        ..Default::default()
                    }),
                    system: Some(ErrorClass {
                        status: vec![
                            StatusRange { from: 401, to: 401 },
                            StatusRange { from: 403, to: 403 },
                        ],
                        connect_failure: true,
                        timeout: true,
                        reset: false,
                        grpc_status: vec![GrpcCode::Unavailable as i32],
                    }),
                    recover: Some(Recovery {
                        kind: Some(recovery::Kind::After(AutoRecovery {
                            after_ms: 30_000,
                            probes: 5,
                        })),
                    }),
                    reject_status: 503,
                    reject_grpc_status: GrpcCode::Unavailable as i32,
                })),
            },
            Rule {
                name: "order/inventory_retries".into(),
                source: src(70, "retry inventory_retries on calls to inventory { ... }"),
                on: Some(kind(match_expr::Kind::CallsTo("inventory".into()))),
                direction: Direction::Outbound as i32,
                mode: Mode::Enforce as i32,
                spec: Some(Spec::Retry(Retry {
                    attempts: 3,
                    on: Some(ErrorClass {
                        status: vec![StatusRange { from: 502, to: 503 }],
                        connect_failure: true,
                        timeout: true,
                        reset: true,
                        grpc_status: vec![GrpcCode::Unavailable as i32],
                    }),
                    backoff_ms: 25,
                    backoff_max_ms: 250,
                    jitter: true,
                    per_try_timeout_ms: 300,
                    budget: Some(RetryBudget {
                        ratio_milli_percent: 20_000,
                        min_retries: 10,
                        per_ms: 1000,
                    }),
                    methods: vec!["GET".into(), "PUT".into()],
                })),
                ..Default::default()
            },
        ],
        warmup: Some(Warmup {
            source: src(72, "warmup { ... }"),
            steps: vec![
                WarmupStep {
                    source: src(73, ""),
                    step: Some(warmup_step::Step::Ready(ReadyProbe {
                        probe: Some(HttpCall {
                            method: "GET".into(),
                            path: "/application/readiness".into(),
                        }),
                        status: 200,
                        every_ms: 10_000,
                        after_ms: 15_000,
                        timeout_ms: 0,
                    })),
                },
                WarmupStep {
                    source: src(74, ""),
                    step: Some(warmup_step::Step::Register(true)),
                },
                WarmupStep {
                    source: src(75, ""),
                    step: Some(warmup_step::Step::Ramp(gov_proto::v1::Ramp {
                        over_ms: 60_000,
                        from_milli_percent: 10_000,
                    })),
                },
                WarmupStep {
                    source: src(76, ""),
                    step: Some(warmup_step::Step::Start(Invoke {
                        what: "consumers".into(),
                        action: Some(Action {
                            kind: Some(action::Kind::Http(HttpCall {
                                method: "POST".into(),
                                path: "/admin/consumers/start".into(),
                            })),
                        }),
                    })),
                },
            ],
        }),
        shutdown: Some(Shutdown {
            source: src(80, "shutdown { ... }"),
            steps: vec![
                ShutdownStep {
                    source: None,
                    step: Some(shutdown_step::Step::Deregister(true)),
                },
                ShutdownStep {
                    source: None,
                    step: Some(shutdown_step::Step::Wait(Wait {
                        duration_ms: 90_000,
                        registry: "eureka".into(),
                    })),
                },
                ShutdownStep {
                    source: None,
                    step: Some(shutdown_step::Step::Stop(Invoke {
                        what: "kafka".into(),
                        action: Some(Action {
                            kind: Some(action::Kind::Signal("SIGTERM".into())),
                        }),
                    })),
                },
                ShutdownStep {
                    source: None,
                    step: Some(shutdown_step::Step::DrainMs(30_000)),
                },
            ],
        }),
    }
}

#[test]
fn yaml_round_trip() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = order();
    let yaml = serde_yaml::to_string(&cfg)?;
    let back: TargetConfig = serde_yaml::from_str(&yaml)?;
    assert_eq!(back, cfg, "yaml:\n{yaml}");
    Ok(())
}

#[test]
fn json_round_trip() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = order();
    let json = serde_json::to_string_pretty(&cfg)?;
    let back: TargetConfig = serde_json::from_str(&json)?;
    assert_eq!(back, cfg, "json:\n{json}");
    Ok(())
}

#[test]
fn bundle_round_trip() -> Result<(), Box<dyn std::error::Error>> {
    let bundle = gov_proto::v1::Bundle {
        targets: vec![order(), order()],
        version: "abc".into(),
    };
    let back: gov_proto::v1::Bundle = serde_yaml::from_str(&serde_yaml::to_string(&bundle)?)?;
    assert_eq!(back, bundle);
    Ok(())
}

#[test]
fn yaml_is_readable() -> Result<(), Box<dyn std::error::Error>> {
    let yaml = serde_yaml::to_string(&order())?;
    for needle in [
        "max_wait_ms: 10\n",
        "key: BULKHEAD_KEY_INSTANCE\n",
        "after_ms: 7200000\n",
        "ratio_milli_percent: 50000\n",
        "metric: TRIP_METRIC_BUSINESS_ERROR_RATIO\n",
        "metric: TRIP_METRIC_SLOW_CALL_RATIO\n",
        "slow_ms: 2000\n",
        "calls_to: inventory\n",
        "register: true\n",
        "drain_ms: 30000\n",
    ] {
        assert!(yaml.contains(needle), "missing {needle:?} in:\n{yaml}");
    }
    // Defaults are left out.
    assert!(!yaml.contains("max_queue: 0"), "{yaml}");
    Ok(())
}

#[test]
fn reads_camel_case_and_string_numbers() -> Result<(), Box<dyn std::error::Error>> {
    // What a standard proto3 JSON printer (camelCase, 64-bit as strings) emits.
    let json = r#"{
        "service": "order",
        "consumerHeader": "x-caller",
        "rules": [{
            "name": "order/b",
            "on": {"any": true},
            "mode": "MODE_ENFORCE",
            "bulkhead": {
                "key": "BULKHEAD_KEY_INSTANCE_PATH",
                "maxConcurrent": 3,
                "maxWaitMs": "250",
                "rejectStatus": 408
            }
        }]
    }"#;
    let cfg: TargetConfig = serde_json::from_str(json)?;
    assert_eq!(cfg.consumer_header, "x-caller");
    let r = &cfg.rules[0];
    assert_eq!(r.on, Some(kind(match_expr::Kind::Any(true))));
    assert_eq!(r.mode(), Mode::Enforce);
    let b = r.bulkhead().ok_or("a bulkhead")?;
    assert_eq!(b.max_wait_ms, 250);
    assert_eq!(b.key(), BulkheadKey::InstancePath);
    Ok(())
}

#[test]
fn rejects_unknown_enum_names() {
    let yaml = "service: order\nrules:\n- name: order/b\n  bulkhead: {key: BULKHEAD_KEY_NOPE}\n";
    let err = serde_yaml::from_str::<TargetConfig>(yaml);
    assert!(err.is_err());
}

#[test]
fn descriptor_set_is_embedded() {
    assert!(gov_proto::FILE_DESCRIPTOR_SET.len() > 1000);
}
