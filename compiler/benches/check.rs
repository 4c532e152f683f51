//! `govc check` / `govc compile` of a large generated policy: 10,000 rules
//! across 500 services in 10 files (docs/architecture.md target: under 100 ms).
//!
//! Run: `cargo bench -j2 -p gov-compiler --bench check -- --warm-up-time 1 --measurement-time 5`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::fmt::Write as _;

use criterion::{Criterion, criterion_group, criterion_main};
use gov_compiler::{SourceFile, check, compile};

const SERVICES: usize = 500;
const RULES_PER_SERVICE: usize = 20;
const FILES: usize = 10;

/// One service with 20 rules: 8 bulkheads, 8 limits, 4 fuses, plus
/// capacity, matches, warmup and shutdown.
fn service(out: &mut String, i: usize) {
    let next = (i + 1) % SERVICES;
    let _ = writeln!(out, "service svc{i} {{");
    out.push_str("  domain \"trade\"\n  registry eureka\n");
    out.push_str("  capacity workers 200\n  capacity instances 3\n  capacity rate 2000 per 1s\n");
    for m in 0..8 {
        let _ = writeln!(
            out,
            "  match m{m} = path prefix \"/api/v{m}\" and method GET latency 50ms"
        );
    }
    for r in 0..8 {
        let _ = writeln!(
            out,
            "  bulkhead b{r} on m{r} {{\n    max_concurrent {}\n    max_wait 10ms\n    timeout 2s\n  }}",
            10 + r
        );
    }
    for r in 0..7 {
        let _ = writeln!(
            out,
            "  limit l{r} on m{r} {{\n    calls {} per 1s\n    bytes 10MiB per 1m\n    per consumer\n    release after 2h\n  }}",
            100 + r
        );
    }
    let _ = writeln!(
        out,
        "  limit out on calls to svc{next} {{\n    calls 500 per 1s\n    action shape max_delay 200ms\n  }}"
    );
    for r in 0..4 {
        let _ = writeln!(
            out,
            "  fuse f{r} on m{r} {{\n    trip when business_error_ratio > 50% over 1m min_calls 20\n    trip when system_errors >= 10 over 10s\n    recover manual\n  }}"
        );
    }
    out.push_str(
        "  warmup {\n    ready when http GET \"/ready\" is 200 every 10s after 15s\n    register\n    ramp 60s from 10%\n    start consumers via http POST \"/start\"\n  }\n",
    );
    out.push_str(
        "  shutdown {\n    deregister\n    wait for eureka\n    stop consumers via http POST \"/stop\"\n    drain 30s\n  }\n",
    );
    out.push_str("}\n\n");
}

fn policy() -> Vec<SourceFile> {
    let per_file = SERVICES / FILES;
    (0..FILES)
        .map(|f| {
            let mut text = String::new();
            if f == 0 {
                text.push_str(
                    "registry eureka {\n  server_cache 30s\n  client_refresh 30s\n  balancer_refresh 30s\n}\n\n",
                );
            }
            for i in f * per_file..(f + 1) * per_file {
                service(&mut text, i);
            }
            SourceFile::new(format!("part{f}.gov"), text)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let files = policy();
    // The generated policy is valid and has the advertised size.
    let compiled = match compile(&files) {
        Ok(c) => c,
        Err(d) => panic!(
            "generated policy does not compile: {}",
            d.iter().next().map(|d| d.to_string()).unwrap_or_default()
        ),
    };
    let rules: usize = compiled.bundle.targets.iter().map(|t| t.rules.len()).sum();
    assert_eq!(rules, SERVICES * RULES_PER_SERVICE);
    assert!(compiled.warnings.is_empty());

    let mut group = c.benchmark_group("policy_10k_rules_500_services");
    group.sample_size(20);
    group.bench_function("parse_only", |b| {
        b.iter(|| {
            files
                .iter()
                .filter(|f| gov_lang::parse(&f.name, &f.text).is_ok())
                .count()
        })
    });
    group.bench_function("check", |b| b.iter(|| check(&files)));
    group.bench_function("check_and_compile", |b| b.iter(|| compile(&files)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
