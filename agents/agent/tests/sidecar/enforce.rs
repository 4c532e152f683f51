//! Rules enforced through the proxy: bulkheads, limits, fuses, and their metrics.

use gov_engine::REJECTED_BY;
use http::StatusCode;

use crate::support::{agent, http, load, ms, upstream};

/// The bulkhead experiment of docs/architecture.md (problem 1): a fast and a slow endpoint, a fail-fast bulkhead
/// on the slow one, concurrent load on both. The slow endpoint sheds load with the
/// bulkhead's configured status (503 here, not the default 408); the fast one is
/// never rejected. (Its latency under load is measured in `benches/`, not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_bulkhead_sheds_the_slow_endpoint_and_spares_the_fast_one() {
    let up = upstream()
        .fast("/fast", ms(1))
        .slow("/slow", ms(100))
        .start()
        .await;
    let agent = agent()
        .config(
            r#"
service: shop
version: bulkhead-v1
rules:
  - name: shop/slow_calls
    on: { path: { kind: PATH_KIND_PREFIX, value: /slow } }
    bulkhead:
      max_concurrent: 2
      reject_status: 503
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let client = http();

    // 16 callers hammer the slow endpoint while 4 call the fast one.
    let (slow_url, fast_url) = (agent.url("/slow"), agent.url("/fast"));
    let slow = load(&client, &slow_url, 16, 160);
    let fast = load(&client, &fast_url, 4, 200);
    let (slow, fast) = tokio::join!(slow, fast);

    for r in &fast {
        assert!(
            matches!(r, Ok((StatusCode::OK, _))),
            "the fast endpoint must never be rejected: {r:?}"
        );
    }
    let slow_ok = slow
        .iter()
        .filter(|r| matches!(r, Ok((StatusCode::OK, _))))
        .count();
    let slow_shed = slow
        .iter()
        .filter(|r| matches!(r, Ok((StatusCode::SERVICE_UNAVAILABLE, _))))
        .count();
    assert_eq!(slow_ok + slow_shed, slow.len(), "only 200 or 503: {slow:?}");
    assert!(
        slow_shed > 0 && slow_ok > 0,
        "slow: {slow_ok} ok, {slow_shed} shed"
    );
    // 16 callers on a 100 ms endpoint fill both permits, and never a third.
    assert_eq!(up.peak_in_flight("/slow"), 2, "slow calls at once upstream");

    // A rejection names its rule (bounded: 3 permits' worth of callers, 50 rounds).
    let mut named = None;
    for _ in 0..50 {
        let tries: Vec<_> = (0..4).map(|_| client.get(&slow_url)).collect();
        let replies = futures::future::join_all(tries).await;
        named = replies
            .into_iter()
            .map(Result::unwrap)
            .find(|r| r.status == StatusCode::SERVICE_UNAVAILABLE);
        if named.is_some() {
            break;
        }
    }
    let reply = named.expect("four calls at once never found the bulkhead full");
    assert_eq!(reply.header(REJECTED_BY), Some("shop/slow_calls"));
    assert!(reply.text().contains("shop/slow_calls"), "{}", reply.text());
}

#[tokio::test]
async fn limits_by_calls_and_bytes_per_consumer_leave_other_consumers_alone() {
    let up = upstream()
        .fast("/calls", ms(0))
        .sized("/bytes", 4_000)
        .echo("/bytes/echo")
        .start()
        .await;
    let agent = agent()
        .config(
            r#"
service: shop
version: limits-v1
consumer_header: x-consumer
rules:
  - name: shop/calls_per_consumer
    on: { path: { kind: PATH_KIND_EXACT, value: /calls } }
    limit:
      key: LIMIT_KEY_CONSUMER
      calls: { amount: 5, window_ms: 60000 }
      reject_status: 403
  - name: shop/bytes_per_consumer
    on: { path: { kind: PATH_KIND_PREFIX, value: /bytes } }
    limit:
      key: LIMIT_KEY_CONSUMER
      bytes: { amount: 10000, window_ms: 60000 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let client = http();
    let get = |path: &'static str, consumer: &'static str| {
        let client = client.clone();
        let url = agent.url(path);
        async move {
            client
                .get_with(&url, &[("x-consumer", consumer)])
                .await
                .unwrap()
        }
    };

    // Calls: crm gets 5, then the rule's 403 with Retry-After; erp is unaffected.
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(get("/calls", "crm").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 403, 403]);
    let reply = get("/calls", "crm").await;
    assert_eq!(reply.header(REJECTED_BY), Some("shop/calls_per_consumer"));
    let retry: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"shop/calls_per_consumer\";q=5;w=60")
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some(&*format!("\"shop/calls_per_consumer\";r=0;t={retry}"))
    );
    for _ in 0..5 {
        assert_eq!(get("/calls", "erp").await.status, StatusCode::OK);
    }

    // Bytes: 4,000-byte responses, and a call is refused once the window's bytes have
    // reached the amount: 0, 4,000 and 8,000 are under 10,000, 12,000 is not. Exactly
    // three calls pass (the default status, 429, for this rule).
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(get("/bytes", "crm").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let rejected = get("/bytes", "crm").await;
    assert_eq!(rejected.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        rejected.header(REJECTED_BY),
        Some("shop/bytes_per_consumer")
    );
    assert_eq!(get("/bytes", "erp").await.status, StatusCode::OK);

    // Request bytes count too: one 12,000-byte upload exhausts ops' budget.
    let upload = |n: usize| {
        let client = client.clone();
        let url = agent.url("/bytes/echo");
        async move {
            let req = http::Request::post(url)
                .header("x-consumer", "ops")
                .body(http_body_util::Full::new(bytes::Bytes::from(vec![1_u8; n])))
                .unwrap();
            client.send(req).await.unwrap()
        }
    };
    assert_eq!(upload(12_000).await.status, StatusCode::OK);
    assert_eq!(upload(10).await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn fuse_trips_on_upstream_5xx_holds_for_everyone_and_admits_after_release() {
    let up = upstream().flaky("/flaky").start().await;
    let agent = agent()
        .config(
            r#"
service: shop
version: fuse-v1
rules:
  - name: shop/flaky_upstream
    on: { path: { kind: PATH_KIND_PREFIX, value: /flaky } }
    fuse:
      trips:
        - { metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 3, window_ms: 60000 }
      reject_status: 502
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let client = http();
    up.set_failing(true);

    let mut errors = 0;
    let tripped = loop {
        let reply = client.get(&agent.url("/flaky")).await.unwrap();
        if reply.status == StatusCode::INTERNAL_SERVER_ERROR {
            errors += 1;
            assert!(errors <= 3, "the fuse did not trip after 3 errors");
            continue;
        }
        break reply;
    };
    assert_eq!(errors, 3);
    assert_eq!(tripped.status, StatusCode::BAD_GATEWAY);
    assert_eq!(tripped.header(REJECTED_BY), Some("shop/flaky_upstream"));

    // The upstream recovers, but the fuse stays open for every consumer until an
    // operator releases it; the upstream sees no call meanwhile.
    up.set_failing(false);
    let seen = up.received();
    for consumer in ["crm", "erp", "ops"] {
        let reply = client
            .get_with(&agent.url("/flaky"), &[("x-gov-consumer", consumer)])
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    }
    assert_eq!(up.received(), seen);
    let metrics = client
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_fuse_state{rule=\"shop/flaky_upstream\"} 1"),
        "{metrics}"
    );

    assert_eq!(
        agent
            .sidecar
            .engine()
            .release_fuse("shop/flaky_upstream", "test"),
        Ok(true)
    );
    let reply = client.get(&agent.url("/flaky")).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(up.received(), seen + 1);
}

#[tokio::test]
async fn metrics_expose_every_rule_series() {
    let up = upstream()
        .fast("/a", ms(0))
        .slow("/slow", ms(200))
        .start()
        .await;
    let agent = agent()
        .config(
            r#"
service: shop
version: metrics-v1
rules:
  - name: shop/one_at_a_time
    on: { path: { kind: PATH_KIND_EXACT, value: /slow } }
    bulkhead:
      max_concurrent: 1
  - name: shop/all_calls
    on: { any: true }
    limit:
      calls: { amount: 1000, window_ms: 60000 }
  - name: shop/errors
    on: { any: true }
    fuse:
      trips:
        - { metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 100, window_ms: 60000 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let client = http();
    for _ in 0..3 {
        assert_eq!(
            client.get(&agent.url("/a")).await.unwrap().status,
            StatusCode::OK
        );
    }
    let slow = agent.url("/slow");
    let (a, b) = tokio::join!(client.get(&slow), client.get(&slow));
    let mut statuses = [a.unwrap().status.as_u16(), b.unwrap().status.as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 408]);
    assert_eq!(up.peak_in_flight("/slow"), 1, "a bulkhead of one");

    let reply = client.get(&agent.admin_url("/metrics")).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = reply.text();
    for line in [
        "# TYPE gov_agent_rule_admitted_total counter",
        "# TYPE gov_agent_rule_latency_seconds histogram",
        "gov_agent_ready 1",
        "gov_agent_config_info{service=\"shop\",version=\"metrics-v1\"} 1",
        "gov_agent_config_reloads_total{result=\"refused\"} 0",
        // The call the bulkhead rejected counts as admitted by no rule.
        "gov_agent_rule_admitted_total{rule=\"shop/all_calls\"} 4",
        "gov_agent_rule_admitted_total{rule=\"shop/one_at_a_time\"} 1",
        "gov_agent_rule_rejected_total{rule=\"shop/one_at_a_time\",reason=\"bulkhead_full\"} 1",
        "gov_agent_rule_rejected_total{rule=\"shop/all_calls\",reason=\"limit_calls\"} 0",
        "gov_agent_rule_in_flight{rule=\"shop/all_calls\"} 0",
        "gov_agent_rule_waiting{rule=\"shop/one_at_a_time\"} 0",
        "gov_agent_rule_latency_seconds_bucket{rule=\"shop/all_calls\",le=\"0.01\"}",
        "gov_agent_rule_latency_seconds_bucket{rule=\"shop/one_at_a_time\",le=\"+Inf\"} 1",
        "gov_agent_rule_latency_seconds_count{rule=\"shop/all_calls\"} 4",
        "gov_agent_fuse_state{rule=\"shop/errors\"} 0",
        "gov_agent_limit_engaged{rule=\"shop/all_calls\"} 0",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    // The admitted slow call took at least 200 ms: none in the buckets up to 0.1 s,
    // and the histogram's sum says so too.
    assert!(
        text.contains(
            "gov_agent_rule_latency_seconds_bucket{rule=\"shop/one_at_a_time\",le=\"0.1\"} 0"
        ),
        "{text}"
    );
    let sum: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("gov_agent_rule_latency_seconds_sum{rule=\"shop/one_at_a_time\"} ")
        })
        .unwrap_or_else(|| panic!("no _sum in:\n{text}"))
        .parse()
        .unwrap();
    assert!(sum >= 0.2, "{sum}");
    // A rule shows only the reasons its kind can give.
    for line in text
        .lines()
        .filter(|l| l.starts_with("gov_agent_rule_rejected_total{"))
    {
        let kind_of = |rule: &str| match rule {
            "shop/one_at_a_time" => "bulkhead_",
            "shop/all_calls" => "limit_",
            "shop/errors" => "fuse_",
            other => panic!("unexpected rule {other}"),
        };
        let rule = line.split('"').nth(1).unwrap();
        let reason = line.split('"').nth(3).unwrap();
        // `timeout`: a call outlived its bulkhead's per-call timeout.
        let bulkhead_timeout = kind_of(rule) == "bulkhead_" && reason == "timeout";
        assert!(
            reason.starts_with(kind_of(rule)) || bulkhead_timeout,
            "{line}"
        );
    }
    for line in [
        "gov_agent_build_info{version=\"",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    // Standalone: no control plane, so no connected gauge.
    assert!(
        !text.contains("gov_agent_control_plane_connected"),
        "{text}"
    );

    // GET /config: the config in force, its version and where it came from.
    let reply = client.get(&agent.admin_url("/config")).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    let config: serde_json::Value = serde_json::from_str(&reply.text()).unwrap();
    assert_eq!(config["service"], "shop");
    assert_eq!(config["version"], "metrics-v1");
    assert!(
        config["source"].as_str().unwrap().starts_with("file "),
        "{config}"
    );
    assert_eq!(config["config"]["version"], "metrics-v1");
}

/// A client-side bulkhead per upstream instance on the outbound listener: each
/// instance of `inventory` gets its own permits.
#[tokio::test]
async fn outbound_bulkhead_per_instance_caps_each_instance_separately() {
    let a = upstream().slow("/stock", ms(200)).start().await;
    let b = upstream().slow("/stock", ms(200)).start().await;
    let local = upstream().start().await;
    let agent = agent()
        .config(
            r#"
service: shop
version: outbound-v1
rules:
  - name: shop/per_instance
    on: { calls_to: inventory }
    direction: DIRECTION_OUTBOUND
    bulkhead:
      key: BULKHEAD_KEY_INSTANCE
      max_concurrent: 1
"#,
        )
        .upstream(&local)
        .instances("inventory", &[&a, &b])
        .start()
        .await;
    let client = http();
    let url = agent.outbound_url("/stock");
    // The balancer spreads four calls at once two per instance (an instance with a
    // call outstanding and no latency yet costs more): the second call to each
    // instance finds its one permit taken.
    let calls: Vec<_> = (0..4)
        .map(|_| client.get_with(&url, &[("gov-service", "inventory")]))
        .collect();
    let replies = futures::future::join_all(calls).await;
    let mut statuses: Vec<u16> = replies
        .iter()
        .map(|r| r.as_ref().unwrap().status.as_u16())
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 408, 408]);
    assert_eq!(
        (a.peak_in_flight("/stock"), b.peak_in_flight("/stock")),
        (1, 1)
    );
    let rejected = replies
        .iter()
        .map(|r| r.as_ref().unwrap())
        .find(|r| r.status == StatusCode::REQUEST_TIMEOUT)
        .unwrap();
    assert_eq!(rejected.header(REJECTED_BY), Some("shop/per_instance"));

    // Inbound calls are not governed by the outbound rule.
    assert_eq!(
        client.get(&agent.url("/")).await.unwrap().status,
        StatusCode::NOT_FOUND
    );
}

/// `headers always` (`ratelimit_headers_always`): admitted calls carry the
/// `RateLimit-Policy` and `RateLimit` headers too, counting down what is left,
/// on the HTTP/1 path and on hyper's (h2c); a limit without it adds nothing to
/// an admitted call.
#[tokio::test]
async fn admitted_calls_say_what_is_left_when_the_limit_says_headers_always() {
    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let up = upstream()
        .fast("/told", ms(0))
        .fast("/quiet", ms(0))
        .start()
        .await;
    let agent = agent()
        .config(
            r#"
service: shop
version: told-v1
rules:
  - name: shop/told
    on: { path: { kind: PATH_KIND_EXACT, value: /told } }
    limit:
      calls: { amount: 3, window_ms: 3600000 }
      ratelimit_headers_always: true
  - name: shop/quiet
    on: { path: { kind: PATH_KIND_EXACT, value: /quiet } }
    limit:
      calls: { amount: 3, window_ms: 3600000 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let policy = "\"shop/told\";q=3;w=3600";
    let left = |reply: &crate::support::Reply| -> (u64, u64) {
        let state = reply.header("ratelimit").expect("a RateLimit header");
        let rest = state
            .strip_prefix("\"shop/told\";r=")
            .unwrap_or_else(|| panic!("{state}"));
        let (r, t) = rest.split_once(";t=").unwrap_or_else(|| panic!("{state}"));
        (r.parse().unwrap(), t.parse().unwrap())
    };

    // HTTP/1.1: the agent's own codec.
    let h1 = http();
    let first = h1.get(&agent.url("/told")).await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("ratelimit-policy"), Some(policy));
    let (r, t) = left(&first);
    assert_eq!(r, 2);
    assert!((3590..=3600).contains(&t), "t={t}");
    assert_eq!(left(&h1.get(&agent.url("/told")).await.unwrap()).0, 1);

    // h2c: hyper's path.
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::get(agent.url("/told"))
        .body(Full::default())
        .unwrap();
    let third = h2.request(req).await.unwrap();
    assert_eq!(third.status(), StatusCode::OK);
    let headers = third.headers().clone();
    let _ = third.into_body().collect().await;
    assert_eq!(headers["ratelimit-policy"], policy);
    assert!(
        headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"shop/told\";r=0;t="),
        "{:?}",
        headers["ratelimit"]
    );

    // Spent: the refusal says so as before.
    let refused = h1.get(&agent.url("/told")).await.unwrap();
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(left(&refused).0, 0);

    // Without `headers always`, an admitted call carries nothing.
    let quiet = h1.get(&agent.url("/quiet")).await.unwrap();
    assert_eq!(quiet.status, StatusCode::OK);
    assert_eq!(quiet.header("ratelimit-policy"), None);
    assert_eq!(quiet.header("ratelimit"), None);
}
