//! The engine in process, without the sidecar: a tower service wrapped in
//! [`GovernLayer`], enforcing a bulkhead and a limit compiled by `govc compile`.
//!
//!     cargo run -p gov-engine --example in_process
//!
//! Prints the status of each call: the limit admits two calls to `/orders`, the
//! third gets 429 without reaching the service.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "an example")]

use std::convert::Infallible;

use bytes::Bytes;
use gov_engine::{Engine, GovernLayer, MeteredBody};
use http::{Request, Response};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};

/// What `govc compile policy.gov --service order` prints for
/// `limit two on orders { calls 2 per 1h }` and a bulkhead of 10.
const POLICY: &str = r#"
service: order
version: example
consumer_header: x-gov-consumer
rules:
  - name: order/orders_calls
    on: { path: { kind: PATH_KIND_PREFIX, value: /orders } }
    mode: MODE_ENFORCE
    bulkhead:
      max_concurrent: 10
      reject_status: 408
      reject_grpc_status: GRPC_CODE_UNAVAILABLE
  - name: order/two
    on: { path: { kind: PATH_KIND_PREFIX, value: /orders } }
    mode: MODE_ENFORCE
    limit:
      calls: { amount: 2, window_ms: 3600000 }
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
"#;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Engine::empty("order");
    engine
        .apply_target(&serde_yaml::from_str(POLICY).unwrap())
        .unwrap();

    // The service: any `tower::Service<http::Request<_>>`.
    let service = tower::service_fn(|req: Request<MeteredBody<Full<Bytes>>>| async move {
        let body = format!("served {}\n", req.uri().path());
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
    });
    let mut governed = GovernLayer::new(engine.clone()).layer(service);

    for _ in 0..3 {
        let req = Request::get("/orders/7").body(Full::default()).unwrap();
        let response = governed.ready().await.unwrap().call(req).await.unwrap();
        let by = response
            .headers()
            .get(gov_engine::REJECTED_BY)
            .map(|v| format!(" (rejected by {})", v.to_str().unwrap_or("?")))
            .unwrap_or_default();
        println!("GET /orders/7 -> {}{by}", response.status());
    }
    let stats = engine.stats();
    for rule in &stats.rules {
        println!("{}: admitted {}", rule.rule, rule.admitted);
    }
}
