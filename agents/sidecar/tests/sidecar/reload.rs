//! Hot reload of the config file under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gov_engine::REJECTED_BY;
use http::StatusCode;

use crate::support::{Agent, agent, binary, compiled, http, ms, upstream, write_atomically};

const V1: &str = r#"
service: shop
version: reload-v1
rules:
  - name: shop/other
    on: { path: { kind: PATH_KIND_PREFIX, value: /other } }
    limit:
      calls: { amount: 1, window_ms: 60000 }
"#;

const V2: &str = r#"
service: shop
version: reload-v2
rules:
  - name: shop/other
    on: { path: { kind: PATH_KIND_PREFIX, value: /other } }
    limit:
      calls: { amount: 1, window_ms: 60000 }
  - name: shop/limited_once
    on: { path: { kind: PATH_KIND_EXACT, value: /limited } }
    limit:
      calls: { amount: 1, window_ms: 60000 }
"#;

/// Parses, but the engine refuses it: a bulkhead with no permits.
const INVALID: &str = r#"
service: shop
version: reload-bad
rules:
  - name: shop/zero
    on: { any: true }
    bulkhead:
      max_concurrent: 0
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_under_load_fails_no_request_and_enforces_the_new_rule() {
    let up = upstream()
        .fast("/fast", ms(1))
        .fast("/limited", ms(0))
        .start()
        .await;
    let agent = agent().config(V1).upstream(&up).start().await;
    assert_eq!(version(&agent).as_deref(), Some("reload-v1"));

    // Bounded load until the reloads are done (at most 5,000 requests per task).
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (client, url, stop) = (http(), agent.url("/fast"), stop.clone());
        loops.spawn(async move {
            let mut outcomes = Vec::new();
            while !stop.load(Ordering::SeqCst) && outcomes.len() < 5_000 {
                outcomes.push(client.get(&url).await.map(|r| r.status));
            }
            outcomes
        });
    }

    for (yaml, want) in [(V2, "reload-v2"), (V1, "reload-v1"), (V2, "reload-v2")] {
        agent.write_config(yaml);
        wait_for(|| version(&agent).as_deref() == Some(want)).await;
    }
    // A config the engine refuses, then one that does not parse: both are refused
    // with a logged reason and the old config stays in force.
    let refused = agent.sidecar.config_status().counts().1;
    agent.write_config(INVALID);
    wait_for(|| agent.sidecar.config_status().counts().1 == refused + 1).await;
    agent.write_config("service: [unclosed");
    wait_for(|| agent.sidecar.config_status().counts().1 == refused + 2).await;
    assert_eq!(version(&agent).as_deref(), Some("reload-v2"));
    stop.store(true, Ordering::SeqCst);

    let mut total = 0;
    while let Some(outcomes) = loops.join_next().await {
        for outcome in outcomes.unwrap() {
            total += 1;
            assert_eq!(
                outcome,
                Ok(StatusCode::OK),
                "a request failed during reloads"
            );
        }
    }
    assert!(total > 0);

    // The rule that only v2 has is enforced.
    let client = http();
    assert_eq!(
        client.get(&agent.url("/limited")).await.unwrap().status,
        StatusCode::OK
    );
    let reply = client.get(&agent.url("/limited")).await.unwrap();
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header(REJECTED_BY), Some("shop/limited_once"));

    let metrics = client
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_config_info{service=\"shop\",version=\"reload-v2\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gov_agent_config_reloads_total{result=\"refused\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_config_for_another_service_is_refused() {
    let up = upstream().fast("/fast", ms(0)).start().await;
    let agent = agent().config(V1).upstream(&up).start().await;
    agent.write_config(&V2.replace("service: shop", "service: billing"));
    wait_for(|| agent.sidecar.config_status().counts().1 == 1).await;
    assert_eq!(version(&agent).as_deref(), Some("reload-v1"));
}

fn version(agent: &Agent) -> Option<String> {
    agent.sidecar.config_status().version()
}

/// Polls `cond` until it holds; fails the test after 30 s (a bound, not a speed
/// assertion: a reload normally lands within a few hundred milliseconds, but one
/// run on a box busy with builds took more than 10 s).
async fn wait_for(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "condition not reached in 30 s");
        tokio::time::sleep(ms(10)).await;
    }
}

/// The real binary with its log file beside an invalid config: the refusal is
/// logged once. The agent used to watch the whole directory, so its own warning
/// (written to the log file there) made it re-read and refuse again, for ever.
/// Edits to the config itself, in place or by rename, are still seen.
#[tokio::test]
async fn an_invalid_config_beside_the_agents_log_is_refused_once() {
    let up = upstream().fast("/fast", ms(0)).start().await;
    let agent = binary()
        .config(V1)
        .upstream(&up)
        .log_beside_config()
        .spawn();
    let refusals = || agent.log().matches("new config refused").count();
    std::fs::write(agent.config_path(), "service: [").unwrap();
    wait_for(|| refusals() >= 1).await;
    // With the loop, each refusal's own log line caused the next one after the
    // 100 ms debounce: 2 s of quiet would show ten or more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(refusals(), 1, "log:\n{}", agent.log());

    write_atomically(&agent.config_path(), &compiled(V2));
    wait_for(|| agent.log().contains("reload-v2")).await;
    std::fs::write(agent.config_path(), compiled(V1)).unwrap();
    wait_for(|| agent.log().matches("config reloaded").count() >= 2).await;
    assert_eq!(refusals(), 1, "log:\n{}", agent.log());
}
