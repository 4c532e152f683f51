//! What a `scope cluster` limit adds to a decision (T7 in
//! research/performance.md): per-call latency of `Engine::admit` with the
//! same limit as `scope local`, `sync exact` (one EVALSHA per call) and
//! `sync batch 100ms`, one client, against a `redis-server` on 127.0.0.1
//! at `GOV_BENCH_REDIS` (default `redis://127.0.0.1:6390`). Prints p50/p99.
//!
//! Run: the command in BENCHMARKS.md, "Cluster limits in Redis" (starts
//! redis-server on loopback, then `cargo bench -j2 -p gov-agent --bench cluster`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::time::{Duration, Instant};

use gov_engine::{Engine, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

const CALLS: usize = 20_000;
const WARMUP: usize = 2_000;

fn config(scope: &str) -> TargetConfig {
    let yaml = format!(
        r"
service: order
version: bench
rules:
- name: order/shared
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /api}}}}
  limit:
    calls: {{amount: 1000000000, window_ms: 60000}}
    {scope}
"
    );
    let mut target = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut target);
    target
}

async fn measure(engine: &Engine) -> (Duration, Duration, usize) {
    let headers = HeaderMap::new();
    let info = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
    for _ in 0..WARMUP {
        drop(engine.admit(&info).await);
    }
    let mut samples = Vec::with_capacity(CALLS);
    let mut admitted = 0;
    for _ in 0..CALLS {
        let start = Instant::now();
        let decision = engine.admit(&info).await;
        samples.push(start.elapsed());
        admitted += usize::from(decision.is_ok());
    }
    samples.sort();
    (samples[CALLS / 2], samples[CALLS * 99 / 100], admitted)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let url = std::env::var("GOV_BENCH_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6390".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("one client, {CALLS} calls each, current-thread runtime, redis at {url}");
        println!("{:<28} {:>10} {:>10}", "mode", "p50", "p99");
        let mut local_p50 = Duration::ZERO;
        for (name, scope) in [
            ("scope local", "scope: LIMIT_SCOPE_LOCAL"),
            (
                "scope cluster sync exact",
                "scope: LIMIT_SCOPE_CLUSTER\n    sync: CLUSTER_SYNC_EXACT",
            ),
            (
                "scope cluster sync batch",
                "scope: LIMIT_SCOPE_CLUSTER\n    sync: CLUSTER_SYNC_BATCH\n    sync_batch_ms: 100",
            ),
        ] {
            let store =
                gov_agent::cluster::redis_with_timeout(&url, Duration::from_secs(1)).unwrap();
            let engine = Engine::with_cluster_store("order", store);
            engine.apply_target(&config(scope)).unwrap();
            let (p50, p99, admitted) = measure(&engine).await;
            assert_eq!(admitted, CALLS, "{name}: every call fits the limit");
            assert_eq!(
                engine.stats().cluster_store_up,
                Some(true),
                "{name}: is redis running at {url}?"
            );
            if name == "scope local" {
                local_p50 = p50;
            }
            println!(
                "{name:<28} {:>8.1}us {:>8.1}us   (p50 added over local: {:.1}us)",
                p50.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6,
                p50.saturating_sub(local_p50).as_secs_f64() * 1e6
            );
        }
    });
}
