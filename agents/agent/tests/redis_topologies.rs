//! `scope cluster` limits on a real Redis Cluster (three masters, three
//! replicas) and a real Sentinel set-up (one master, one replica, one
//! sentinel), all `redis-server` processes on 127.0.0.1 killed on drop: two
//! engines share one limit as two agents of a service would; killing the
//! master that holds the rule's keys under load (`sync exact` and leased
//! `sync batch`) falls back to local counting without failing a request or
//! holding one beyond the store's deadline (plus slack), shared counting
//! resumes after the failover, and each test prints the window's overshoot
//! and asserts the documented bound on it.
//!
//! The cluster bus does not take port 0, so ports are picked by binding port
//! 0 and releasing it, and a node that cannot start is started again on other
//! ports. Needs `redis-server` and `redis-cli` (the `redis-server` and
//! `redis-tools` Debian packages, `.ci/run` installs them); without
//! `redis-cli` the tests say so and pass.
//!
//! Real time throughout (Redis windows follow the wall clock); every loop is
//! bounded in count and time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gov_engine::{Engine, RejectReason, Rejection, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};
use tokio::time::Instant;

// === servers ===

/// One `redis-server` process (a cluster node, a replica, or a sentinel).
struct Node {
    port: u16,
    child: Option<Child>,
}

impl Node {
    /// Starts `redis-server` on a free port with `args` (`{port}` and
    /// `{bus}` replaced by the picked ports), in `dir`; tries other ports if
    /// it does not come up.
    fn start(dir: &Path, args: &[&str]) -> Self {
        for _ in 0..5 {
            let (port, bus) = (free_port(), free_port());
            let args: Vec<String> = args
                .iter()
                .map(|a| {
                    a.replace("{port}", &port.to_string())
                        .replace("{bus}", &bus.to_string())
                })
                .collect();
            let mut child = Command::new("redis-server")
                .args(&args)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start `redis-server` ({e}): `apt-get install -y redis-server`")
                });
            for _ in 0..200 {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if cli(port, &["PING"]).is_some_and(|o| o.trim() == "PONG") {
                    return Self {
                        port,
                        child: Some(child),
                    };
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            child.kill().ok();
            child.wait().ok();
        }
        panic!("redis-server never came up on a free port");
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `redis-cli -p PORT ARGS`: its output, `None` if it failed.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the tests can run; says why not.
fn have_redis_cli() -> bool {
    let ok = Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED: `redis-cli` is not on PATH; these tests build a Redis Cluster with it \
             (`apt-get install -y redis-tools`)"
        );
    }
    ok
}

/// Polls `cond` every 50ms for at most `limit` (blocking: for set-up).
fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within {limit:?}");
}

/// Three masters and three replicas.
struct RedisCluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<Node> = (0..6)
            .map(|_| {
                Node::start(
                    dir.path(),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes-{port}.conf",
                        "--cluster-port",
                        "{bus}",
                        "--cluster-node-timeout",
                        "1000",
                        // A replica fails over whatever its data's age: the
                        // test kills a master a moment after the set-up.
                        "--cluster-replica-validity-factor",
                        "0",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                )
            })
            .collect();
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(nodes.iter().map(Node::addr));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes, _dir: dir };
        wait_for(
            Duration::from_secs(20),
            "cluster_state:ok everywhere",
            || {
                cluster
                    .nodes
                    .iter()
                    .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            },
        );
        // A replica that never synced cannot take over: wait for all three.
        wait_for(Duration::from_secs(20), "every replica in sync", || {
            cluster
                .nodes
                .iter()
                .filter(|n| {
                    let info = n.cli(&["INFO", "replication"]);
                    info.contains("role:slave") && info.contains("master_link_status:up")
                })
                .count()
                == 3
        });
        cluster
    }

    fn url(&self) -> String {
        // Two seeds are enough to find the rest.
        format!(
            "redis+cluster://{},{}",
            self.nodes[0].addr(),
            self.nodes[1].addr()
        )
    }

    /// The live node that serves `key` as a master.
    fn master_of(&self, key: &str) -> usize {
        let mut found = None;
        wait_for(Duration::from_secs(20), "a master for the key", || {
            found = self.nodes.iter().position(|n| {
                n.child.is_some()
                    && n.cli(&["ROLE"]).starts_with("master")
                    && n.cli(&["EXISTS", key]).trim() == "1"
            });
            found.is_some()
        });
        found.unwrap()
    }

    /// The keys of the `gov:` layout on all live masters.
    fn gov_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some() && n.cli(&["ROLE"]).starts_with("master"))
            .flat_map(|n| {
                n.cli(&["--scan", "--pattern", "gov:*"])
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        keys.sort();
        keys
    }

    /// A live node's value of `key` (through `-c`, which follows `MOVED`).
    fn get(&self, key: &str) -> u64 {
        let node = self.nodes.iter().find(|n| n.child.is_some()).unwrap();
        cli(node.port, &["-c", "GET", key])
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

/// One master, one replica, one sentinel (quorum 1).
struct SentinelSet {
    master: Node,
    replica: Node,
    sentinel: Node,
    _dir: tempfile::TempDir,
}

impl SentinelSet {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plain = ["--save", "", "--appendonly", "no"];
        let master = Node::start(dir.path(), &plain);
        let master_port = master.port.to_string();
        let mut replica_args = plain.to_vec();
        replica_args.extend(["--replicaof", "127.0.0.1", &master_port]);
        let replica = Node::start(dir.path(), &replica_args);
        wait_for(Duration::from_secs(10), "the replica in sync", || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        // A sentinel rewrites its config file: one per start, in the temp dir.
        let conf = dir.path().join(format!("sentinel-{}.conf", free_port()));
        std::fs::write(
            &conf,
            format!(
                "sentinel monitor counters 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds counters 1000\n\
                 sentinel failover-timeout counters 5000\n"
            ),
        )
        .unwrap();
        let conf = conf.to_str().unwrap().to_owned();
        let sentinel = Node::start(dir.path(), &[&conf, "--sentinel"]);
        wait_for(
            Duration::from_secs(20),
            "the sentinel sees the replica",
            || {
                sentinel
                    .cli(&["SENTINEL", "REPLICAS", "counters"])
                    .contains(&replica.port.to_string())
            },
        );
        Self {
            master,
            replica,
            sentinel,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("redis+sentinel://{}/counters", self.sentinel.addr())
    }
}

// === agents ===

fn limit_config(amount: u64, sync: &str, release: &str) -> TargetConfig {
    let yaml = format!(
        r"
service: order
version: v1
rules:
- name: order/shared
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /api}}}}
  limit:
    calls: {{amount: {amount}, window_ms: 60000}}
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
const BATCH: &str = "sync: CLUSTER_SYNC_BATCH\n    sync_batch_ms: 20";

fn agent(url: &str, config: &TargetConfig) -> Engine {
    let store = gov_agent::cluster::redis(url).unwrap();
    let engine = Engine::with_cluster_store("order", store);
    engine.apply_target(config).unwrap();
    engine
}

/// One call, bounded: a dead or failing-over Redis must not hold it.
async fn call(engine: &Engine) -> Result<(), Rejection> {
    let headers = HeaderMap::new();
    let info = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
    tokio::time::timeout(Duration::from_secs(2), engine.admit(&info))
        .await
        .expect("a decision took more than 2s: a request was blocked on redis")
        .map(drop)
}

/// `n` calls; how many were admitted (every refusal is the limit's).
async fn calls(engine: &Engine, n: usize) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        match call(engine).await {
            Ok(()) => admitted += 1,
            Err(r) => assert_eq!(r.reason, RejectReason::LimitCalls),
        }
    }
    admitted
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

/// Waits for the next 60s window if fewer than `need_ms` are left in this one.
async fn fit_in_one_window(need_ms: u64) {
    let left = 60_000 - wall_ms() % 60_000;
    if left < need_ms {
        tokio::time::sleep(Duration::from_millis(left + 20)).await;
    }
}

fn counter_key() -> String {
    gov_engine::cluster::calls_key("order/shared", "", wall_ms() / 60_000)
}

/// What happened while a master was killed under load.
#[derive(Debug, Default)]
struct Outage {
    /// Calls made while the agents were polled.
    calls: u64,
    /// Calls admitted (store up or down).
    admitted: u64,
    /// Calls admitted while the making agent's store was down.
    admitted_down: u64,
    /// Calls refused by the limit while its store was down.
    refused_down: u64,
    /// The longest decision.
    slowest: Duration,
    /// How long until each agent's store was down, then up again.
    down_after: Option<Duration>,
    up_after: Option<Duration>,
}

/// The longest a decision may take while Redis fails over: the store's
/// deadline (`DEFAULT_TIMEOUT`, 50ms) and slack for a loaded test machine.
/// A request that waited for the failover would take its 1-3 s.
const DECISION_BOUND: Duration = Duration::from_millis(500);

/// Both agents call every 5ms until both stores have been down and are up
/// again (at most `limit`): no call may fail other than by the limit, none
/// may take longer than [`DECISION_BOUND`].
async fn through_an_outage(a: &Engine, b: &Engine, kill: impl FnOnce(), limit: Duration) -> Outage {
    let start = Instant::now();
    kill();
    let mut outage = Outage::default();
    let mut was_down = [false, false];
    let mut every = tokio::time::interval(Duration::from_millis(5));
    while start.elapsed() < limit {
        every.tick().await;
        for (i, engine) in [a, b].into_iter().enumerate() {
            let began = Instant::now();
            let result = call(engine).await;
            outage.slowest = outage.slowest.max(began.elapsed());
            outage.calls += 1;
            let up = engine.stats().cluster_store_up == Some(true);
            match result {
                Ok(()) => {
                    outage.admitted += 1;
                    if !up {
                        outage.admitted_down += 1;
                    }
                }
                Err(r) => {
                    assert_eq!(r.reason, RejectReason::LimitCalls, "{r:?}");
                    if !up {
                        outage.refused_down += 1;
                    }
                }
            }
            if !up && !was_down[i] {
                was_down[i] = true;
                outage.down_after.get_or_insert(start.elapsed());
            }
        }
        let ups = [a, b].map(|e| e.stats().cluster_store_up == Some(true));
        if was_down.iter().all(|d| *d) && ups.iter().all(|u| *u) {
            outage.up_after = Some(start.elapsed());
            break;
        }
    }
    outage
}

/// Kills the master of the rule's slot while two agents call (`sync`,
/// `amount` per 60s window, 30 calls made before): the agents, the outage
/// and the calls admitted before the kill. Prints the window's overshoot.
async fn kill_the_rules_master_under_load(
    cluster: &mut RedisCluster,
    sync: &str,
    amount: u64,
) -> (Engine, Engine, Outage, u64) {
    let config = limit_config(amount, sync, "");
    let (a, b) = (
        agent(&cluster.url(), &config),
        agent(&cluster.url(), &config),
    );
    fit_in_one_window(45_000).await;
    let before = calls(&a, 15).await + calls(&b, 15).await;
    let key = counter_key();
    let master = cluster.master_of(&key);
    let outage = through_an_outage(
        &a,
        &b,
        || cluster.nodes[master].kill(),
        Duration::from_secs(25),
    )
    .await;
    let overshoot = (before + outage.admitted).saturating_sub(amount);
    let sync = sync.split_whitespace().collect::<Vec<_>>().join(" ");
    eprintln!(
        "redis cluster, {sync}, amount {amount}: admitted {before} before the kill; then \
         {outage:?}; the window admitted {} (overshoot {overshoot})",
        before + outage.admitted
    );
    if outage.up_after.is_none() {
        let live = cluster.nodes.iter().find(|n| n.child.is_some()).unwrap();
        eprintln!(
            "agents up: {:?} {:?}; CLUSTER NODES:\n{}",
            a.stats().cluster_store_up,
            b.stats().cluster_store_up,
            live.cli(&["CLUSTER", "NODES"])
        );
    }
    assert!(
        outage.down_after.is_some(),
        "the agents never noticed: {outage:?}"
    );
    assert!(
        outage.up_after.is_some(),
        "never counted through the cluster again: {outage:?}"
    );
    assert!(
        outage.slowest <= DECISION_BOUND,
        "a decision took {:?} while the master failed over: blocked on redis",
        outage.slowest
    );
    assert_ne!(cluster.master_of(&key), master);
    (a, b, outage, before)
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_limit_is_shared_through_a_redis_cluster() {
    if !have_redis_cli() {
        return;
    }
    let cluster = RedisCluster::start();
    fit_in_one_window(20_000).await;
    let mut releasers = Vec::new();
    // A generous timeout: this test is about sharing, not about a slow
    // machine's fallbacks.
    let exact = format!("{EXACT}\n    sync_timeout_ms: 1000");
    for (rule, sync) in [("order/exact", exact.as_str()), ("order/batch", BATCH)] {
        let mut config = limit_config(30, sync, "release: {after_ms: 3600000}");
        config.rules[0].name = rule.into();
        let (a, b) = (
            agent(&cluster.url(), &config),
            agent(&cluster.url(), &config),
        );
        let (ta, tb) = (
            tokio::spawn({
                let a = a.clone();
                async move { calls(&a, 25).await }
            }),
            tokio::spawn({
                let b = b.clone();
                async move { calls(&b, 25).await }
            }),
        );
        let total = ta.await.unwrap() + tb.await.unwrap();
        if rule == "order/exact" {
            assert_eq!(total, 30, "two agents share one exact counter");
        } else {
            // Batch: leases never add up to more than the amount. Fewer is by
            // design when an agent ends its 25 calls holding leased calls
            // that the other agent then asks for in vain: they are given
            // back at its next top-ups, after the other's refusal engaged
            // the latch ("Shared counters in Redis", calls a window can
            // lose). Once given back, the store counts exactly the calls
            // admitted: no lease part was lost on the way.
            assert!(total <= 30, "{sync}: admitted {total}");
            let counter = gov_engine::cluster::calls_key(rule, "", wall_ms() / 60_000);
            let end = std::time::Instant::now() + Duration::from_secs(2);
            while cluster.get(&counter) != total && std::time::Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(
                cluster.get(&counter),
                total,
                "{sync}: the store counts other calls than the {total} admitted once idle leases are back"
            );
            eprintln!("{sync}: admitted {total} of 30");
        }
        assert_eq!(a.stats().cluster_store_up, Some(true), "{sync}");
        // The latch engaged through the cluster holds for both agents (a
        // batched agent learns it at its next flush).
        for engine in [&a, &b] {
            let mut refused = false;
            for _ in 0..100 {
                if call(engine).await.is_err() {
                    refused = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(refused, "{sync}: an agent never saw the latch");
        }
        releasers.push((rule, a));
    }
    // One rule's counter and latch sit in one slot: the exact script ran
    // (a cross-slot script would have failed and left the store down).
    let keys = cluster.gov_keys();
    let window = wall_ms() / 60_000;
    for rule in ["order/exact", "order/batch"] {
        let latch = gov_engine::cluster::latch_key(rule, "");
        let counter = gov_engine::cluster::calls_key(rule, "", window);
        assert!(keys.contains(&latch), "{latch} in {keys:?}");
        assert!(keys.contains(&counter), "{counter} in {keys:?}");
        assert_eq!(cluster.master_of(&latch), cluster.master_of(&counter));
    }
    // A release deletes the latches on every master.
    for (rule, a) in releasers {
        assert_eq!(
            a.release_limit_everywhere(rule, None, "ops").await,
            Ok(true)
        );
    }
    let keys = cluster.gov_keys();
    assert!(
        !keys.iter().any(|k| k.ends_with(":latch")),
        "latches left: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_master_of_a_rules_slot_falls_back_locally_then_resumes() {
    if !have_redis_cli() {
        return;
    }
    let mut cluster = RedisCluster::start();
    let amount = 20;
    let (a, b, outage, before) =
        kill_the_rules_master_under_load(&mut cluster, EXACT, amount).await;
    assert_eq!(before, amount, "exact before the kill");
    // The overshoot: while down, each agent counts locally with the full
    // amount, so at most agents x amount more than the cluster-wide amount.
    // (The counter reached 30 before the kill: the replica had it, so once
    // up the agents refuse again.)
    assert!(
        outage.admitted_down <= 2 * amount,
        "admitted {} while down, more than 2 x {amount}",
        outage.admitted_down
    );
    assert!(
        before + outage.admitted - amount <= 2 * amount,
        "overshoot {} over 2 x {amount}",
        before + outage.admitted - amount
    );

    // Counting goes through the new master: the counter grows with each call.
    // (The replica may not have had the last increments: replication is
    // asynchronous, so the count may restart lower, never higher.)
    let key = counter_key();
    let count = cluster.get(&key);
    assert!(count <= 30 + outage.calls, "{count}");
    calls(&a, 3).await;
    calls(&b, 3).await;
    assert_eq!(cluster.get(&key), count + 6, "counted through the cluster");
    assert_eq!(a.stats().cluster_store_up, Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_master_under_leased_batch_counting_counts_on_then_reports_back() {
    if !have_redis_cli() {
        return;
    }
    let mut cluster = RedisCluster::start();
    let amount = 200;
    let (a, b, outage, before) =
        kill_the_rules_master_under_load(&mut cluster, BATCH, amount).await;
    assert_eq!(before, 30, "leases cover the 30 calls before the kill");
    // docs/operations.md: while down, each agent uses what is left of its
    // lease, then counts on from the window's total it last heard of, so two
    // agents admit at most 2 x amount in the window, minus the total.
    let window = before + outage.admitted;
    assert!(window <= 2 * amount, "the window admitted {window}");
    // Counts resume on the new master: the calls admitted without a lease
    // reach it with the agents' next leases (each agent tops up every 20ms).
    let key = counter_key();
    let end = Instant::now() + Duration::from_secs(5);
    while cluster.get(&key) < outage.admitted_down && Instant::now() < end {
        calls(&a, 1).await;
        calls(&b, 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let count = cluster.get(&key);
    assert!(
        count >= outage.admitted_down,
        "the new master counts {count}, fewer than the {} calls admitted while down",
        outage.admitted_down
    );
    assert!(a.cluster_store().unwrap().is_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_falls_back_locally_then_resumes_on_the_new_master() {
    if !have_redis_cli() {
        return;
    }
    let mut set = SentinelSet::start();
    let amount = 20;
    let config = limit_config(amount, EXACT, "");
    let (a, b) = (agent(&set.url(), &config), agent(&set.url(), &config));
    fit_in_one_window(45_000).await;
    assert_eq!(calls(&a, 15).await + calls(&b, 15).await, amount);
    let key = counter_key();
    assert_eq!(set.master.cli(&["GET", &key]).trim(), "30");

    let outage = through_an_outage(&a, &b, || set.master.kill(), Duration::from_secs(25)).await;
    eprintln!("redis sentinel, master killed: {outage:?}");
    assert!(
        outage.down_after.is_some(),
        "the agents never noticed: {outage:?}"
    );
    assert!(
        outage.up_after.is_some(),
        "never counted through the new master: {outage:?}"
    );
    assert!(
        outage.admitted_down <= 2 * amount,
        "admitted {} while down, more than 2 x {amount}",
        outage.admitted_down
    );

    // The sentinel promoted the replica; the agents count there now.
    assert!(set.replica.cli(&["ROLE"]).starts_with("master"));
    let before: u64 = set.replica.cli(&["GET", &key]).trim().parse().unwrap_or(0);
    calls(&a, 3).await;
    calls(&b, 3).await;
    let after: u64 = set.replica.cli(&["GET", &key]).trim().parse().unwrap();
    assert_eq!(after, before + 6, "counted on the new master");
}

#[test]
fn a_bad_cluster_or_sentinel_url_is_an_error_that_shows_the_forms() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for bad in [
            "redis+cluster://",
            "redis+cluster://127.0.0.1:1/2",
            "redis+sentinel://127.0.0.1:1",
            "redis+sentinel://127.0.0.1:1/",
        ] {
            let e = gov_agent::cluster::redis(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
            let help = miette::Diagnostic::help(&e).unwrap().to_string();
            assert!(help.contains("redis+sentinel://"), "{help}");
        }
    });
}
