//! `scope cluster` limits against a real `redis-server` on 127.0.0.1 (one
//! server per test, on an ephemeral port, killed on drop): two engines share
//! one limit as two agents of a service would.
//!
//! These tests run in real time (Redis windows follow the wall clock); every
//! loop is bounded in count and time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gov_engine::{Engine, InvalidConfig, RejectReason, Rejection, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

/// A `redis-server` child process.
struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    fn start() -> Self {
        // Bind port 0, read the port, release it for redis-server.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = Self { port, child: None };
        server.restart();
        server
    }

    /// Starts (again) on the same port and waits until it answers PING.
    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // `DEBUG SLEEP` makes it slow on demand.
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `redis-server` ({e}); these tests need it on PATH: \
                     `apt-get install -y redis-server` (.ci/run installs it)"
                )
            });
        self.child = Some(child);
        for _ in 0..200 {
            if self.ping() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} never answered PING", self.port);
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(1))).ok();
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// Sends a signal (`STOP`: hang it, `CONT`: resume it).
    fn signal(&self, signal: rustix::process::Signal) {
        let pid = i32::try_from(self.child.as_ref().unwrap().id()).unwrap();
        rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), signal)
            .unwrap();
    }

    /// One command, its reply's first line (`+OK`, `:1`, `$2`...).
    fn command(&self, args: &[&str]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn limit_config(amount: u64, window_ms: u64, sync: &str, release: &str) -> TargetConfig {
    let yaml = format!(
        r"
service: order
version: v1
rules:
- name: order/shared
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /api}}}}
  limit:
    calls: {{amount: {amount}, window_ms: {window_ms}}}
    scope: LIMIT_SCOPE_CLUSTER
    {sync}
    {release}
"
    );
    let mut target = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut target);
    target
}

const EXACT: &str = "sync: CLUSTER_SYNC_EXACT";

fn agent(redis: &RedisServer, config: &TargetConfig) -> Engine {
    let store = gov_agent::cluster::redis(&redis.url()).unwrap();
    let engine = Engine::with_cluster_store("order", store);
    engine.apply_target(config).unwrap();
    engine
}

/// One call, bounded: a slow or dead Redis must not hold it beyond its timeout.
async fn call(engine: &Engine) -> Result<(), Rejection> {
    let headers = HeaderMap::new();
    let info = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
    tokio::time::timeout(Duration::from_secs(2), engine.admit(&info))
        .await
        .expect("a decision took more than 2s")
        .map(drop)
}

fn wall_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Waits for the next window if fewer than `need_ms` are left in this one.
async fn fit_in_one_window(window_ms: u64, need_ms: u64) {
    let left = window_ms - wall_ms() % window_ms;
    if left < need_ms {
        tokio::time::sleep(Duration::from_millis(left + 20)).await;
    }
}

/// Polls `cond` every 20ms for at most `limit`.
async fn eventually(limit: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_two_agents_admit_exactly_the_amount() {
    let redis = RedisServer::start();
    let config = limit_config(40, 60_000, EXACT, "");
    let (a, b) = (agent(&redis, &config), agent(&redis, &config));
    fit_in_one_window(60_000, 20_000).await;
    let run = |e: Engine| {
        tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..50 {
                match call(&e).await {
                    Ok(()) => admitted += 1,
                    Err(r) => assert_eq!(r.reason, RejectReason::LimitCalls),
                }
            }
            admitted
        })
    };
    let (ta, tb) = (run(a.clone()), run(b.clone()));
    let total = ta.await.unwrap() + tb.await.unwrap();
    eprintln!("admitted {total}");
    assert_eq!(total, 40, "two agents share one exact counter");
    assert_eq!(a.stats().cluster_store_up, Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_counters_are_shared_per_consumer() {
    let redis = RedisServer::start();
    for sync in [EXACT, "sync: CLUSTER_SYNC_BATCH\n    sync_batch_ms: 20"] {
        let mut config = limit_config(2, 60_000, sync, "");
        let rule = &mut config.rules[0];
        rule.name = format!("order/per_consumer_{}", sync.len());
        if let Some(gov_proto::v1::rule::Spec::Limit(limit)) = &mut rule.spec {
            limit.key = gov_proto::v1::LimitKey::Consumer as i32;
        }
        let (a, b) = (agent(&redis, &config), agent(&redis, &config));
        fit_in_one_window(60_000, 10_000).await;
        let consumer = |e: &Engine, who: &'static str| {
            let e = e.clone();
            async move {
                let mut headers = HeaderMap::new();
                headers.insert("x-gov-consumer", who.parse().unwrap());
                let info = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
                e.admit(&info).await.is_ok()
            }
        };
        // crm: one call on each agent, then the flush, then none left anywhere.
        assert!(consumer(&a, "crm").await);
        assert!(consumer(&b, "crm").await);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!consumer(&a, "crm").await, "{sync}");
        assert!(!consumer(&b, "crm").await, "{sync}");
        // Another consumer has its own counter.
        assert!(consumer(&b, "shop").await);
        assert!(consumer(&a, "shop").await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_agents_lease_their_calls_and_admit_the_amount_no_more() {
    let redis = RedisServer::start();
    // 100 calls per 10s, leases topped up every 50ms.
    let mut config = limit_config(
        100,
        10_000,
        "sync: CLUSTER_SYNC_BATCH\n    sync_batch_ms: 50",
        "",
    );
    for agents in [2, 4] {
        config.rules[0].name = format!("order/leased_{agents}");
        // A deadline a loaded test machine does not miss: this test is about
        // the bound while the store answers (the outages are other tests').
        let engines: Vec<Engine> = (0..agents)
            .map(|_| {
                let store =
                    gov_agent::cluster::redis_with_timeout(&redis.url(), Duration::from_secs(1))
                        .unwrap();
                let engine = Engine::with_cluster_store("order", store);
                engine.apply_target(&config).unwrap();
                engine
            })
            .collect();
        fit_in_one_window(10_000, 4_000).await;
        // Each agent offers one call every 5ms (200/s) for at most 2s: up to
        // 400 x agents calls for 100.
        let runs: Vec<_> = engines
            .iter()
            .map(|e| {
                let e = e.clone();
                tokio::spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_millis(5));
                    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let mut admitted = 0u64;
                    for _ in 0..400 {
                        every.tick().await;
                        match call(&e).await {
                            Ok(()) => admitted += 1,
                            Err(r) => assert_eq!(r.reason, RejectReason::LimitCalls),
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut total = 0;
        for run in runs {
            total += run.await.unwrap();
        }
        eprintln!("{agents} agents admitted {total} of 100");
        for e in &engines {
            assert_eq!(
                e.cluster_store().unwrap().outages(),
                0,
                "the store answered"
            );
        }
        // docs/operations.md: while the store answers, a window admits at most
        // the amount; every agent stayed busy, so no lease was left unused.
        assert_eq!(total, 100, "{agents} agents");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_engaged_by_one_agent_holds_for_the_other_until_released() {
    let redis = RedisServer::start();
    let config = limit_config(3, 1_000, EXACT, "release: {after_ms: 3600000}");
    let (a, b) = (agent(&redis, &config), agent(&redis, &config));
    fit_in_one_window(1_000, 500).await;
    let mut events = b.subscribe();
    for _ in 0..3 {
        call(&a).await.unwrap();
    }
    let r = call(&a).await.unwrap_err();
    assert_eq!(r.retry_after_secs(), Some(3600));
    // b has never been over the limit itself, and is refused, in later windows too.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let r = call(&b).await.unwrap_err();
    assert!(r.retry_after_secs().unwrap() > 3500, "{r:?}");
    assert_eq!(b.engaged_limits().len(), 1);
    assert_eq!(
        events.recv().await.unwrap().kind,
        gov_engine::EventKind::LimitEngaged
    );
    // A release on a clears the store, so both admit again.
    assert_eq!(
        a.release_limit_everywhere("order/shared", None, "ops")
            .await,
        Ok(true)
    );
    // b reads latches back every 100ms, so it shows released without traffic.
    assert!(
        eventually(Duration::from_secs(2), async || b
            .engaged_limits()
            .is_empty())
        .await,
        "b still shows the limit engaged"
    );
    call(&a).await.unwrap();
    call(&b).await.unwrap();
}

/// A latch is `gov:{RULE:KEY}:latch`, as docs/operations.md names it; one an
/// older release wrote as `gov:{RULE:KEY}}:latch` is renamed when an agent
/// starts, with its expiry, and still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latches_have_the_documented_name_and_older_ones_are_renamed_and_kept() {
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let legacy = "gov:{order/shared:}}:latch";
    let documented = "gov:{order/shared:}:latch";
    let () = redis::cmd("SET")
        .arg(legacy)
        .arg("1")
        .arg("PX")
        .arg(3_600_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let config = limit_config(3, 60_000, EXACT, "release: {after_ms: 3600000}");
    let a = agent(&redis, &config);
    let mut conn2 = conn.clone();
    assert!(
        eventually(Duration::from_secs(5), async || {
            redis::cmd("EXISTS")
                .arg(legacy)
                .query_async::<u64>(&mut conn2)
                .await
                .unwrap()
                == 0
        })
        .await,
        "the older latch was not renamed"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(documented)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 3_000_000, "the expiry is kept: {ttl}");
    // The consumer stays refused, with the latch's own time left.
    let r = call(&a).await.unwrap_err();
    assert!(r.retry_after_secs().unwrap() > 3_000, "{r:?}");
    // A latch engaged now has the documented name.
    let () = redis::cmd("DEL")
        .arg(documented)
        .query_async(&mut conn)
        .await
        .unwrap();
    let b = agent(
        &redis,
        &limit_config(1, 60_000, EXACT, "release: {after_ms: 3600000}"),
    );
    let _ = call(&b).await;
    let _ = call(&b).await;
    assert!(call(&b).await.is_err());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("gov:*latch")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys, [documented]);
}

/// A release inside the window whose count engaged the latch holds for
/// every agent: the store's counter starts again with the latch gone, so the
/// next calls are admitted, and the latch comes back only when the limit is
/// exceeded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_an_over_count_window_holds_until_the_limit_is_exceeded_again() {
    let redis = RedisServer::start();
    let config = limit_config(3, 60_000, EXACT, "release: {after_ms: 3600000}");
    let (a, b) = (agent(&redis, &config), agent(&redis, &config));
    fit_in_one_window(60_000, 10_000).await;
    for _ in 0..3 {
        call(&a).await.unwrap();
    }
    assert!(call(&a).await.is_err());
    assert!(call(&b).await.is_err(), "b sees the latch");
    assert_eq!(
        a.release_limit_everywhere("order/shared", Some(""), "ops")
            .await,
        Ok(true)
    );
    // b reads latches back every 100ms.
    assert!(
        eventually(Duration::from_secs(2), async || b
            .engaged_limits()
            .is_empty())
        .await,
        "b still shows the limit engaged"
    );
    // The same window: a fresh count of 3 across both agents, then engaged.
    call(&b).await.unwrap();
    call(&a).await.unwrap();
    call(&b).await.unwrap();
    let r = call(&a).await.unwrap_err();
    assert!(r.retry_after_secs().unwrap() > 3_500, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_one_consumers_latch_in_the_store_leaves_the_others() {
    let redis = RedisServer::start();
    let mut config = limit_config(1, 1_000, EXACT, "release: {manual: true}");
    if let Some(gov_proto::v1::rule::Spec::Limit(limit)) = &mut config.rules[0].spec {
        limit.key = gov_proto::v1::LimitKey::Consumer as i32;
    }
    let (a, b) = (agent(&redis, &config), agent(&redis, &config));
    fit_in_one_window(1_000, 500).await;
    let call_as = |e: &Engine, who: &'static str| {
        let e = e.clone();
        async move {
            let mut headers = HeaderMap::new();
            headers.insert("x-gov-consumer", who.parse().unwrap());
            let info = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
            e.admit(&info).await.is_ok()
        }
    };
    for who in ["crm", "shop"] {
        assert!(call_as(&a, who).await);
        assert!(!call_as(&a, who).await, "{who} engages");
    }
    // b reads both latches from the store.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!call_as(&b, "crm").await);
    assert!(!call_as(&b, "shop").await);
    // Releasing crm deletes its latch only: b admits crm, not shop.
    assert_eq!(
        a.release_limit_everywhere("order/shared", Some("crm"), "ops")
            .await,
        Ok(true)
    );
    assert!(
        eventually(Duration::from_secs(3), async || call_as(&b, "crm").await).await,
        "b never saw crm released"
    );
    assert!(!call_as(&b, "shop").await, "shop stays latched");
    assert!(!call_as(&a, "shop").await, "shop stays latched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_latch_reaches_the_other_agent_at_its_next_flush() {
    let redis = RedisServer::start();
    let config = limit_config(
        3,
        1_000,
        "sync: CLUSTER_SYNC_BATCH\n    sync_batch_ms: 50",
        "release: {manual: true}",
    );
    let (a, b) = (agent(&redis, &config), agent(&redis, &config));
    fit_in_one_window(1_000, 500).await;
    for _ in 0..3 {
        call(&a).await.unwrap();
    }
    assert!(call(&a).await.is_err());
    // b makes no call (one would be refused by the spent lease and engage
    // b itself): it reads the latch back at a flush.
    assert!(
        eventually(Duration::from_secs(3), async || !b
            .engaged_limits()
            .is_empty())
        .await,
        "b never saw the latch"
    );
    assert!(call(&b).await.is_err());
    assert!(b.engaged_limits()[0].remaining.is_none(), "manual release");
    assert_eq!(
        b.release_limit_everywhere("order/shared", None, "ops")
            .await,
        Ok(true)
    );
    // The next window (the old one is full), and at most a flush later for a.
    fit_in_one_window(1_000, 1_000).await;
    assert!(
        eventually(Duration::from_secs(3), async || call(&a).await.is_ok()).await,
        "a never saw the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_falls_back_to_local_counting_and_recovers() {
    let mut redis = RedisServer::start();
    let config = limit_config(5, 60_000, EXACT, "");
    let a = agent(&redis, &config);
    fit_in_one_window(60_000, 20_000).await;
    for _ in 0..5 {
        call(&a).await.unwrap();
    }
    assert!(call(&a).await.is_err(), "the shared counter is full");

    redis.kill();
    // Local counting with the full amount: the first call notices the outage.
    let mut admitted = 0;
    for _ in 0..8 {
        if call(&a).await.is_ok() {
            admitted += 1;
        }
    }
    assert!((4..=5).contains(&admitted), "admitted {admitted} locally");
    assert_eq!(a.stats().cluster_store_up, Some(false));
    assert_eq!(a.cluster_store().unwrap().outages(), 1, "one outage logged");

    redis.restart();
    assert!(
        eventually(Duration::from_secs(5), async || a.stats().cluster_store_up
            == Some(true))
        .await,
        "the store never came back"
    );
    // The new server has empty counters: shared counting starts again.
    for _ in 0..5 {
        call(&a).await.unwrap();
    }
    assert!(call(&a).await.is_err());
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("gov:{order/shared:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_at_most_its_timeout_then_calls_are_local() {
    const TIMEOUT: Duration = Duration::from_millis(200);
    let redis = RedisServer::start();
    let config = limit_config(
        100,
        60_000,
        "sync: CLUSTER_SYNC_EXACT\n    sync_timeout_ms: 200",
        "",
    );
    let store = gov_agent::cluster::redis_with_timeout(&redis.url(), TIMEOUT).unwrap();
    let a = Engine::with_cluster_store("order", store);
    a.apply_target(&config).unwrap();
    call(&a).await.unwrap();
    redis.signal(rustix::process::Signal::STOP);
    // The first call waits for the store's deadline (its one retry included), and
    // the store is then down: the other 19 count locally at once. Were each call to
    // wait for the store, 20 would take 20 x 200ms = 4s; the bound allows the first
    // call two deadlines and everything else one more (generous slack for a busy
    // machine; an upper bound, not a speed assertion).
    let started = tokio::time::Instant::now();
    for _ in 0..20 {
        call(&a).await.unwrap();
    }
    let took = started.elapsed();
    eprintln!("20 calls against a hung Redis: {took:?}");
    assert!(
        took < TIMEOUT * 3,
        "20 calls against a hung Redis took {took:?} with a {TIMEOUT:?} deadline"
    );
    assert_eq!(a.stats().cluster_store_up, Some(false));
    assert_eq!(a.cluster_store().unwrap().outages(), 1);
    redis.signal(rustix::process::Signal::CONT);
    assert!(
        eventually(Duration::from_secs(5), async || a.stats().cluster_store_up
            == Some(true))
        .await,
        "the store never came back"
    );
    call(&a).await.unwrap();
}

/// Makes the server answer nothing for `secs` (`DEBUG SLEEP` blocks it).
fn debug_sleep(port: u16, secs: f64) {
    let status = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "DEBUG", "SLEEP", &secs.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("redis-cli on PATH");
    assert!(status.success(), "DEBUG SLEEP failed");
}

/// Two agents call a `sync exact` limit at once while Redis stalls for
/// 300ms, five times: each call waits at most the declared 100ms, and the
/// declared fallback decides the calls Redis did not answer. With
/// `fallback reject` the window never goes over the amount; with `local`
/// (the old and default behaviour) each agent counts alone. Returns the
/// calls admitted and the fallbacks counted by both agents.
async fn through_a_slow_redis(fallback: &str) -> (u64, u64) {
    const AMOUNT: u64 = 40;
    let redis = RedisServer::start();
    let sync =
        format!("sync: CLUSTER_SYNC_EXACT\n    sync_timeout_ms: 100\n    fallback: {fallback}");
    let config = limit_config(AMOUNT, 60_000, &sync, "");
    fit_in_one_window(60_000, 20_000).await;
    let (a, b) = (agent(&redis, &config), agent(&redis, &config));
    let port = redis.port;
    let stalls = tokio::task::spawn_blocking(move || {
        for _ in 0..5 {
            debug_sleep(port, 0.3);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let load = |engine: Engine| {
        tokio::spawn(async move {
            let mut admitted = 0;
            // Bounded by count and time: about 2s of calls every 2ms.
            let end = tokio::time::Instant::now() + Duration::from_secs(2);
            for _ in 0..2_000 {
                if tokio::time::Instant::now() > end {
                    break;
                }
                let started = tokio::time::Instant::now();
                if call(&engine).await.is_ok() {
                    admitted += 1;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(1),
                    "a call waited past its 100ms timeout (and the client's 1s)"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let counted: u64 = engine
                .cluster_store()
                .unwrap()
                .fallbacks()
                .iter()
                .map(|(_, n)| n)
                .sum();
            (admitted, counted)
        })
    };
    let (ta, tb) = (load(a), load(b));
    let ((na, fa), (nb, fb)) = (ta.await.unwrap(), tb.await.unwrap());
    stalls.await.unwrap();
    eprintln!(
        "{fallback}: admitted {} (amount {AMOUNT}), fallbacks {}",
        na + nb,
        fa + fb
    );
    (na + nb, fa + fb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_with_fallback_reject_never_admits_over_the_amount() {
    let (admitted, fallbacks) = through_a_slow_redis("CLUSTER_FALLBACK_REJECT").await;
    assert!(admitted <= 40, "admitted {admitted} of 40");
    assert!(
        fallbacks > 0,
        "Redis stalled, yet no call was decided by the fallback"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_with_fallback_local_counts_each_agent_alone() {
    let (admitted, fallbacks) = through_a_slow_redis("CLUSTER_FALLBACK_LOCAL").await;
    assert!(
        fallbacks > 0,
        "Redis stalled, yet no call was decided by the fallback"
    );
    // Each agent counts from zero while Redis is away: the overshoot.
    assert!(
        admitted > 40,
        "admitted {admitted}: the fallback counted nothing locally"
    );
}

#[test]
fn a_bad_url_or_no_runtime_is_an_error_not_a_panic() {
    let e = gov_agent::cluster::redis("redis://127.0.0.1:1").unwrap_err();
    assert!(e.to_string().contains("runtime"), "{e}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let e = gov_agent::cluster::redis("http://127.0.0.1:1").unwrap_err();
        assert!(e.to_string().contains("`http://127.0.0.1:1`"), "{e}");
    });
}

#[tokio::test]
async fn without_a_store_cluster_limits_are_refused_with_the_flag_to_use() {
    let engine = Engine::empty("order");
    let error: InvalidConfig = engine
        .apply_target(&limit_config(5, 1_000, EXACT, ""))
        .unwrap_err();
    assert_eq!(error.rule(), Some("order/shared"));
    assert!(error.to_string().contains("--redis"), "{error}");
}

/// Two agents, 50 calls each, on one limit of `algorithm` (40 per minute);
/// what they admitted, and the refusals' `Retry-After`.
async fn two_agents(redis: &RedisServer, algorithm: &str) -> (u64, Vec<Duration>) {
    let config = limit_config(40, 60_000, EXACT, algorithm);
    let (a, b) = (agent(redis, &config), agent(redis, &config));
    let run = |e: Engine| {
        tokio::spawn(async move {
            let (mut admitted, mut waits) = (0, Vec::new());
            for _ in 0..50 {
                match call(&e).await {
                    Ok(()) => admitted += 1,
                    Err(r) => {
                        assert_eq!(r.reason, RejectReason::LimitCalls);
                        waits.push(r.retry_after.expect("a limit says when to retry"));
                    }
                }
            }
            (admitted, waits)
        })
    };
    let (ta, tb) = (run(a), run(b));
    let ((n, mut w), (m, v)) = (ta.await.unwrap(), tb.await.unwrap());
    w.extend(v);
    (n + m, w)
}

/// A sliding window in the store with nothing before it: two agents admit
/// the amount, no more; each refusal waits for the next window at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_sliding_window_two_agents_admit_the_amount() {
    let redis = RedisServer::start();
    fit_in_one_window(60_000, 20_000).await;
    let (total, waits) = two_agents(&redis, "algorithm: LIMIT_ALGORITHM_SLIDING_WINDOW").await;
    assert_eq!(total, 40);
    assert_eq!(waits.len(), 60);
    assert!(
        waits
            .iter()
            .all(|w| *w > Duration::ZERO && *w <= Duration::from_secs(61))
    );
}

/// The store's previous window weighs on this one: with 40 calls in the
/// window before, e ms into this one admits what the weight left,
/// `ceil(40 * e / 60,000)` (one more if a call crossed a boundary of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_sliding_window_weighs_the_previous_window_in_the_store() {
    let redis = RedisServer::start();
    fit_in_one_window(60_000, 20_000).await;
    let now = wall_ms();
    let previous = format!("gov:{{order/shared:}}:{}", now / 60_000 - 1);
    assert_eq!(
        redis.command(&["SET", &previous, "40", "PX", "120000"]),
        "+OK"
    );
    let elapsed = now % 60_000;
    let (total, _) = two_agents(&redis, "algorithm: LIMIT_ALGORITHM_SLIDING_WINDOW").await;
    let expected = (40 * elapsed).div_ceil(60_000);
    assert!(
        total == expected || total == expected + 1,
        "{total} admitted {elapsed} ms into the window, {expected} expected"
    );
    assert!(total < 40, "the previous window counted");
}

/// A token bucket in the store (one key per bucket): two agents share its
/// burst of 5 and then its rate (one call every 1.5 s, none in the time
/// the calls take); a refusal waits about one interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_token_bucket_two_agents_share_one_burst() {
    let redis = RedisServer::start();
    let (total, waits) = two_agents(
        &redis,
        "algorithm: LIMIT_ALGORITHM_TOKEN_BUCKET\n    burst: 5",
    )
    .await;
    assert!(total == 5 || total == 6, "{total} admitted");
    assert!(
        waits
            .iter()
            .all(|w| *w > Duration::ZERO && *w <= Duration::from_millis(1500))
    );
    assert!(
        redis
            .command(&["PTTL", "gov:{order/shared:}:bucket"])
            .starts_with(':')
    );
    assert_ne!(
        redis.command(&["PTTL", "gov:{order/shared:}:bucket"]),
        ":-2"
    );
}

/// A bucket whose arrival time another call moved on with a later clock
/// reading than this agent's (its call reached Redis first; under load the
/// gap is as long as the agent waits for a connection): a refusal still
/// says to wait one interval at most, the longest a bucket can be ahead of
/// a call that reads the clock when it is judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_token_bucket_refusals_wait_one_interval_at_most() {
    let redis = RedisServer::start();
    let config = limit_config(
        40,
        60_000,
        EXACT,
        "algorithm: LIMIT_ALGORITHM_TOKEN_BUCKET\n    burst: 5",
    );
    let engine = agent(&redis, &config);
    let ahead_us = (wall_ms() + 60_000) * 1_000;
    assert_eq!(
        redis.command(&[
            "SET",
            "gov:{order/shared:}:bucket",
            &ahead_us.to_string(),
            "PX",
            "120000"
        ]),
        "+OK"
    );
    let refused = call(&engine).await.expect_err("the bucket is empty");
    assert_eq!(refused.reason, RejectReason::LimitCalls);
    let wait = refused.retry_after.expect("a limit says when to retry");
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_millis(1500),
        "{wait:?}"
    );
}

/// `agents` engines on one `sync batch 50ms` limit of `algorithm` (100
/// per 10 s), each offering a call every 5 ms for `secs`; what they admitted,
/// and the wall time (ms) the run started and ended.
async fn batch_run(
    redis: &RedisServer,
    rule: &str,
    algorithm: &str,
    agents: usize,
    secs: u64,
) -> (u64, u64, u64) {
    let mut config = limit_config(
        100,
        10_000,
        "sync: CLUSTER_SYNC_BATCH\n    sync_batch_ms: 50",
        algorithm,
    );
    config.rules[0].name = format!("order/{rule}");
    let engines: Vec<Engine> = (0..agents)
        .map(|_| {
            // A deadline a loaded test machine does not miss: the bound
            // holds while the store answers.
            let store =
                gov_agent::cluster::redis_with_timeout(&redis.url(), Duration::from_secs(1))
                    .unwrap();
            let engine = Engine::with_cluster_store("order", store);
            engine.apply_target(&config).unwrap();
            engine
        })
        .collect();
    let start = wall_ms();
    let runs: Vec<_> = engines
        .iter()
        .map(|e| {
            let e = e.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_millis(5));
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let end = tokio::time::Instant::now() + Duration::from_secs(secs);
                let mut admitted = 0u64;
                for _ in 0..secs * 200 {
                    every.tick().await;
                    if tokio::time::Instant::now() >= end {
                        break;
                    }
                    match call(&e).await {
                        Ok(()) => admitted += 1,
                        Err(r) => assert_eq!(r.reason, RejectReason::LimitCalls),
                    }
                }
                admitted
            })
        })
        .collect();
    let mut total = 0;
    for run in runs {
        total += run.await.unwrap();
    }
    for e in &engines {
        assert_eq!(
            e.cluster_store().unwrap().outages(),
            0,
            "the store answered"
        );
    }
    (total, start, wall_ms())
}

/// A leased sliding window (issue 38): with 60 calls in the window before,
/// two and four agents admit no more than the estimate leaves at the run's
/// end, and nearly what it left at its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_sliding_window_agents_stay_within_the_estimate() {
    let redis = RedisServer::start();
    for agents in [2, 4] {
        let rule = format!("sliding_{agents}");
        fit_in_one_window(10_000, 3_000).await;
        let window = wall_ms() / 10_000;
        let previous = format!("gov:{{order/{rule}:}}:{}", window - 1);
        assert_eq!(
            redis.command(&["SET", &previous, "60", "PX", "30000"]),
            "+OK"
        );
        let (total, start, end) = batch_run(
            &redis,
            &rule,
            "algorithm: LIMIT_ALGORITHM_SLIDING_WINDOW",
            agents,
            2,
        )
        .await;
        assert_eq!(end / 10_000, window, "one window");
        let fits = |at: u64| {
            let e = at % 10_000;
            (100 * 10_000 - 60 * (10_000 - e)).div_ceil(10_000)
        };
        eprintln!(
            "{agents} agents admitted {total}: {} fit at the start, {} at the end",
            fits(start),
            fits(end)
        );
        assert!(total <= fits(end), "{agents} agents: {total}");
        assert!(
            total + 2 * agents as u64 >= fits(start),
            "{agents} agents: {total}"
        );
    }
}

/// A leased token bucket (issue 38): two and four agents admit the burst,
/// then the rate (one call every 100 ms), no more than the bucket with a
/// burst larger by two periods' calls (docs/operations.md); the bucket is
/// one key holding its arrival time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_token_bucket_agents_share_one_bucket() {
    let redis = RedisServer::start();
    for agents in [2, 4] {
        let rule = format!("bucket_{agents}");
        let (total, start, end) = batch_run(
            &redis,
            &rule,
            "algorithm: LIMIT_ALGORITHM_TOKEN_BUCKET\n    burst: 10",
            agents,
            2,
        )
        .await;
        let t = end - start;
        // The bucket alone admits 10 + t / 100 ms; the hold of a leased
        // call (2 x 50 ms) adds one more.
        let bound = 10 + t / 100 + 1;
        eprintln!("{agents} agents admitted {total} in {t} ms, at most {bound}");
        assert!(total <= bound, "{agents} agents: {total} of {bound}");
        assert!(total + 3 >= 10 + 2_000 / 100, "{agents} agents: {total}");
        let ttl = redis.command(&["PTTL", &format!("gov:{{order/{rule}:}}:bucket")]);
        assert!(
            ttl.starts_with(':') && ttl != ":-2" && ttl != ":-1",
            "{ttl}"
        );
    }
}

/// Keys on a header under `scope cluster` (issue 38): the value is in the
/// Redis key, encoded, so a tenant spelled with Redis key syntax (`}`, `:`)
/// or the parts' separator counts apart from the tenant it imitates, and
/// every key keeps one hash tag `{RULE:KEY}` with no `:`, `{` or `}` in KEY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_keys_in_the_cluster_store_cannot_collide_or_break_the_hash_tag() {
    let redis = RedisServer::start();
    let mut config = limit_config(2, 60_000, EXACT, "");
    let rule = &mut config.rules[0];
    rule.name = "order/per_tenant".into();
    if let Some(gov_proto::v1::rule::Spec::Limit(limit)) = &mut rule.spec {
        limit.key_parts = vec![gov_proto::v1::LimitKeyPart {
            kind: Some(gov_proto::v1::limit_key_part::Kind::Header(
                "x-tenant".into(),
            )),
        }];
    }
    let (a, b) = (agent(&redis, &config), agent(&redis, &config));
    fit_in_one_window(60_000, 10_000).await;
    let call = |e: &Engine, tenant: &'static str| {
        let e = e.clone();
        async move {
            let mut headers = HeaderMap::new();
            headers.insert("x-tenant", tenant.parse().unwrap());
            let info = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
            e.admit(&info).await.is_ok()
        }
    };
    assert!(call(&a, "acme").await && call(&b, "acme").await);
    assert!(!call(&a, "acme").await && !call(&b, "acme").await);
    for forged in ["acme}:latch", "acme}", "acme:1", "{acme}", "acme|x"] {
        assert!(call(&a, forged).await, "{forged} counts apart");
        assert!(call(&b, forged).await, "{forged} counts apart");
        assert!(
            !call(&a, forged).await,
            "{forged} shares one cluster counter"
        );
    }
    let out = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "--scan",
            "--pattern",
            "gov:*",
        ])
        .output()
        .unwrap();
    let keys: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(keys.len(), 6, "{keys:?}");
    for k in &keys {
        let tag = k
            .strip_prefix("gov:{order/per_tenant:")
            .and_then(|rest| rest.split_once('}'))
            .map(|(key, _)| key)
            .unwrap_or_else(|| panic!("{k}"));
        assert!(!tag.contains([':', '{', '}', '|']), "{k}");
    }
}
