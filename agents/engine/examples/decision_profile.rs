//! A bare decision loop for profilers (`perf record`, `valgrind --tool=callgrind`):
//! the config and requests of `benches/decision.rs` without criterion's
//! analysis in the profile.
//!
//! Run: `cargo run --release -p gov-engine --example decision_profile -- matched 1000000`
//! (`matched` or `unmatched`, then the number of decisions).

#![allow(clippy::print_stdout, reason = "a profiling tool prints its count")]

use std::hint::black_box;

use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, HeaderValue, Method};

/// The same config as `benches/decision.rs`.
const CONFIG: &str = include_str!("../benches/decision-config.yaml");

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "matched".into());
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut target: TargetConfig = match serde_yaml::from_str(CONFIG) {
        Ok(t) => t,
        Err(e) => panic!("config: {e}"),
    };
    gov_proto::compiled::fill(&mut target);
    let engine = Engine::empty("order");
    if let Err(e) = engine.apply_target(&target) {
        panic!("config: {e}");
    }
    let mut h = HeaderMap::new();
    h.insert("x-gov-consumer", HeaderValue::from_static("shop"));
    h.insert("accept", HeaderValue::from_static("application/json"));
    h.insert("user-agent", HeaderValue::from_static("bench/1.0"));
    let get = Method::GET;
    let path = if mode == "unmatched" {
        "/static/app.js"
    } else {
        "/api/orders/7"
    };
    let info = RequestInfo::inbound(&get, path, &h);
    let mut admitted = 0u64;
    for _ in 0..n {
        match engine.try_admit(black_box(&info)) {
            Decision::Admitted(a) => {
                a.finish(Outcome::Status(200));
                admitted += 1;
            }
            Decision::Rejected(r) => panic!("unexpected rejection: {r}"),
            Decision::Wait(_) => panic!("unexpected wait"),
        }
    }
    println!("{mode}: {admitted} of {n} admitted");
}
