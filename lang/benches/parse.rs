//! Parser throughput on a generated, realistic policy of about 1 MiB: many
//! services with matches, bulkheads, limits and fuses, warmup and shutdown,
//! comments and blank lines as `govc fmt` writes them. Target (performance.md
//! T9): at least 50 MB/s. `1MiB` is `parse`: the pest grammar, the one parser.
//!
//! Run: `cargo bench -j2 -p gov-lang --bench parse -- --warm-up-time 1 --measurement-time 5`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// One service of about 3 KiB.
fn service(out: &mut String, i: usize) {
    let _ = writeln!(out, "# Service {i}: the order flow.");
    let _ = writeln!(out, "service svc{i} {{");
    out.push_str("  domain \"trade\"\n  registry eureka\n  consumer from header \"x-consumer\"\n");
    out.push_str("  capacity workers 200\n  capacity rate 2000 per 1s\n\n");
    for m in 0..6 {
        let _ = writeln!(
            out,
            "  match m{m} = path prefix \"/api/v{m}/orders\" and (method GET or method POST) latency 50ms"
        );
    }
    out.push_str("  match crm = consumer \"crm\" or header \"x-tenant\" = \"gold\"\n\n");
    for r in 0..4 {
        let _ = writeln!(
            out,
            "  # Keep slow reads from starving the rest.\n  bulkhead b{r} on m{r} {{\n    max_concurrent {}\n    max_wait 10ms\n    queue 20\n    timeout 2s\n    reject with 503\n  }}\n",
            10 + r
        );
    }
    for r in 0..4 {
        let _ = writeln!(
            out,
            "  limit l{r} on m{r} and crm {{\n    calls {} per 1s\n    bytes 10MiB per 1m\n    per consumer\n    action reject\n    release after 2h\n    scope cluster sync batch 100ms\n  }}\n",
            100 + r
        );
    }
    for r in 0..2 {
        let _ = writeln!(
            out,
            "  fuse f{r} on calls to svc{} {{\n    trip when business_error_ratio > 50% over 1m min_calls 20\n    trip when system_errors >= 10 over 10s\n    classify system status 500..599 connect_failure timeout\n    recover after 30s probe 5\n  }}\n",
            i + 1
        );
    }
    out.push_str(
        "  warmup {\n    ready when http GET \"/ready\" is 200 every 10s after 15s\n    register\n    ramp 60s from 10%\n    start consumers via http POST \"/start\"\n  }\n\n",
    );
    out.push_str(
        "  shutdown {\n    deregister\n    wait for eureka\n    stop consumers via signal TERM\n    drain 30s\n  }\n}\n\n",
    );
}

/// About `bytes` of policy text.
fn policy(bytes: usize) -> String {
    let mut text = String::from(
        "registry eureka {\n  server_cache 30s\n  client_refresh 30s\n  balancer_refresh 30s\n}\n\n",
    );
    let mut i = 0;
    while text.len() < bytes {
        service(&mut text, i);
        i += 1;
    }
    text
}

fn parse(c: &mut Criterion) {
    let text = policy(1 << 20);
    gov_lang::parse("bench.gov", &text).expect("the generated policy parses");
    let mut group = c.benchmark_group("parse");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.sample_size(20);
    group.bench_function("1MiB", |b| {
        b.iter(|| gov_lang::parse("bench.gov", black_box(&text)).unwrap());
    });
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
