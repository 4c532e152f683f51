//! A limit's fair share through the proxy (issue 32): a greedy consumer
//! with several closed-loop callers does not use up the windows before two
//! polite ones, whose calls, once they are active, are all admitted.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::share::caller;
use crate::support::{agent, http, ms, upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_consumer_does_not_use_up_a_limit_before_polite_ones() {
    let up = upstream().fast("/quote", Duration::ZERO).start().await;
    // 20 calls a second, 6 (rounded down) sure for each of three classes.
    let agent = agent()
        .config(
            r#"
service: shop
version: limit-share-v1
rules:
  - name: shop/quote
    on: { path: { kind: PATH_KIND_PREFIX, value: /quote } }
    limit:
      calls: { amount: 20, window_ms: 1000 }
      algorithm: LIMIT_ALGORITHM_FIXED_WINDOW
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
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
    let url = agent.url("/quote");
    let end = Instant::now() + Duration::from_secs(4);

    // `batch`: 4 closed-loop callers, each pausing 5 ms after a refusal;
    // `crm` and `web`: a call every 200 ms (5 a window, below their share).
    let caller = |consumer, pause| caller(&client, &url, consumer, pause, end);
    let greedy: Vec<_> = (0..4).map(|_| caller("batch", Duration::ZERO)).collect();
    tokio::time::sleep(ms(300)).await;
    let polite = [caller("crm", ms(200)), caller("web", ms(200))];

    let (mut greedy_ok, mut greedy_refused) = (0, 0);
    for g in greedy {
        for (_, status) in g.await.unwrap() {
            match status {
                Ok(StatusCode::OK) => greedy_ok += 1,
                Ok(StatusCode::TOO_MANY_REQUESTS) => greedy_refused += 1,
                other => panic!("only 200 or the limit's 429: {other:?}"),
            }
        }
    }
    let mut polite_ok = 0;
    for (name, p) in ["crm", "web"].into_iter().zip(polite) {
        let calls = p.await.unwrap();
        assert!(calls.len() >= 10, "{name}: {} calls", calls.len());
        // Its first call makes it active; the window it falls in may be
        // used up already (ends within 1 s of it, plus the call's own
        // latency on loopback): from the next window on, every call fits.
        let first = calls[0].0;
        let later: Vec<_> = calls
            .iter()
            .filter(|(at, _)| *at >= first + ms(1100))
            .collect();
        assert!(later.len() >= 8, "{name}: {calls:?}");
        for (at, status) in &later {
            assert_eq!(
                *status,
                Ok(StatusCode::OK),
                "{name} at {:?}: {calls:?}",
                at.duration_since(first)
            );
        }
        polite_ok += calls
            .iter()
            .filter(|(_, s)| *s == Ok(StatusCode::OK))
            .count();
    }
    assert!(greedy_ok > 0, "the greedy consumer keeps what is left");
    assert!(greedy_refused > 0, "the greedy consumer asked for more");
    // At most 20 a window: 4 s and the 300 ms before the polite ones span at
    // most 6 windows.
    assert!(greedy_ok + polite_ok <= 6 * 20, "{greedy_ok} + {polite_ok}");
}
