//! gov-engine's decision next to the crates a Rust service would stack
//! instead, in one harness, on one thread: `governor` (rate limit),
//! `tokio::sync::Semaphore::try_acquire` and tower's `ConcurrencyLimit`
//! (bulkhead) and `failsafe` (circuit breaker), each alone and the three
//! stacked (breaker, then limit, then permit: gov's order of phases).
//!
//! gov's decision is `try_admit` + `finish(200)` + release, on the config of
//! `benches/decision.rs` (10 rules): `GET /api/orders/7` matches three
//! (bulkhead, limit, fuse), `GET /static/app.js` none. The stack is given
//! the request already routed (a web framework's router would do that).
//! `gov_recorded` is the proxy's path on the same matched call: `try_admit`,
//! `record(200)` at the response head, then the admission dropped when the
//! body ends (gov-agent's HTTP/1 relay and [`gov_engine::Govern`] both).
//!
//! `stack_observed` is the stack doing what gov's decision does besides the
//! three checks, with the crates such a service would take for it: the
//! request's rules picked among the config's by `matchit` (axum's router)
//! and tests of the header and method by hand, the call timed (two clock
//! reads), and each matched rule's admitted count and latency kept in
//! `prometheus` counters and histograms with gov's latency buckets. It is a
//! measure of what gov does beyond the stack, not the yardstick: the
//! ratios stay against `stack`.
//!
//! Time: thread CPU time per call, each subject in turn, five interleaved
//! rounds, the median printed. Instructions: each subject's loop alone under
//! `valgrind --tool=callgrind` (collection toggled on the loop, so set-up and
//! warm-up are not counted), when valgrind is on the `PATH`. Allocations:
//! per call, with a counting allocator.
//!
//! Run: `cargo bench -j2 -p gov-engine --bench stack`
//! (`-- --instructions`: instructions only, one `instructions NAME N` line per
//! subject; `scripts/decision-budget.sh` checks gov's against a budget.)
//! `GOV_BENCH_ALGORITHM=SLIDING_WINDOW` (or `TOKEN_BUCKET`, `FIXED_WINDOW`,
//! the wire's default) counts the matched limit (`order/api_rate`) by that
//! algorithm: the decision's cost per algorithm. `GOV_BENCH_BULKHEAD=ADAPTIVE`
//! makes the matched bulkhead (`order/api_calls`) adaptive (`min 1000 max
//! 1000000`), `SHARE` shares it by consumer (`crm 3  web 1  default 1`; the
//! bench's consumer `shop` is in the default class).

#![allow(clippy::print_stdout, reason = "a bench prints its table")]

use std::alloc::System;
use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::Command;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use cpu_time::ThreadTime;
use failsafe::{CircuitBreaker, Config};
use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::sync::Semaphore;
use tower::Service;
use tower::limit::ConcurrencyLimit;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The config of `benches/decision.rs`.
const CONFIG: &str = include_str!("decision-config.yaml");

/// The matched bulkhead of [`CONFIG`], which `GOV_BENCH_BULKHEAD` makes
/// adaptive or shared.
const API_CALLS: &str = "- name: order/api_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  bulkhead:
    max_concurrent: 1000000
";

/// Calls per subject per timed round, and under callgrind.
const TIMED_CALLS: i64 = 1_000_000;
const COUNTED_CALLS: i64 = 20_000;
const ROUNDS: usize = 5;

/// The subjects, in the order of the table.
const SUBJECTS: [&str; 10] = [
    "gov_matched",
    "gov_recorded",
    "gov_unmatched",
    "governor",
    "semaphore",
    "tower_concurrency_limit",
    "failsafe",
    "stack",
    "stack_tower",
    "stack_observed",
];

fn label(subject: &str) -> &'static str {
    match subject {
        "gov_matched" => "gov-engine, 3 rules matched (bulkhead, limit, fuse)",
        "gov_recorded" => {
            "gov-engine, 3 rules matched, recorded at the head then dropped (the proxy's path)"
        }
        "gov_unmatched" => "gov-engine, no rule matched",
        "governor" => "governor `check`",
        "semaphore" => "tokio `Semaphore::try_acquire` + drop",
        "tower_concurrency_limit" => "tower `ConcurrencyLimit` ready + call + poll",
        "failsafe" => "failsafe `call` (default policy)",
        "stack" => "stack: failsafe + governor + Semaphore",
        "stack_tower" => "stack: failsafe + governor + ConcurrencyLimit",
        "stack_observed" => {
            "stack + rules picked (matchit, header and method) + per-rule counts and latency (prometheus)"
        }
        _ => "?",
    }
}

/// Everything the subjects decide with.
struct World {
    engine: Engine,
    headers: HeaderMap,
    get: Method,
    limiter: DefaultDirectRateLimiter,
    semaphore: Semaphore,
    limit: ConcurrencyLimit<Ready>,
    breaker: failsafe::StateMachine<
        failsafe::failure_policy::OrElse<
            failsafe::failure_policy::SuccessRateOverTimeWindow<failsafe::backoff::EqualJittered>,
            failsafe::failure_policy::ConsecutiveFailures<failsafe::backoff::EqualJittered>,
        >,
        (),
    >,
    observed: Observed,
}

/// What `stack_observed` adds to the stack: the config's inbound rules
/// routed by path (each route with the rules it holds and what else they
/// test), and each rule's admitted count and latency histogram.
struct Observed {
    router: matchit::Router<Route>,
    admitted: Vec<prometheus::IntCounter>,
    latency: Vec<prometheus::Histogram>,
}

/// The rules (indices into [`Observed`]'s metrics) a path route holds, and
/// what they test besides the path.
struct Route {
    rules: &'static [usize],
    when: When,
}

#[derive(Clone, Copy)]
enum When {
    Always,
    Consumer(&'static str),
    Writes,
}

impl Observed {
    /// The inbound rules of `decision-config.yaml`, numbered in its order
    /// (0 `order/slow_calls` ... 9 `order/api_fuse`; 2, outbound, is not
    /// routed here; 4, `x-admin: yes`, is the header test of [`observed`]).
    fn new() -> Self {
        let mut router = matchit::Router::new();
        let prefixes: [(&str, &'static [usize], When); 4] = [
            ("/benchmark/delay/z100", &[0], When::Always),
            ("/api", &[1, 6, 9], When::Always),
            ("/mdm/supplier", &[5, 8], When::Consumer("crm")),
            ("/orders", &[7], When::Writes),
        ];
        for (path, rules, when) in prefixes {
            for route in [path.to_owned(), format!("{path}/{{*rest}}")] {
                if let Err(e) = router.insert(route, Route { rules, when }) {
                    panic!("route {path}: {e}");
                }
            }
        }
        if let Err(e) = router.insert(
            "/export",
            Route {
                rules: &[3],
                when: When::Always,
            },
        ) {
            panic!("route /export: {e}");
        }
        let buckets = gov_proto::LATENCY_BOUNDS_MS
            .iter()
            .map(|&ms| ms as f64 / 1e3)
            .collect::<Vec<_>>();
        let metric = |kind: &str, i: usize| format!("rule_{i}_{kind}");
        let admitted = (0..10)
            .map(|i| prometheus::IntCounter::new(metric("admitted", i), "admitted calls"))
            .collect::<Result<Vec<_>, _>>();
        let latency = (0..10)
            .map(|i| {
                prometheus::Histogram::with_opts(
                    prometheus::HistogramOpts::new(metric("latency", i), "latency")
                        .buckets(buckets.clone()),
                )
            })
            .collect::<Result<Vec<_>, _>>();
        match (admitted, latency) {
            (Ok(admitted), Ok(latency)) => Self {
                router,
                admitted,
                latency,
            },
            (Err(e), _) | (_, Err(e)) => panic!("metrics: {e}"),
        }
    }
}

/// The inner service of the concurrency limit: answers at once.
#[derive(Clone, Copy)]
struct Ready;

impl Service<()> for Ready {
    type Response = ();
    type Error = Infallible;
    type Future = std::future::Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        std::future::ready(Ok(()))
    }
}

/// Limits as wide as gov's bench config (a million permits, a rate that
/// never refuses at these speeds).
const PERMITS: usize = 1_000_000;

impl World {
    fn new() -> Self {
        let config = match std::env::var("GOV_BENCH_ALGORITHM") {
            Ok(a) => CONFIG.replace(
                "    calls: {amount: 1000000000000, window_ms: 1000}\n",
                &format!(
                    "    calls: {{amount: 1000000000000, window_ms: 1000}}\n    algorithm: LIMIT_ALGORITHM_{a}\n{}",
                    if a == "TOKEN_BUCKET" { "    burst: 1000000000\n" } else { "" }
                ),
            ),
            Err(_) => CONFIG.to_owned(),
        };
        let config = match std::env::var("GOV_BENCH_BULKHEAD").as_deref() {
            Ok(_) if !config.contains(API_CALLS) => {
                panic!("GOV_BENCH_BULKHEAD: the bench config has no `order/api_calls` as the bench knows it")
            }
            Ok(kind) => config.replace(
                API_CALLS,
                &format!(
                    "{API_CALLS}{}",
                    match kind {
                        "ADAPTIVE" => "    adaptive: {min: 1000, max: 1000000}\n",
                        "SHARE" => "    share: {weights: [{consumer: crm, weight: 3}, {consumer: web, weight: 1}], default_weight: 1}\n",
                        other => panic!("GOV_BENCH_BULKHEAD={other}: ADAPTIVE or SHARE"),
                    }
                ),
            ),
            Err(_) => config,
        };
        let mut target: TargetConfig = match serde_yaml::from_str(&config) {
            Ok(t) => t,
            Err(e) => panic!("bench config: {e}"),
        };
        gov_proto::compiled::fill(&mut target);
        let engine = Engine::empty("order");
        if let Err(e) = engine.apply_target(&target) {
            panic!("bench config: {e}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-gov-consumer", HeaderValue::from_static("shop"));
        headers.insert("accept", HeaderValue::from_static("application/json"));
        headers.insert("user-agent", HeaderValue::from_static("bench/1.0"));
        let rate = NonZeroU32::MAX;
        Self {
            engine,
            headers,
            get: Method::GET,
            limiter: RateLimiter::direct(Quota::per_second(rate).allow_burst(rate)),
            semaphore: Semaphore::new(PERMITS),
            limit: ConcurrencyLimit::new(Ready, PERMITS),
            breaker: Config::new().build(),
            observed: Observed::new(),
        }
    }

    /// A function running `n` calls of `subject`.
    fn runner(&mut self, subject: &str) -> Box<dyn FnMut(i64) + '_> {
        let path = match subject {
            "gov_unmatched" => "/static/app.js",
            _ => "/api/orders/7",
        };
        let World {
            engine,
            headers,
            get,
            limiter,
            semaphore,
            limit,
            breaker,
            observed,
        } = self;
        let (get, headers): (&Method, &HeaderMap) = (get, headers);
        let info = RequestInfo::inbound(get, path, headers);
        let mut cx = Context::from_waker(Waker::noop());
        match subject {
            "gov_matched" | "gov_unmatched" => {
                Box::new(move |n| drive(n, || gov(engine, black_box(&info))))
            }
            "gov_recorded" => Box::new(move |n| drive(n, || recorded(engine, black_box(&info)))),
            "governor" => Box::new(move |n| drive(n, || check(limiter))),
            "semaphore" => Box::new(move |n| drive(n, || drop(permit(semaphore)))),
            "tower_concurrency_limit" => {
                Box::new(move |n| drive(n, || concurrency(limit, &mut cx)))
            }
            "failsafe" => Box::new(move |n| drive(n, || breaker_call(breaker, || ()))),
            "stack" => Box::new(move |n| {
                drive(n, || {
                    breaker_call(breaker, || {
                        check(limiter);
                        drop(permit(semaphore));
                    })
                })
            }),
            "stack_tower" => Box::new(move |n| {
                drive(n, || {
                    breaker_call(breaker, || {
                        check(limiter);
                        concurrency(limit, &mut cx);
                    })
                })
            }),
            "stack_observed" => {
                // The request routes to the three rules the stack checks.
                if !matches!(observed.router.at(path).map(|m| m.value.rules.len()), Ok(3)) {
                    panic!("`{path}` does not route to three rules");
                }
                Box::new(move |n| {
                    drive(n, || {
                        observed_call(observed, black_box((path, get, headers)), || {
                            breaker_call(breaker, || {
                                check(limiter);
                                drop(permit(semaphore));
                            })
                        })
                    })
                })
            }
            other => panic!("no subject `{other}`"),
        }
    }
}

/// `n` calls of `call`, counted by callgrind ([`measure`]); a negative `n`:
/// `-n` calls not counted (a warm-up).
#[inline]
fn drive(n: i64, call: impl FnMut()) {
    if n < 0 {
        warm_up(n.unsigned_abs(), call);
    } else {
        measure(n.unsigned_abs(), call);
    }
}

/// The loop callgrind counts (`--toggle-collect`).
#[inline(never)]
fn measure(n: u64, mut call: impl FnMut()) {
    for _ in 0..n {
        call();
    }
}

/// The same loop, not counted.
#[inline(never)]
fn warm_up(n: u64, mut call: impl FnMut()) {
    for _ in 0..n {
        call();
    }
}

#[inline]
fn gov(engine: &Engine, info: &RequestInfo<'_>) {
    match engine.try_admit(info) {
        Decision::Admitted(a) => a.finish(Outcome::Status(200)),
        Decision::Rejected(r) => panic!("unexpected rejection: {r}"),
        Decision::Wait(_) => panic!("unexpected wait"),
    }
}

/// The proxy's path: the outcome recorded at the response head, the
/// permits given back when the body ends (the admission dropped).
#[inline]
fn recorded(engine: &Engine, info: &RequestInfo<'_>) {
    match engine.try_admit(info) {
        Decision::Admitted(mut a) => {
            a.record(Outcome::Status(200));
            drop(black_box(a));
        }
        Decision::Rejected(r) => panic!("unexpected rejection: {r}"),
        Decision::Wait(_) => panic!("unexpected wait"),
    }
}

/// The request's rules picked, `checks` run and timed when any matched, and
/// each matched rule's admitted count and latency recorded.
#[inline]
fn observed_call(o: &Observed, req: (&str, &Method, &HeaderMap), checks: impl FnOnce()) {
    let (path, method, headers) = req;
    // The names parsed once, as a careful service would.
    const ADMIN: HeaderName = HeaderName::from_static("x-admin");
    const CONSUMER: HeaderName = HeaderName::from_static("x-gov-consumer");
    let admin = headers.get(ADMIN).is_some_and(|v| v == "yes");
    let rules = match o.router.at(path) {
        Ok(m) => {
            let passes = match m.value.when {
                When::Always => true,
                When::Consumer(c) => headers.get(CONSUMER).is_some_and(|v| v == c),
                When::Writes => matches!(*method, Method::POST | Method::PUT),
            };
            if passes { m.value.rules } else { &[] }
        }
        Err(_) => &[],
    };
    if rules.is_empty() && !admin {
        return;
    }
    let start = Instant::now();
    checks();
    let secs = start.elapsed().as_secs_f64();
    for &rule in rules {
        o.admitted[rule].inc();
        o.latency[rule].observe(secs);
    }
}

#[inline]
fn check(limiter: &DefaultDirectRateLimiter) {
    if black_box(limiter).check().is_err() {
        panic!("governor refused");
    }
}

#[inline]
fn permit(semaphore: &Semaphore) -> tokio::sync::SemaphorePermit<'_> {
    match black_box(semaphore).try_acquire() {
        Ok(p) => p,
        Err(e) => panic!("semaphore: {e}"),
    }
}

#[inline]
fn concurrency(limit: &mut ConcurrencyLimit<Ready>, cx: &mut Context<'_>) {
    let limit = black_box(limit);
    if !matches!(limit.poll_ready(cx), Poll::Ready(Ok(()))) {
        panic!("concurrency limit not ready");
    }
    let mut call = std::pin::pin!(limit.call(()));
    if !matches!(call.as_mut().poll(cx), Poll::Ready(Ok(()))) {
        panic!("concurrency limit call pending");
    }
}

#[inline]
fn breaker_call<B: CircuitBreaker>(breaker: &B, inner: impl FnOnce()) {
    let done = black_box(breaker).call(|| {
        inner();
        Ok::<(), ()>(())
    });
    if done.is_err() {
        panic!("breaker refused");
    }
}

/// One subject's time per call (thread CPU time and wall time, ns).
fn timed(world: &mut World, subject: &str) -> (f64, f64) {
    let mut run = world.runner(subject);
    run(-TIMED_CALLS / 10);
    let (cpu, wall) = (ThreadTime::now(), Instant::now());
    run(TIMED_CALLS);
    let per = |d: std::time::Duration| d.as_nanos() as f64 / TIMED_CALLS as f64;
    (per(cpu.elapsed()), per(wall.elapsed()))
}

/// Heap allocations per 10,000 calls of `subject`, after a warm-up.
fn allocations(world: &mut World, subject: &str) -> usize {
    let mut run = world.runner(subject);
    run(-1_000);
    let region = Region::new(GLOBAL);
    run(10_000);
    region.change().allocations
}

/// Instructions per call of `subject` under callgrind (a child process of
/// this binary), or why there is no count.
fn instructions(subject: &str) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::env::temp_dir().join(format!(
        "gov-stack-bench-{}-{subject}.callgrind",
        std::process::id()
    ));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg("--collect-atstart=no")
        .arg("--toggle-collect=*stack::measure*")
        .arg("--quiet")
        .arg(&exe)
        .args(["--child", subject])
        .status()
        .map_err(|e| format!("valgrind: {e}"))?;
    if !status.success() {
        return Err(format!("valgrind: {status}"));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    let total: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("summary:").or(l.strip_prefix("totals:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or("no totals in callgrind's output")?;
    Ok(total as f64 / COUNTED_CALLS as f64)
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut world = World::new();
    // Under callgrind: warm up outside the counted loop, then count.
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let subject = args.get(i + 1).map_or("gov_matched", String::as_str);
        let mut run = world.runner(subject);
        run(-1_000);
        run(COUNTED_CALLS);
        return;
    }
    let valgrind = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if args.iter().any(|a| a == "--instructions") {
        if !valgrind {
            eprintln!("valgrind is not on the PATH");
            std::process::exit(2);
        }
        for subject in SUBJECTS {
            match instructions(subject) {
                Ok(n) => println!("instructions {subject} {n:.0}"),
                Err(e) => {
                    eprintln!("{subject}: {e}");
                    std::process::exit(1);
                }
            }
        }
        return;
    }

    let allocs: Vec<usize> = SUBJECTS
        .iter()
        .map(|s| allocations(&mut world, s))
        .collect();
    let mut cpu = vec![Vec::new(); SUBJECTS.len()];
    let mut wall = vec![Vec::new(); SUBJECTS.len()];
    for _ in 0..ROUNDS {
        for (i, subject) in SUBJECTS.iter().enumerate() {
            let (c, w) = timed(&mut world, subject);
            cpu[i].push(c);
            wall[i].push(w);
        }
    }
    let counts: Vec<Option<f64>> = SUBJECTS
        .iter()
        .map(|s| valgrind.then(|| instructions(s).ok()).flatten())
        .collect();

    let stack = SUBJECTS.iter().position(|&s| s == "stack").unwrap_or(0);
    let (stack_ns, stack_ir) = (median(&mut cpu[stack].clone()), counts[stack]);
    println!(
        "{ROUNDS} interleaved rounds of {TIMED_CALLS} calls each; median thread CPU time (wall in brackets); \
         instructions per call under callgrind over {COUNTED_CALLS} calls"
    );
    println!();
    println!(
        "| subject | ns (CPU) | ns (wall) | x stack | instructions | x stack | allocations / call |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, subject) in SUBJECTS.iter().enumerate() {
        let rounds = cpu[i]
            .iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(", ");
        let ns = median(&mut cpu[i]);
        let wall_ns = median(&mut wall[i]);
        let (ir, ir_ratio) = match (counts[i], stack_ir) {
            (Some(n), Some(s)) => (format!("{n:.0}"), format!("{:.2}", n / s)),
            (Some(n), None) => (format!("{n:.0}"), "-".into()),
            _ => ("-".into(), "-".into()),
        };
        println!(
            "| {} | {ns:.1} ({rounds}) | {wall_ns:.1} | {:.2} | {ir} | {ir_ratio} | {} |",
            label(subject),
            ns / stack_ns,
            allocs[i] as f64 / 10_000.0,
        );
    }
    if !valgrind {
        println!();
        println!("(no instruction counts: valgrind is not on the PATH)");
    }
}
