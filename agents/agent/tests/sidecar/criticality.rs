//! Criticality through the `gov-agent` binary: under overload of a
//! bulkhead, the sheddable consumer's calls are refused at once while the
//! critical consumer's calls wait and are served first (docs/language.md,
//! "Criticality").

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::{binary, http, ms, upstream};

const CONFIG: &str = r#"
service: shop
version: criticality-v1
consumer_header: x-consumer
matches:
  - name: crm
    expr: { consumer: crm }
    criticality: CRITICALITY_CRITICAL
  - name: batch
    expr: { consumer: batch }
    criticality: CRITICALITY_SHEDDABLE
rules:
  - name: shop/reports
    on: { path: { kind: PATH_KIND_PREFIX, value: /reports } }
    mode: MODE_ENFORCE
    bulkhead:
      reject_status: 408
      reject_grpc_status: GRPC_CODE_UNAVAILABLE
      max_concurrent: 2
      max_wait_ms: 5000
      queue: { codel: { target_ms: 5000, interval_ms: 10000 } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_calls_are_refused_while_critical_ones_are_served() {
    let up = upstream().slow("/reports", ms(100)).start().await;
    let agent = binary().upstream(&up).config(CONFIG).spawn();
    let url = format!("http://{}/reports", agent.inbound);
    let client = http();

    // Overload: 8 closed-loop `batch` callers and 2 `crm` callers on 2
    // permits, for 3 s (each loop bounded in count too).
    let caller = |consumer: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs(3);
            let mut out = Vec::new();
            while Instant::now() < end && out.len() < 2_000 {
                let status = client
                    .get_with(&url, &[("x-consumer", consumer)])
                    .await
                    .map(|r| r.status);
                if status != Ok(StatusCode::OK) {
                    tokio::time::sleep(ms(5)).await;
                }
                out.push(status);
            }
            out
        })
    };
    let batch: Vec<_> = (0..8).map(|_| caller("batch")).collect();
    let crm: Vec<_> = (0..2).map(|_| caller("crm")).collect();

    let (mut crm_ok, mut batch_ok, mut batch_refused) = (0, 0, 0);
    for c in crm {
        for status in c.await.unwrap() {
            assert_eq!(status, Ok(StatusCode::OK), "every critical call is served");
            crm_ok += 1;
        }
    }
    for b in batch {
        for status in b.await.unwrap() {
            match status {
                Ok(StatusCode::OK) => batch_ok += 1,
                Ok(StatusCode::REQUEST_TIMEOUT) => batch_refused += 1,
                other => panic!("only 200 or the bulkhead's 408: {other:?}"),
            }
        }
    }
    assert!(crm_ok >= 10, "crm served {crm_ok}");
    assert!(batch_refused > 0, "batch refused none ({batch_ok} served)");
    assert!(
        up.peak_in_flight("/reports") <= 2,
        "never more than the permits upstream"
    );

    // The refusals are the bulkhead's fail-fast kind: none waited.
    let metrics = client
        .get(&format!("http://{}/metrics", agent.admin))
        .await
        .unwrap()
        .text();
    let count = |reason: &str| -> u64 {
        let series =
            format!("gov_agent_rule_rejected_total{{rule=\"shop/reports\",reason=\"{reason}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(count("bulkhead_full"), batch_refused);
    assert_eq!(count("bulkhead_timeout"), 0);
}
