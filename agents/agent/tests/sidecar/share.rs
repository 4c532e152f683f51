//! A bulkhead's fair share through the proxy (issue 32): one greedy
//! consumer with many callers does not starve two polite ones, whose calls
//! get the permits their shares hold as they free up.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::{Http, agent, http, ms, upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_consumer_does_not_starve_two_polite_ones() {
    let up = upstream().tunable("/slow", ms(50)).start().await;
    let agent = agent()
        .config(
            r#"
service: shop
version: share-v1
rules:
  - name: shop/slow
    on: { path: { kind: PATH_KIND_PREFIX, value: /slow } }
    bulkhead:
      max_concurrent: 6
      max_wait_ms: 500
      share:
        default_weight: 1
        weights:
          - { consumer: crm, weight: 1 }
          - { consumer: web, weight: 1 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let client = http();
    let url = agent.url("/slow");
    let end = Instant::now() + Duration::from_secs(4);

    // `batch`: 24 closed-loop callers, each pausing 5 ms after a refusal;
    // `crm` and `web`: one caller each, a call every 60 ms or so.
    let caller = |consumer, pause| caller(&client, &url, consumer, pause, end);
    let greedy: Vec<_> = (0..24).map(|_| caller("batch", Duration::ZERO)).collect();
    tokio::time::sleep(ms(300)).await;
    let polite = [caller("crm", ms(10)), caller("web", ms(10))];

    let mut greedy_ok = 0;
    for g in greedy {
        for (_, status) in g.await.unwrap() {
            match status {
                Ok(StatusCode::OK) => greedy_ok += 1,
                Ok(StatusCode::REQUEST_TIMEOUT) => {}
                other => panic!("only 200 or the bulkhead's 408: {other:?}"),
            }
        }
    }
    for (name, p) in ["crm", "web"].into_iter().zip(polite) {
        let statuses = p.await.unwrap();
        let ok = statuses
            .iter()
            .filter(|(_, s)| *s == Ok(StatusCode::OK))
            .count();
        assert!(statuses.len() >= 10, "{name}: {} calls", statuses.len());
        // Within its share it waits for the next released permit: never
        // refused while the greedy consumer's borrowed permits free up.
        assert_eq!(ok, statuses.len(), "{name}: {statuses:?}");
    }
    assert!(greedy_ok > 0, "the greedy consumer keeps what is left");
    assert!(up.peak_in_flight("/slow") <= 6, "never more than the pool");
}

/// When a consumer's call was sent, and what it got.
pub(crate) type Call = (Instant, Result<StatusCode, String>);

/// One closed-loop caller of `consumer` until `end`: after each call it
/// pauses `pause`, and at least 5 ms after a refusal.
pub(crate) fn caller(
    client: &Http,
    url: &str,
    consumer: &'static str,
    pause: Duration,
    end: Instant,
) -> tokio::task::JoinHandle<Vec<Call>> {
    let (client, url) = (client.clone(), url.to_owned());
    tokio::spawn(async move {
        let mut calls = Vec::new();
        while Instant::now() < end {
            let at = Instant::now();
            let status = client
                .get_with(&url, &[("x-gov-consumer", consumer)])
                .await
                .map(|r| r.status);
            if status != Ok(StatusCode::OK) || !pause.is_zero() {
                tokio::time::sleep(pause.max(ms(5))).await;
            }
            calls.push((at, status));
        }
        calls
    })
}
