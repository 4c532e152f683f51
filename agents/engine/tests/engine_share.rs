//! A bulkhead's weighted fair share (`share by consumer { ... }`) through
//! the public API, under paused time: clients are tasks that call again as
//! soon as their call ends (greedy) or at a fixed pace (polite).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use gov_engine::{Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, HeaderValue, Method};
use tokio::time::{Instant, sleep, sleep_until};

fn engine(share: &str, limit: u32, wait_ms: u64) -> Arc<Engine> {
    let yaml = format!(
        r#"
service: order
rules:
- name: order/slow
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /slow}}}}
  bulkhead:
    max_concurrent: {limit}
    max_wait_ms: {wait_ms}
{share}
"#
    );
    let mut t: TargetConfig = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let engine = Engine::empty("order");
    engine.apply_target(&t).unwrap();
    Arc::new(engine)
}

/// `crm` and `web` with their weights, `default` 1.
fn share(crm: u32, web: u32) -> String {
    format!(
        "    share:\n      default_weight: 1\n      weights:\n      - {{consumer: crm, weight: {crm}}}\n      - {{consumer: web, weight: {web}}}"
    )
}

/// What one consumer's clients saw.
#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    refused: AtomicU64,
    in_flight: AtomicU64,
    /// The longest wait for a permit, in ms.
    max_wait_ms: AtomicU64,
}

/// One client of `consumer`: calls of `latency` (give or take `jitter`, so
/// that the permits are not all released at once) until `end`, each started
/// `every` after the one before (`ZERO`: as soon as it ends).
fn client(
    e: &Arc<Engine>,
    consumer: &'static str,
    tally: &Arc<Tally>,
    (latency, jitter): (Duration, u64),
    every: Duration,
    end: Instant,
) -> tokio::task::JoinHandle<()> {
    let (e, tally) = (e.clone(), tally.clone());
    // Distinct per client of a consumer (each holds one more count).
    let mut seed = u64::try_from(Arc::strong_count(&tally)).unwrap() * 7919;
    tokio::spawn(async move {
        let mut h = HeaderMap::new();
        h.insert("x-gov-consumer", HeaderValue::from_static(consumer));
        while Instant::now() < end {
            let start = Instant::now();
            match e
                .admit(&RequestInfo::inbound(&Method::GET, "/slow", &h))
                .await
            {
                Ok(a) => {
                    let waited = u64::try_from(start.elapsed().as_millis()).unwrap();
                    tally.max_wait_ms.fetch_max(waited, Relaxed);
                    tally.admitted.fetch_add(1, Relaxed);
                    tally.in_flight.fetch_add(1, Relaxed);
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    let off = if jitter == 0 {
                        0
                    } else {
                        (seed >> 33) % (2 * jitter + 1)
                    };
                    sleep(latency + Duration::from_millis(off) - Duration::from_millis(jitter))
                        .await;
                    tally.in_flight.fetch_sub(1, Relaxed);
                    a.finish(Outcome::Status(200));
                }
                Err(_) => {
                    tally.refused.fetch_add(1, Relaxed);
                    // A refused greedy client tries again at once, but not
                    // in a loop that never yields.
                    sleep(Duration::from_millis(1)).await;
                }
            }
            if !every.is_zero() {
                sleep_until(start + every).await;
            }
        }
    })
}

/// `batch` (a consumer the share does not name: `default`) runs 80 clients
/// back to back on a pool of 10, `crm` and `web` two clients each, a call
/// every 120 ms per client (2 in flight each): returns the tallies.
async fn greedy_vs_polite(share: &str) -> (Arc<Tally>, Arc<Tally>, Arc<Tally>) {
    let e = engine(share, 10, 200);
    let end = Instant::now() + Duration::from_secs(5);
    let (greedy, crm, web) = (
        Arc::new(Tally::default()),
        Arc::new(Tally::default()),
        Arc::new(Tally::default()),
    );
    let latency = (Duration::from_millis(100), 10);
    let mut tasks = Vec::new();
    for _ in 0..80 {
        tasks.push(client(&e, "batch", &greedy, latency, Duration::ZERO, end));
    }
    // The greedy consumer first holds the whole pool.
    sleep(Duration::from_millis(500)).await;
    for _ in 0..2 {
        let every = Duration::from_millis(120);
        tasks.push(client(&e, "crm", &crm, latency, every, end));
        tasks.push(client(&e, "web", &web, latency, every, end));
        sleep(Duration::from_millis(50)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    (greedy, crm, web)
}

#[tokio::test(start_paused = true)]
async fn a_greedy_consumer_does_not_starve_the_polite_ones() {
    let (greedy, crm, web) = greedy_vs_polite(&share(1, 1)).await;
    for (name, t) in [("crm", &crm), ("web", &web)] {
        let (ok, no) = (t.admitted.load(Relaxed), t.refused.load(Relaxed));
        assert!(ok >= 60, "{name}: {ok} admitted");
        assert_eq!(no, 0, "{name}: {no} refused");
        // It waits for the next released permit, not behind the greedy
        // consumer's queue: within one call's latency (100 ms, give or take
        // 10) every permit the greedy one holds is released once.
        let waited = t.max_wait_ms.load(Relaxed);
        assert!(waited <= 110, "{name} waited {waited} ms");
    }
    // The greedy consumer keeps what the polite ones leave.
    assert!(greedy.admitted.load(Relaxed) > 250);
}

/// The same load without a share: the polite consumers queue behind the
/// greedy one's waiters, and many of their calls time out.
#[tokio::test(start_paused = true)]
async fn without_a_share_the_greedy_consumer_starves_the_polite_ones() {
    let (_, crm, web) = greedy_vs_polite("").await;
    for t in [&crm, &web] {
        let (ok, no) = (t.admitted.load(Relaxed), t.refused.load(Relaxed));
        assert!(no * 4 > ok, "{ok} admitted, {no} refused");
    }
}

/// An idle consumer's share is lent, and taken back as it returns, one
/// released permit at a time: `crm` (weight 1) returns to a pool `web`
/// (weight 1) holds whole, and holds its half within one call's latency;
/// when it leaves again, `web` gets the pool back.
#[tokio::test(start_paused = true)]
async fn an_idle_share_is_lent_and_taken_back() {
    let e = engine(&share(1, 1), 10, 1000);
    let latency = Duration::from_millis(100);
    let fixed = (latency, 0);
    let start = Instant::now();
    let (crm, web) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let end = start + Duration::from_secs(2);
        tasks.push(client(&e, "web", &web, fixed, Duration::ZERO, end));
    }
    sleep(Duration::from_millis(350)).await;
    assert_eq!(web.in_flight.load(Relaxed), 10, "web borrows crm's share");
    for _ in 0..8 {
        let end = start + Duration::from_secs(1);
        tasks.push(client(&e, "crm", &crm, fixed, Duration::ZERO, end));
    }
    // Within one latency every permit web held was released once.
    sleep(latency).await;
    let held = (crm.in_flight.load(Relaxed), web.in_flight.load(Relaxed));
    assert_eq!(held, (5, 5), "crm took its share back");
    sleep(Duration::from_millis(500)).await;
    assert_eq!(
        (crm.in_flight.load(Relaxed), web.in_flight.load(Relaxed)),
        (5, 5)
    );
    // crm stops calling at 1 s: web borrows its share again.
    sleep_until(start + Duration::from_millis(1250)).await;
    assert_eq!(
        (crm.in_flight.load(Relaxed), web.in_flight.load(Relaxed)),
        (0, 10)
    );
    for t in tasks {
        t.await.unwrap();
    }
    // crm never waited past `max_wait` (web's 20 greedy clients may: the
    // waiters of one consumer are not served in arrival order).
    assert_eq!(crm.refused.load(Relaxed), 0);
}

/// Two greedy consumers split the pool by weight: 3 to 1 of 8 permits.
#[tokio::test(start_paused = true)]
async fn weights_are_respected() {
    let e = engine(&share(3, 1), 8, 1000);
    let latency = (Duration::from_millis(100), 0);
    let end = Instant::now() + Duration::from_secs(2);
    let (crm, web) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(client(&e, "web", &web, latency, Duration::ZERO, end));
        tasks.push(client(&e, "crm", &crm, latency, Duration::ZERO, end));
    }
    sleep(Duration::from_millis(50)).await;
    for _ in 0..10 {
        sleep(Duration::from_millis(100)).await;
        let held = (crm.in_flight.load(Relaxed), web.in_flight.load(Relaxed));
        assert_eq!(held, (6, 2));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (c, w) = (crm.admitted.load(Relaxed), web.admitted.load(Relaxed));
    assert!(c + 15 >= 3 * w && c <= 3 * w + 15, "{c} vs {w}");
}

/// Hostile callers: names the share does not know (a client rotating its
/// consumer name, a name of 4 KiB) are all `default`, one class: together
/// they get `default`'s share, never one each.
#[tokio::test(start_paused = true)]
async fn unknown_consumer_names_share_the_default_class() {
    let e = engine(&share(1, 1), 12, 1000);
    let latency = (Duration::from_millis(100), 0);
    let end = Instant::now() + Duration::from_secs(1);
    let (crm, others) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        tasks.push(client(&e, "crm", &crm, latency, Duration::ZERO, end));
        let name: &'static str = Box::leak(format!("rotating-{i}").into_boxed_str());
        tasks.push(client(&e, name, &others, latency, Duration::ZERO, end));
    }
    let long: &'static str = Box::leak("x".repeat(4096).into_boxed_str());
    tasks.push(client(&e, long, &others, latency, Duration::ZERO, end));
    sleep(Duration::from_millis(250)).await;
    // crm and default active (web idle): 12 x 1/2 each.
    let held = (crm.in_flight.load(Relaxed), others.in_flight.load(Relaxed));
    assert_eq!(held, (6, 6));
    for t in tasks {
        t.await.unwrap();
    }
}
