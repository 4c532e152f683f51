//! Hot reload of the config file under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gov_engine::REJECTED_BY;
use http::StatusCode;

use crate::support::{Agent, Reply, agent, binary, compiled, http, ms, upstream, write_atomically};

// Both versions govern `/governed` with a rule that admits one call per minute and
// then rejects, each with its own rule name and status: every reply names the one
// version that answered it (a 200 is the one call a fresh counter admits).
const V1: &str = r#"
service: shop
version: reload-v1
rules:
  - name: shop/governed_v1
    on: { path: { kind: PATH_KIND_PREFIX, value: /governed } }
    limit:
      calls: { amount: 1, window_ms: 60000 }
      reject_status: 429
"#;

const V2: &str = r#"
service: shop
version: reload-v2
rules:
  - name: shop/governed_v2
    on: { path: { kind: PATH_KIND_PREFIX, value: /governed } }
    limit:
      calls: { amount: 1, window_ms: 60000 }
      reject_status: 503
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
        .fast("/governed", ms(1))
        .fast("/limited", ms(0))
        .start()
        .await;
    let agent = agent().config(V1).upstream(&up).start().await;
    assert_eq!(version(&agent).as_deref(), Some("reload-v1"));

    // Bounded load on the governed path until the reloads are done (at most 50,000
    // requests per task).
    const MAX: usize = 50_000;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (client, url, stop) = (http(), agent.url("/governed"), stop.clone());
        loops.spawn(async move {
            let mut outcomes = Vec::new();
            while !stop.load(Ordering::SeqCst) && outcomes.len() < MAX {
                outcomes.push(client.get(&url).await.map(|r| Answer::of(&r)));
            }
            outcomes
        });
    }

    let reloads = [(V2, "reload-v2"), (V1, "reload-v1"), (V2, "reload-v2")];
    for (yaml, want) in reloads {
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

    // Every reply is v1's or v2's rejection, or one of the calls a fresh counter
    // admits (at most one per version applied: four); no request failed. Each
    // client sees the versions in the order they were applied: v1, v2, v1, v2.
    let (mut total, mut admitted) = (0, 0);
    while let Some(outcomes) = loops.join_next().await {
        let mut last = None;
        let mut changes = 0;
        let outcomes = outcomes.unwrap();
        let ran_to_the_end = outcomes.len() < MAX;
        for outcome in outcomes {
            total += 1;
            let answer = outcome.expect("a request failed during reloads");
            let version = match answer {
                Answer::Admitted => {
                    admitted += 1;
                    continue;
                }
                Answer::Rejected(version) => version,
                Answer::Other(what) => panic!("a reply no version explains: {what}"),
            };
            if last.is_some_and(|l| l != version) {
                changes += 1;
            }
            last = Some(version);
        }
        assert!(changes <= reloads.len(), "{changes} version changes seen");
        if ran_to_the_end {
            assert_ne!(last, Some(1), "still answered by v1 after the last reload");
        }
    }
    eprintln!("{total} replies, {admitted} admitted");
    assert!(total > 0);
    assert!(
        admitted <= 1 + reloads.len(),
        "{admitted} calls admitted; each version admits one"
    );
    // After the refused configs v2 answers, and only v2.
    let reply = http().get(&agent.url("/governed")).await.unwrap();
    assert_eq!(Answer::of(&reply), Answer::Rejected(2));

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

/// A reply to `/governed`, attributed to the config version that gave it.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Forwarded: the one call a version's fresh counter admits.
    Admitted,
    /// Rejected by version 1 or 2's rule, with that version's status.
    Rejected(u8),
    /// Neither (a half-applied config: one version's status with the other's rule).
    Other(String),
}

impl Answer {
    fn of(reply: &Reply) -> Self {
        match (reply.status.as_u16(), reply.header(REJECTED_BY)) {
            (200, None) if reply.header("x-upstream").is_some() => Self::Admitted,
            (429, Some("shop/governed_v1")) => Self::Rejected(1),
            (503, Some("shop/governed_v2")) => Self::Rejected(2),
            (status, by) => Self::Other(format!("{status} rejected by {by:?}")),
        }
    }
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
