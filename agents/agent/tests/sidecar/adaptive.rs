//! An adaptive bulkhead through the proxy (docs/architecture.md, problem 1):
//! its limit, read from `/metrics`, falls while the upstream is slow and
//! rises again once it heals, as measured on the calls it admits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::{Http, agent, http, ms, upstream};

/// The agent's current limit of `rule`.
async fn limit(client: &Http, metrics_url: &str, rule: &str) -> u64 {
    let text = client.get(metrics_url).await.unwrap().text();
    let series = format!("gov_agent_bulkhead_limit{{rule=\"{rule}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
}

/// Polls the limit every 100 ms for at most `within` until `done` holds;
/// returns every value seen.
async fn until(
    client: &Http,
    metrics_url: &str,
    within: Duration,
    done: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let end = Instant::now() + within;
    let mut seen = Vec::new();
    while Instant::now() < end {
        let now = limit(client, metrics_url, "shop/adaptive").await;
        seen.push(now);
        if done(now) {
            return seen;
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("the limit did not get there in {within:?}: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_falls_under_a_slow_upstream_and_rises_after_it_heals() {
    let up = upstream().tunable("/slow", ms(20)).start().await;
    let agent = agent()
        .config(
            r#"
service: shop
version: adaptive-v1
rules:
  - name: shop/adaptive
    on: { path: { kind: PATH_KIND_PREFIX, value: /slow } }
    bulkhead:
      max_concurrent: 16
      adaptive: { min: 2, max: 16 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let client = http();
    let metrics = agent.admin_url("/metrics");
    assert_eq!(
        limit(&client, &metrics, "shop/adaptive").await,
        2,
        "starts at min"
    );

    // 24 closed-loop callers, each pausing 5 ms after a refusal; bounded
    // by a stop flag and a 90 s deadline.
    let stop = Arc::new(AtomicBool::new(false));
    let url = agent.url("/slow");
    let callers: Vec<_> = (0..24)
        .map(|_| {
            let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let end = Instant::now() + Duration::from_secs(90);
                let mut statuses = Vec::new();
                while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                    let status = client.get(&url).await.map(|r| r.status);
                    if status != Ok(StatusCode::OK) {
                        tokio::time::sleep(ms(5)).await;
                    }
                    statuses.push(status);
                }
                statuses
            })
        })
        .collect();

    // Healthy: the limit grows toward max, measured under load.
    until(&client, &metrics, Duration::from_secs(20), |l| l >= 12).await;
    // Slow: fifteen times the latency; the limit falls toward min.
    up.set_delay(ms(300));
    until(&client, &metrics, Duration::from_secs(20), |l| l <= 4).await;
    // Healed: the limit rises again as latency falls.
    up.set_delay(ms(20));
    until(&client, &metrics, Duration::from_secs(20), |l| l >= 12).await;
    stop.store(true, Ordering::SeqCst);

    let mut ok = 0;
    for caller in callers {
        for status in caller.await.unwrap() {
            match status {
                Ok(StatusCode::OK) => ok += 1,
                Ok(StatusCode::REQUEST_TIMEOUT) => {}
                other => panic!("only 200 or the bulkhead's 408: {other:?}"),
            }
        }
    }
    assert!(ok > 0);
    assert!(
        up.peak_in_flight("/slow") <= 16,
        "never more than max in flight upstream"
    );
}
