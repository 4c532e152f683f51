//! The per-request decision cost in process: match + bulkhead + limit +
//! fuse, with a realistic config (ten rules, three of which match the
//! request), single threaded and with two threads contending on the same
//! rules. Also counts heap allocations over many decisions (must be zero).
//!
//! Run: `cargo bench -j2 -p gov-engine --bench decision -- --warm-up-time 1 --measurement-time 3`

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cpu_time::ThreadTime;
use criterion::{Criterion, criterion_group, criterion_main};
use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, HeaderValue, Method};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The `order` service of examples/shop.gov plus the rules of a typical API.
const CONFIG: &str = include_str!("decision-config.yaml");

fn engine() -> Engine {
    let mut target: TargetConfig = match serde_yaml::from_str(CONFIG) {
        Ok(t) => t,
        Err(e) => panic!("bench config: {e}"),
    };
    gov_proto::compiled::fill(&mut target);
    let engine = Engine::empty("order");
    if let Err(e) = engine.apply_target(&target) {
        panic!("bench config: {e}");
    }
    engine
}

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-gov-consumer", HeaderValue::from_static("shop"));
    h.insert("accept", HeaderValue::from_static("application/json"));
    h.insert("user-agent", HeaderValue::from_static("bench/1.0"));
    h
}

/// One full decision: admit, then record a 200 and release.
#[inline]
fn decide(engine: &Engine, info: &RequestInfo<'_>) {
    match engine.try_admit(info) {
        Decision::Admitted(a) => a.finish(Outcome::Status(200)),
        Decision::Rejected(r) => panic!("unexpected rejection: {r}"),
        Decision::Wait(_) => panic!("unexpected wait"),
    }
}

/// Heap allocations over `n` decisions, after a warm-up.
fn allocations(engine: &Engine, info: &RequestInfo<'_>, n: usize) -> usize {
    for _ in 0..1000 {
        decide(engine, info);
    }
    let region = Region::new(GLOBAL);
    for _ in 0..n {
        decide(engine, black_box(info));
    }
    region.change().allocations
}

fn bench(c: &mut Criterion) {
    let engine = engine();
    let h = headers();
    let get = Method::GET;
    let matched = RequestInfo::inbound(&get, "/api/orders/7", &h);
    let unmatched = RequestInfo::inbound(&get, "/static/app.js", &h);

    let n = 100_000;
    let allocs = allocations(&engine, &matched, n);
    println!("allocations over {n} decisions (3 rules matched): {allocs}");
    assert_eq!(allocs, 0, "the decision must not allocate");
    let allocs = allocations(&engine, &unmatched, n);
    println!("allocations over {n} decisions (no rule matched): {allocs}");
    assert_eq!(allocs, 0, "the decision must not allocate");

    // Reference costs on this machine in this run, to read the numbers
    // against (performance.md 3.1 measured 5-6.5 ns and 17 ns on an idle box).
    let mut g = c.benchmark_group("calibration");
    let counter = std::sync::atomic::AtomicU64::new(0);
    g.bench_function("atomic_fetch_add", |b| {
        b.iter(|| black_box(&counter).fetch_add(1, Ordering::Relaxed))
    });
    // The engine reads tokio's clock. Benches build tokio with `test-util`
    // (a dev-dependency), which adds a paused-clock check to every read that
    // release builds of the agent do not pay; compare with std's clock.
    g.bench_function("tokio_instant_now", |b| b.iter(tokio::time::Instant::now));
    g.bench_function("std_instant_now", |b| b.iter(Instant::now));
    g.finish();

    // Wall time (what criterion measures by default) is inflated when other
    // processes share the cores; thread CPU time is not. Both are reported.
    cpu_group(c, &engine, &matched, &unmatched);

    let mut g = c.benchmark_group("decision");
    g.bench_function("single_thread/3_rules_matched", |b| {
        b.iter(|| decide(&engine, black_box(&matched)))
    });
    g.bench_function("single_thread/no_rule_matched", |b| {
        b.iter(|| decide(&engine, black_box(&unmatched)))
    });
    g.bench_function("single_thread/admit_only_3_rules", |b| {
        // The decision without the completion bookkeeping: the admission is
        // dropped by criterion outside the timed section.
        b.iter_with_large_drop(|| match engine.try_admit(black_box(&matched)) {
            Decision::Admitted(a) => a,
            _ => panic!("unexpected"),
        })
    });
    g.bench_function("two_threads/3_rules_matched", |b| {
        b.iter_custom(|iters| {
            let stop = Arc::new(AtomicBool::new(false));
            let other = spawn_contender(&engine, &stop);
            // Let the other thread start contending first.
            std::thread::sleep(Duration::from_millis(1));
            let start = Instant::now();
            for _ in 0..iters {
                decide(&engine, black_box(&matched));
            }
            let elapsed = start.elapsed();
            stop.store(true, Ordering::Relaxed);
            if other.join().is_err() {
                panic!("contending thread failed");
            }
            elapsed
        })
    });
    g.finish();
}

/// The same decisions measured in CPU time of the measuring thread.
fn cpu_group(
    c: &mut Criterion,
    engine: &Engine,
    matched: &RequestInfo<'_>,
    unmatched: &RequestInfo<'_>,
) {
    let mut g = c.benchmark_group("decision_cpu");
    for (name, info) in [
        ("single_thread/3_rules_matched", matched),
        ("single_thread/no_rule_matched", unmatched),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = ThreadTime::now();
                for _ in 0..iters {
                    decide(engine, black_box(info));
                }
                start.elapsed()
            })
        });
    }
    g.bench_function("two_threads/3_rules_matched", |b| {
        b.iter_custom(|iters| {
            let stop = Arc::new(AtomicBool::new(false));
            let other = spawn_contender(engine, &stop);
            std::thread::sleep(Duration::from_millis(1));
            let start = ThreadTime::now();
            for _ in 0..iters {
                decide(engine, black_box(matched));
            }
            let elapsed = start.elapsed();
            stop.store(true, Ordering::Relaxed);
            if other.join().is_err() {
                panic!("contending thread failed");
            }
            elapsed
        })
    });
    g.finish();
}

/// A second thread deciding on the same rules until `stop`.
fn spawn_contender(engine: &Engine, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let engine = engine.clone();
    let stop = stop.clone();
    std::thread::spawn(move || {
        let h = headers();
        let get = Method::GET;
        let info = RequestInfo::inbound(&get, "/api/orders/8", &h);
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..64 {
                decide(&engine, black_box(&info));
            }
        }
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
