//! `Govern` as the sidecar's hyper path uses it: an observer told of every
//! sampled decision (also after a wait), the outcome an inner service's
//! `CallError` tells, the shadow stamp on every admitted request, and an
//! outbound call's `CallTarget`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gov_engine::{
    Admission, CallError, CallTarget, Engine, FuseState, GovernLayer, MeteredBody, Observe,
    Outcome, REJECTED_BY, Rejection, RequestInfo, WOULD_REJECT_BY,
};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};

fn engine(yaml: &str) -> Engine {
    let mut target = serde_yaml::from_str(yaml).unwrap();
    gov_proto::compiled::fill(&mut target);
    let engine = Engine::empty("order");
    engine.apply_target(&target).unwrap();
    engine
}

fn stats(engine: &Engine, rule: &str) -> gov_engine::RuleStats {
    engine
        .stats()
        .rules
        .into_iter()
        .find(|r| &*r.rule == rule)
        .unwrap()
}

fn get(path: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::get(path)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

/// Writes down what it is told: `(path, rules or rejecting rule, request bytes)`.
#[derive(Clone, Default)]
struct Notes {
    /// Samples the first, third, ... call only; else every call.
    every_other: bool,
    count: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Observe for Notes {
    type Sample = u64;

    fn sample(&self) -> Option<u64> {
        let mut n = self.count.lock().unwrap();
        *n += 1;
        (!self.every_other || *n % 2 == 1).then_some(*n)
    }

    fn admitted(
        &self,
        n: u64,
        info: &RequestInfo<'_>,
        bytes: Option<u64>,
        admission: &mut Admission,
    ) {
        let rules: Vec<String> = admission
            .rules()
            .map(|(rule, wait)| format!("{rule}{}", if wait.is_some() { " waited" } else { "" }))
            .collect();
        self.seen.lock().unwrap().push(format!(
            "{n} {} admitted [{}] {bytes:?}",
            info.path,
            rules.join(",")
        ));
        let seen = self.seen.clone();
        admission.on_end(move |ended| {
            seen.lock()
                .unwrap()
                .push(format!("{n} ended {:?}", ended.outcome));
        });
    }

    fn rejected(&self, n: u64, info: &RequestInfo<'_>, bytes: Option<u64>, rejection: &Rejection) {
        self.seen.lock().unwrap().push(format!(
            "{n} {} rejected by {} {bytes:?}",
            info.path, rejection.rule
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn the_observer_is_told_each_sampled_decision_once_also_after_a_wait() {
    let e = engine(
        r#"
service: order
rules:
- name: order/one
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  bulkhead:
    max_concurrent: 1
    max_wait_ms: 100
- name: order/none
  on: {path: {kind: PATH_KIND_PREFIX, value: /none}}
  limit:
    calls: {amount: 1, window_ms: 3600000}
"#,
    );
    let inner = tower::service_fn(|req: Request<MeteredBody<Full<Bytes>>>| async move {
        if req.uri().path() == "/one/slow" {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    // Spend `/none`'s one call unobserved.
    let plain = GovernLayer::new(e.clone()).layer(inner);
    drop(plain.oneshot(get("/none", "")).await.unwrap());
    let notes = Notes::default();
    let svc = GovernLayer::new(e.clone())
        .observe(notes.clone())
        .layer(inner);

    let slow = tokio::spawn(svc.clone().oneshot(get("/one/slow", "abc")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Waits for the permit the slow call holds until its body is dropped.
    let waiting = tokio::spawn(svc.clone().oneshot(get("/one/after", "")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        notes.seen.lock().unwrap().len(),
        1,
        "the waiting call is not decided yet"
    );
    drop(slow.await.unwrap().unwrap());
    let after = waiting.await.unwrap().unwrap();
    assert_eq!(after.status(), StatusCode::OK);
    drop(after);
    let refused = svc.clone().oneshot(get("/none", "12")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // No rule matched: still a decision.
    drop(svc.clone().oneshot(get("/free", "")).await.unwrap());

    assert_eq!(
        *notes.seen.lock().unwrap(),
        [
            "1 /one/slow admitted [order/one] Some(3)",
            "1 ended Some(Status(200))",
            "2 /one/after admitted [order/one waited] Some(0)",
            "2 ended Some(Status(200))",
            "3 /none rejected by order/none Some(2)",
            "4 /free admitted [] Some(0)",
            "4 ended Some(Status(200))",
        ]
    );

    // An observer that samples every other call hears of those only.
    let notes = Notes {
        every_other: true,
        ..Notes::default()
    };
    let svc = GovernLayer::new(e.clone())
        .observe(notes.clone())
        .layer(tower::service_fn(
            |_: Request<MeteredBody<Full<Bytes>>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            },
        ));
    for path in ["/a", "/b", "/none", "/c"] {
        drop(svc.clone().oneshot(get(path, "")).await.unwrap());
    }
    assert_eq!(
        *notes.seen.lock().unwrap(),
        [
            "1 /a admitted [] Some(0)",
            "1 ended Some(Status(200))",
            "3 /none rejected by order/none Some(0)",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_inner_error_records_the_outcome_its_call_error_tells() {
    let e = engine(
        r#"
service: order
rules:
- name: order/down
  on: {any: true}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 2, window_ms: 60000}
    system: {connect_failure: true}
"#,
    );
    let inner = tower::service_fn(|req: Request<MeteredBody<Full<Bytes>>>| async move {
        let io = || std::io::Error::other("the upstream went away");
        match req.uri().path() {
            "/connect" => Err(CallError::failed(Outcome::ConnectFailure, io()).into()),
            "/unsent" => Err(CallError::unsent("no target").into()),
            "/reset" => {
                Err::<Response<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>>(io().into())
            }
            _ => Ok(Response::new(Full::new(Bytes::new()))),
        }
    });
    let svc = GovernLayer::new(e.clone()).layer(inner);
    let fail = |path: &'static str| {
        let svc = svc.clone();
        async move {
            let Err(error) = svc.oneshot(get(path, "")).await else {
                panic!("{path} failed");
            };
            CallError::outcome_of(&error)
        }
    };
    // Resets and requests never sent are no connect failures: the fuse holds.
    for _ in 0..3 {
        assert_eq!(fail("/reset").await, Some(Outcome::Reset));
        assert_eq!(fail("/unsent").await, None);
    }
    let down = stats(&e, "order/down");
    assert_eq!(down.fuse, Some(FuseState::Closed));
    assert_eq!((down.admitted, down.in_flight), (6, 0));
    assert_eq!(fail("/connect").await, Some(Outcome::ConnectFailure));
    assert_eq!(stats(&e, "order/down").fuse, Some(FuseState::Closed));
    assert_eq!(fail("/connect").await, Some(Outcome::ConnectFailure));
    assert_eq!(stats(&e, "order/down").fuse, Some(FuseState::Open));
    let rejected = svc.clone().oneshot(get("/ok", "")).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(rejected.headers()[REJECTED_BY], "order/down");
    // The error reads as its source.
    let error = CallError::failed(Outcome::ConnectFailure, "connection refused");
    assert!(error.to_string().ends_with("connection refused"), "{error}");
}

/// Only the engine names the shadow rules that would have refused a call; an
/// outbound call is decided with its `CallTarget`.
#[tokio::test]
async fn admitted_requests_carry_the_engines_stamp_and_never_the_callers() {
    let e = engine(
        r#"
service: order
rules:
- name: order/trial
  on: {path: {kind: PATH_KIND_PREFIX, value: /trial}}
  mode: MODE_SHADOW
  stamp_would_reject: true
  limit:
    calls: {amount: 1, window_ms: 3600000}
- name: order/to_inventory
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  limit:
    calls: {amount: 1, window_ms: 3600000}
"#,
    );
    // Answers the stamp it was sent, all of its values.
    let inner = tower::service_fn(|req: Request<MeteredBody<Full<Bytes>>>| async move {
        let stamps: Vec<_> = req
            .headers()
            .get_all(WOULD_REJECT_BY)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(stamps.join("|")))))
    });
    let svc = GovernLayer::new(e.clone()).layer(inner);
    let seen = |svc: gov_engine::Govern<_, ()>, req: Request<Full<Bytes>>| async move {
        let response = svc.oneshot(req).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    };
    let forged = |path: &str| {
        Request::get(path)
            .header(WOULD_REJECT_BY, "order/forged")
            .header(WOULD_REJECT_BY, "order/trial")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    assert_eq!(
        seen(svc.clone(), forged("/trial")).await,
        (StatusCode::OK, String::new())
    );
    assert_eq!(
        seen(svc.clone(), forged("/trial")).await,
        (StatusCode::OK, "order/trial".to_owned())
    );
    assert_eq!(
        seen(svc.clone(), forged("/free")).await,
        (StatusCode::OK, String::new())
    );

    // Outbound: the rule for calls to `inventory` sees the target.
    let out = GovernLayer::outbound(e.clone()).layer(inner);
    let call = |service: &str| {
        let mut req = get("/stock", "");
        req.extensions_mut().insert(CallTarget {
            service: service.into(),
            instance: Some("10.0.0.1:80".into()),
        });
        req
    };
    assert_eq!(seen(out.clone(), call("inventory")).await.0, StatusCode::OK);
    assert_eq!(
        seen(out.clone(), call("inventory")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(seen(out.clone(), call("billing")).await.0, StatusCode::OK);
    // Without a target no outbound rule matches.
    assert_eq!(seen(out, get("/stock", "")).await.0, StatusCode::OK);
}

/// A bulkhead of one that lets a call wait 500 ms, whose calls time out after
/// 200 ms.
const QUEUED: &str = r#"
service: order
rules:
- name: order/one
  on: {path: {kind: PATH_KIND_PREFIX, value: /}}
  bulkhead:
    max_concurrent: 1
    max_wait_ms: 500
    timeout_ms: 200
"#;

/// Answers the deadline headers it was sent (`gov-timeout|grpc-timeout`,
/// each value `,`-joined).
fn deadline_echo() -> impl tower::Service<
    Request<MeteredBody<Full<Bytes>>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send {
    tower::service_fn(|req: Request<MeteredBody<Full<Bytes>>>| async move {
        let all = |name: &str| {
            let v: Vec<_> = req
                .headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            v.join(",")
        };
        let seen = format!("{}|{}", all("gov-timeout"), all("grpc-timeout"));
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(seen))))
    })
}

fn with_deadline(values: &[&str]) -> Request<Full<Bytes>> {
    let mut req = get("/a", "");
    for v in values {
        req.headers_mut().append("gov-timeout", v.parse().unwrap());
    }
    req
}

async fn answer<S>(svc: S, req: Request<Full<Bytes>>) -> (StatusCode, http::HeaderMap, String)
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<gov_engine::GovBody<Full<Bytes>>>>,
    S::Error: std::fmt::Debug,
{
    let response = svc.oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// A call whose deadline is used up on arrival (`0m`) or while it waits for a
/// permit is refused (504, naming why) without taking one and without the
/// inner service: the rules do not count it, the engine does.
#[tokio::test(start_paused = true)]
async fn doomed_calls_are_refused_before_they_take_a_permit() {
    let e = engine(QUEUED);
    let svc = GovernLayer::new(e.clone()).layer(deadline_echo());
    let (status, headers, body) = answer(svc.clone(), with_deadline(&["0m"])).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(headers["gov-deadline-exceeded"], "before-admission");
    assert!(headers.get(REJECTED_BY).is_none());
    assert!(
        body.contains("used up before the call was admitted"),
        "{body}"
    );
    assert_eq!(stats(&e, "order/one").admitted, 0);
    assert_eq!(e.doomed_calls(gov_engine::Direction::Inbound), 1);

    // The permit is taken: the next call waits, and its 100 ms run out
    // before the 500 ms its bulkhead would let it wait.
    let h = http::HeaderMap::new();
    let held = e
        .admit(&RequestInfo::inbound(&http::Method::GET, "/a", &h))
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let (status, headers, _) = answer(svc.clone(), with_deadline(&["100m"])).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(headers["gov-deadline-exceeded"], "before-admission");
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(e.doomed_calls(gov_engine::Direction::Inbound), 2);
    let one = stats(&e, "order/one");
    assert_eq!((one.admitted, one.in_flight), (1, 1), "only the held call");
    assert_eq!(one.rejected.iter().sum::<u64>(), 0, "no rule refused it");

    // The engine's own path (the HTTP/1 path's) refuses the same way.
    let at = Some(tokio::time::Instant::now() + Duration::from_millis(50));
    let info = RequestInfo::inbound(&http::Method::GET, "/a", &h);
    let r = e.admit_until(&info, at).await.unwrap_err();
    assert_eq!(r.deadline, Some(gov_engine::DeadlineEnd::BeforeAdmission));
    assert_eq!(e.doomed_calls(gov_engine::Direction::Inbound), 3);
    assert_eq!(e.doomed_calls(gov_engine::Direction::Outbound), 0);
    drop(held);
    assert_eq!(stats(&e, "order/one").in_flight, 0);
}

/// The request forwarded carries what is left of the caller's deadline, time
/// queued included, or the rule's timeout when sooner; never a caller's
/// malformed or repeated value; nothing when the caller sent none.
#[tokio::test(start_paused = true)]
async fn the_forwarded_request_carries_what_is_left_of_the_deadline() {
    let e = engine(QUEUED);
    let svc = GovernLayer::new(e.clone()).layer(deadline_echo());
    // The rule's 200 ms are sooner than the caller's 5 s.
    assert_eq!(
        answer(svc.clone(), with_deadline(&["5S"])).await.2,
        "200000u|"
    );
    // The caller's 150 ms are sooner than the rule's.
    assert_eq!(
        answer(svc.clone(), with_deadline(&["150m"])).await.2,
        "150000u|"
    );
    // No deadline sent, a malformed one, or one sent twice: none forwarded
    // (the rule's timeout still holds).
    for values in [
        &[][..],
        &["-5m"],
        &["1.5S"],
        &["1S", "2S"],
        &["99999999999m"],
    ] {
        assert_eq!(
            answer(svc.clone(), with_deadline(values)).await.2,
            "|",
            "{values:?}"
        );
    }

    // 120 ms queued for the permit come off the caller's 300 ms.
    let h = http::HeaderMap::new();
    let held = e
        .admit(&RequestInfo::inbound(&http::Method::GET, "/a", &h))
        .await
        .unwrap();
    let queued = tokio::spawn(answer(svc.clone(), with_deadline(&["300m"])));
    tokio::time::sleep(Duration::from_millis(120)).await;
    drop(held);
    let (status, _, seen) = queued.await.unwrap();
    assert_eq!((status, &*seen), (StatusCode::OK, "180000u|"));

    // A gRPC call's deadline is its `grpc-timeout`; its `gov-timeout` is
    // left as sent.
    let mut grpc = with_deadline(&["1S"]);
    *grpc.version_mut() = http::Version::HTTP_2;
    grpc.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    grpc.headers_mut()
        .insert("grpc-timeout", "100m".parse().unwrap());
    assert_eq!(answer(svc.clone(), grpc).await.2, "1S|100000u");
}

/// Admitted with a deadline, a call's timeout is what is left of it (or the
/// rule's, when sooner), and the caller's deadline ending it names no rule.
#[tokio::test(start_paused = true)]
async fn an_admitted_calls_timeout_is_capped_by_its_callers_deadline() {
    let e = engine(QUEUED);
    let h = http::HeaderMap::new();
    let info = RequestInfo::inbound(&http::Method::GET, "/a", &h);
    let at = tokio::time::Instant::now() + Duration::from_millis(150);
    let a = e.admit_until(&info, Some(at)).await.unwrap();
    assert_eq!(a.timeout(), Some(Duration::from_millis(150)));
    assert_eq!(a.forwarded_deadline(), Some(Duration::from_millis(150)));
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(a.forwarded_deadline(), Some(Duration::from_millis(50)));
    tokio::time::advance(Duration::from_millis(50)).await;
    let r = a.timed_out();
    assert_eq!(r.deadline, Some(gov_engine::DeadlineEnd::InFlight));
    assert!(r.rule.is_empty());

    // Without a caller's deadline: the rule's, named, and none forwarded.
    let a = e.admit_until(&info, None).await.unwrap();
    assert_eq!(a.timeout(), Some(Duration::from_millis(200)));
    assert_eq!(a.forwarded_deadline(), None);
    assert_eq!(&*a.timed_out().rule, "order/one");
    // A caller's deadline later than the rule's: the rule's, named.
    let far = tokio::time::Instant::now() + Duration::from_secs(5);
    let a = e.admit_until(&info, Some(far)).await.unwrap();
    assert_eq!(a.forwarded_deadline(), Some(Duration::from_millis(200)));
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(&*a.timed_out().rule, "order/one");
}
