//! The decision does not allocate (limits of every algorithm among its rules): a counting global allocator around many
//! decisions (admit, record, release) with a realistic config; nor does a call
//! through `Govern` that is admitted without waiting, with a deadline or
//! without (the lifecycle the sidecar's hyper path runs).
//!
//! The allocator counts every thread, so this binary has no test harness
//! (`harness = false`): libtest's main thread allocates while it reports, and on
//! a busy machine that landed inside the measured region (4 allocations in one
//! run of five, none in 3.5 s of decisions on a single thread).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::alloc::System;
use std::hint::black_box;

use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, HeaderValue, Method};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CONFIG: &str = r#"
service: order
consumer_header: x-gov-consumer
rules:
- name: order/api_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  bulkhead:
    max_concurrent: 1000
    timeout_ms: 5000
- name: order/per_instance
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  bulkhead:
    key: BULKHEAD_KEY_INSTANCE
    max_concurrent: 20
- name: order/per_consumer
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  limit:
    calls: {amount: 1000000000, window_ms: 1000}
    bytes: {amount: 1000000000000, window_ms: 60000}
    key: LIMIT_KEY_CONSUMER
- name: order/sliding
  on: {path: {kind: PATH_KIND_PREFIX, value: /v2}}
  limit:
    calls: {amount: 1000000000, window_ms: 1000}
    algorithm: LIMIT_ALGORITHM_SLIDING_WINDOW
    key: LIMIT_KEY_CONSUMER
- name: order/shared
  on: {path: {kind: PATH_KIND_PREFIX, value: /v2}}
  bulkhead:
    max_concurrent: 1000
    share: {default_weight: 1, weights: [{consumer: shop, weight: 2}]}
- name: order/bucket
  on: {path: {kind: PATH_KIND_PREFIX, value: /v2}}
  limit:
    calls: {amount: 1000000000, window_ms: 1000}
    algorithm: LIMIT_ALGORITHM_TOKEN_BUCKET
    burst: 1000000
- name: order/tenant
  on: {path: {kind: PATH_KIND_PREFIX, value: /v3}}
  limit:
    calls: {amount: 1000000000, window_ms: 1000}
    key_parts:
    - {header: x-tenant}
    - {query: api_key}
    - {segment: {name: t, prefixes: [/v3/t/]}}
    - {key: LIMIT_KEY_CONSUMER}
- name: order/pace
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  limit:
    calls: {amount: 1000000000, window_ms: 1000}
- name: order/api_fuse
  on: {and: {exprs: [{path: {kind: PATH_KIND_PREFIX, value: /api}}, {consumer: shop}]}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERROR_RATIO, op: COMPARE_OP_GT, ratio_milli_percent: 50000, window_ms: 60000, min_calls: 20}
- name: order/export_trial
  on: {path: {kind: PATH_KIND_PREFIX, value: /api/export}}
  mode: MODE_SHADOW
  stamp_would_reject: true
  limit:
    calls: {amount: 1, window_ms: 3600000}
"#;

fn main() {
    decisions_do_not_allocate();
    println!("test decisions_do_not_allocate ... ok");
    governed_calls_do_not_allocate();
    println!("test governed_calls_do_not_allocate ... ok");
    refusals_do_not_allocate();
    println!("test refusals_do_not_allocate ... ok");
    threads_that_exit_leave_nothing_allocated();
    println!("test threads_that_exit_leave_nothing_allocated ... ok");
}

fn decisions_do_not_allocate() {
    let mut target: TargetConfig = serde_yaml::from_str(CONFIG).unwrap();
    gov_proto::compiled::fill(&mut target);
    let engine = Engine::empty("order");
    engine.apply_target(&target).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("x-gov-consumer", HeaderValue::from_static("shop"));
    headers.insert("x-tenant", HeaderValue::from_static("acme|{eu}"));
    let get = Method::GET;
    let requests = [
        RequestInfo::inbound(&get, "/api/orders/7", &headers),
        RequestInfo::inbound(&get, "/api/export", &headers),
        RequestInfo::inbound(&get, "/static/app.js", &headers),
        RequestInfo::inbound(&get, "/v2/orders", &headers),
        // Keyed on a header, a query parameter (decoded), a segment and
        // the consumer: the key is composed on the stack.
        RequestInfo::inbound(&get, "/v3/t/acme/orders", &headers).with_query("x=1&api_key=k%31+2"),
        RequestInfo::outbound(&get, "/stock", &headers, "inventory", Some("10.0.0.1:80")),
    ];
    let decide = |info: &RequestInfo<'_>| match engine.try_admit(info) {
        Decision::Admitted(a) => {
            // A shadow rule's would-be refusal is kept inline.
            black_box(a.stamps().count());
            a.add_bytes(100);
            a.finish(Outcome::Status(200));
        }
        other => panic!("unexpected decision: {other:?}"),
    };
    // Warm up: keyed scopes (consumer `shop`, instance) are created on first use.
    for info in &requests {
        decide(info);
    }
    let region = Region::new(GLOBAL);
    for _ in 0..10_000 {
        for info in &requests {
            decide(black_box(info));
        }
    }
    let change = region.change();
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "60,000 decisions allocated"
    );
    // And the stats saw them.
    let stats = engine.stats();
    let api = stats
        .rules
        .iter()
        .find(|r| &*r.rule == "order/api_calls")
        .unwrap();
    assert_eq!(api.admitted, 20_002);
    // The shadow limit would have refused every `/api/export` call but the first.
    let trial = stats
        .rules
        .iter()
        .find(|r| &*r.rule == "order/export_trial")
        .unwrap();
    assert_eq!(trial.shadow_rejected.iter().sum::<u64>(), 10_000);
    // The keyed-on-attributes limit counted every call under its one key.
    let tenant = stats
        .rules
        .iter()
        .find(|r| &*r.rule == "order/tenant")
        .unwrap();
    assert_eq!((tenant.admitted, tenant.keys), (10_001, 1));
}

/// A refused decision does not allocate either (refusals come at a high
/// rate under overload): but for the thread's first, its rejection is
/// handed over in a box the thread reuses.
fn refusals_do_not_allocate() {
    let config = r#"
service: order
rules:
- name: order/closed
  on: {path: {kind: PATH_KIND_PREFIX, value: /closed}}
  limit:
    calls: {amount: 1, window_ms: 3600000}
"#;
    let mut target: TargetConfig = serde_yaml::from_str(config).unwrap();
    gov_proto::compiled::fill(&mut target);
    let engine = Engine::empty("order");
    engine.apply_target(&target).unwrap();
    let headers = HeaderMap::new();
    let get = Method::GET;
    let info = RequestInfo::inbound(&get, "/closed/7", &headers);
    let refuse = || match engine.try_admit(black_box(&info)) {
        Decision::Rejected(r) => assert_eq!(&*black_box(r).rule, "order/closed"),
        other => panic!("not refused: {other:?}"),
    };
    match engine.try_admit(&info) {
        Decision::Admitted(a) => a.finish(Outcome::Status(200)),
        other => panic!("the first call is admitted: {other:?}"),
    }
    refuse();
    let region = Region::new(GLOBAL);
    for _ in 0..10_000 {
        refuse();
    }
    let change = region.change();
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "10,000 refusals allocated"
    );
}

/// A call through [`gov_engine::Govern`] admitted at once, with a deadline
/// or without: decision, stamping, metered request, timer, response head,
/// governed body to its end, release.
fn governed_calls_do_not_allocate() {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use bytes::Bytes;
    use gov_engine::{GovernLayer, MeteredBody};
    use http::{Request, Response, Uri};
    use http_body::Body;
    use http_body_util::Full;
    use tower::{Layer, Service};

    let mut target: TargetConfig = serde_yaml::from_str(CONFIG).unwrap();
    gov_proto::compiled::fill(&mut target);
    let engine = Engine::empty("order");
    engine.apply_target(&target).unwrap();
    let inner = tower::service_fn(|req: Request<MeteredBody<Full<Bytes>>>| {
        drop(req);
        std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(
            Bytes::from_static(b"ok"),
        ))))
    });
    let mut svc = GovernLayer::new(engine.clone()).layer(inner);
    // `order/api_calls` sets a deadline: its timer is a `tokio::time` one.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let mut cx = Context::from_waker(Waker::noop());
    let mut call = |path: &'static str| {
        let mut req = Request::new(Full::new(Bytes::from_static(b"body")));
        *req.uri_mut() = Uri::from_static(path);
        let fut = pin!(svc.call(black_box(req)));
        let Poll::Ready(Ok(response)) = fut.poll(&mut cx) else {
            panic!("an admitted call answers at once");
        };
        assert_eq!(response.status(), 200);
        let mut body = pin!(response.into_body());
        while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
            black_box(frame.unwrap());
        }
    };
    call("/api/orders/7");
    let region = Region::new(GLOBAL);
    for _ in 0..10_000 {
        call("/api/orders/7");
        call("/static/app.js");
    }
    let change = region.change();
    assert_eq!(
        (change.allocations, change.reallocations),
        (0, 0),
        "20,000 governed calls allocated"
    );
    let stats = engine.stats();
    let api = stats
        .rules
        .iter()
        .find(|r| &*r.rule == "order/api_calls")
        .unwrap();
    assert_eq!((api.admitted, api.in_flight), (10_001, 0));
}

/// Admissions a thread's destructor drops, and an engine it decides with
/// then (a call finished, a refusal).
struct Exit(Engine, Vec<gov_engine::Admission>);

impl Drop for Exit {
    fn drop(&mut self) {
        self.1.clear();
        let headers = HeaderMap::new();
        for path in ["/p/3", "/p/closed"] {
            match self
                .0
                .try_admit(&RequestInfo::inbound(&Method::GET, path, &headers))
            {
                Decision::Admitted(a) => a.finish(Outcome::Status(200)),
                Decision::Rejected(r) => assert_eq!(&*r.rule, "order/closed"),
                other => panic!("{path}: {other:?}"),
            }
        }
    }
}

std::thread_local! {
    /// Registered before the free list's guard, so destroyed after it.
    static AT_EXIT: std::cell::RefCell<Option<Exit>> = const { std::cell::RefCell::new(None) };
}

/// A thread that decides (boxes on its free list, a refusal's reused box),
/// and whose thread-local destructors drop calls and decide after its free
/// list's guard ran, leaves nothing allocated when it exits (the guard
/// frees the list; a box given after it is freed, not kept).
fn threads_that_exit_leave_nothing_allocated() {
    let config = r#"
service: order
rules:
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /p}}
  bulkhead: {max_concurrent: 100}
- name: order/closed
  on: {path: {kind: PATH_KIND_PREFIX, value: /p/closed}}
  limit:
    calls: {amount: 1, window_ms: 3600000}
"#;
    let mut target: TargetConfig = serde_yaml::from_str(config).unwrap();
    gov_proto::compiled::fill(&mut target);
    let engine = Engine::empty("order");
    engine.apply_target(&target).unwrap();
    let run = |engine: Engine| {
        std::thread::spawn(move || {
            let headers = HeaderMap::new();
            let get = Method::GET;
            let decide = |e: &Engine, path: &str| match e
                .try_admit(&RequestInfo::inbound(&get, path, &headers))
            {
                Decision::Admitted(a) => Some(a),
                _ => None,
            };
            AT_EXIT.with(|x| *x.borrow_mut() = Some(Exit(engine.clone(), Vec::new())));
            let held: Vec<_> = (0..5).filter_map(|_| decide(&engine, "/p/1")).collect();
            assert_eq!(held.len(), 5);
            let later: Vec<_> = (0..3).filter_map(|_| decide(&engine, "/p/2")).collect();
            drop(held);
            // Refused (its box kept for the next refusal), the first call
            // of the hour's one admitted.
            drop(decide(&engine, "/p/closed"));
            assert!(decide(&engine, "/p/closed").is_none());
            AT_EXIT.with(|x| x.borrow_mut().as_mut().unwrap().1.extend(later));
        })
        .join()
        .unwrap();
    };
    // Once to set up what lives for the process (the thread's slot, ...).
    run(engine.clone());
    let region = Region::new(GLOBAL);
    run(engine.clone());
    let change = region.change();
    assert_eq!(
        (change.allocations, change.bytes_allocated),
        (change.deallocations, change.bytes_deallocated),
        "a thread that exited left allocations: {change:?}"
    );
    let stats = engine.stats();
    let pool = stats
        .rules
        .iter()
        .find(|r| &*r.rule == "order/pool")
        .unwrap();
    assert_eq!((pool.admitted, pool.in_flight), (19, 0));
}
