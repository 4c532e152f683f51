//! govd replicas on etcd (`--store etcd://`): real etcd members (Debian's
//! `etcd-server`, which `.ci/run` installs) on loopback, each with its own
//! data directory and free ports (picked, and picked again when a member
//! cannot bind them), and real govd and gov-agent processes.

use std::collections::{BTreeMap, BTreeSet};

use gov_control_plane::etcd::client::pb::etcdserverpb::{RangeRequest, RequestOp, TxnRequest};
use gov_control_plane::etcd::client::{Client, ConnectOptions};
use gov_control_plane::etcd::{EtcdConfig, EtcdStore};
use gov_control_plane::store::{Fence, Persisted, Store as _};
use tokio_util::sync::CancellationToken;

use super::*;

/// The etcd binary: `GOV_TEST_ETCD`, else `etcd` on the PATH.
fn etcd_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("GOV_TEST_ETCD") {
        return path.into();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "these tests need the `etcd` server binary: install Debian's `etcd-server` \
                 (`apt-get install etcd-server`; .ci/run does), or point GOV_TEST_ETCD at one"
            )
        })
}

/// A three-member etcd cluster on loopback.
pub(super) struct Etcd {
    members: Vec<Child>,
    clients: Vec<u16>,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    /// Starts three members and waits until they answer; new ports and a
    /// new try when one could not bind its ports (another process took one
    /// between the pick and the bind).
    pub(super) async fn start() -> Etcd {
        let bin = etcd_bin();
        for _ in 0..3 {
            if let Some(etcd) = Self::try_start(&bin).await {
                return etcd;
            }
        }
        panic!("three etcd members did not come up on loopback in three tries");
    }

    async fn try_start(bin: &Path) -> Option<Etcd> {
        let dir = tempfile::tempdir().unwrap();
        let clients: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peers: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let cluster = (0..3)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", peers[i]))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for i in 0..3 {
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).unwrap();
            let child = Command::new(bin)
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .arg("--listen-client-urls")
                .arg(format!("http://127.0.0.1:{}", clients[i]))
                .arg("--advertise-client-urls")
                .arg(format!("http://127.0.0.1:{}", clients[i]))
                .arg("--listen-peer-urls")
                .arg(format!("http://127.0.0.1:{}", peers[i]))
                .arg("--initial-advertise-peer-urls")
                .arg(format!("http://127.0.0.1:{}", peers[i]))
                .args(["--initial-cluster", &cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "gov-e2e"])
                // Fast elections on loopback: a lost member is noticed in 0.5 s.
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .args(["--logger", "zap", "--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            members.push(child);
        }
        let mut etcd = Etcd {
            members,
            clients,
            _dir: dir,
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            for m in &mut etcd.members {
                if m.try_wait().unwrap().is_some() {
                    // It exited: a port was taken.
                    return None;
                }
            }
            if etcd.healthy().await {
                return Some(etcd);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    async fn healthy(&self) -> bool {
        let options = ConnectOptions {
            timeout: Some(Duration::from_secs(1)),
            connect_timeout: Some(Duration::from_secs(1)),
            ..ConnectOptions::default()
        };
        let client = Client::connect(&self.endpoints(), &options).unwrap();
        let put = client.put("gov-e2e/health", "ok");
        matches!(
            tokio::time::timeout(Duration::from_secs(2), put).await,
            Ok(Ok(_))
        )
    }

    /// SIGKILL one member (a majority remains).
    pub(super) async fn kill(&mut self, member: usize) {
        self.members[member].kill().await.unwrap();
    }

    pub(super) fn endpoints(&self) -> Vec<String> {
        self.clients
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    /// `etcd://...` with a key prefix of its own.
    pub(super) fn url(&self, prefix: &str) -> String {
        let hosts: Vec<String> = self
            .clients
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("etcd://{}/{prefix}", hosts.join(","))
    }
}

async fn store(etcd: &Etcd, replica: &str, shutdown: &CancellationToken) -> Arc<EtcdStore> {
    store_at(&etcd.url("store"), replica, shutdown).await
}

async fn store_at(url: &str, replica: &str, shutdown: &CancellationToken) -> Arc<EtcdStore> {
    let config = EtcdConfig::parse(url, replica, Duration::from_secs(2)).unwrap();
    EtcdStore::connect(config, shutdown.clone()).await.unwrap()
}

/// A state with `version` in force (the last entry of its history).
fn with_version(version: &str) -> Persisted {
    Persisted {
        applied: Some(gov_control_plane::store::AppliedPolicy {
            version: version.into(),
            who: "e2e".into(),
            at_unix_ms: 1,
            sources: Vec::new(),
            bundle: Default::default(),
            shadow_since: Default::default(),
        }),
        history: vec![gov_control_plane::store::HistoryEntry {
            version: version.into(),
            who: "e2e".into(),
            at_unix_ms: 1,
            services: vec!["order".into()],
            sources: Vec::new(),
            source_refs: Vec::new(),
        }],
        ..Persisted::default()
    }
}

/// The parts a write puts before its commit (services' configs, named by
/// the write) land only while the state is the one it was made from: the
/// replica that loses a race leaves none of them, so no later write can
/// read them as committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loser_of_two_applies_leaves_no_config_of_its_own() {
    let etcd = Etcd::start().await;
    let shutdown = CancellationToken::new();
    let client = Client::connect(&etcd.endpoints(), &ConnectOptions::default()).unwrap();
    let (a, b) = (
        store(&etcd, "a", &shutdown).await,
        store(&etcd, "b", &shutdown).await,
    );
    let (la, lb) = (a.load().await.unwrap(), b.load().await.unwrap());
    let with_service = |version: &str, header: &str| {
        let mut state = with_version(version);
        if let Some(p) = state.applied.as_mut() {
            p.bundle.targets.push(pb::TargetConfig {
                service: "order".into(),
                consumer_header: header.into(),
                ..Default::default()
            });
        }
        state
    };
    let won = a
        .save(&with_service("va", "x-a"), la.revision, Fence::Any)
        .await
        .unwrap();
    let lost = b
        .save(&with_service("vb", "x-b"), lb.revision, Fence::Any)
        .await
        .unwrap_err();
    assert!(
        matches!(lost, gov_control_plane::Error::Conflict { found, .. } if found == won),
        "{lost}"
    );
    let configs = RangeRequest::prefix("store/state/config-");
    let configs = client.range(configs).await.unwrap();
    assert_eq!(configs.kvs.len(), 1, "the loser's config is not in etcd");
    assert!(String::from_utf8_lossy(&configs.kvs[0].value).contains("x-a"));
    let back = b.load().await.unwrap();
    let policy = back.state.applied.unwrap();
    assert_eq!(policy.bundle.targets[0].consumer_header, "x-a");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_from_one_revision_never_both_win_and_a_leader_without_its_lease_cannot_write()
{
    let etcd = Etcd::start().await;
    let shutdown = CancellationToken::new();
    let (a, b) = (
        store(&etcd, "a", &shutdown).await,
        store(&etcd, "b", &shutdown).await,
    );
    let (la, lb) = (a.load().await.unwrap(), b.load().await.unwrap());
    assert_eq!((la.revision, lb.revision), (0, 0));
    // Both write from revision 0: one wins, the other is told who won.
    let won = a.save(&with_version("va"), 0, Fence::Any).await.unwrap();
    let lost = b
        .save(&with_version("vb"), 0, Fence::Any)
        .await
        .unwrap_err();
    assert!(
        matches!(lost, gov_control_plane::Error::Conflict { found, .. } if found == won),
        "{lost}"
    );
    let stored = b.load().await.unwrap();
    assert_eq!(stored.revision, won);
    assert_eq!(stored.state.history[0].version, "va");
    // Every replica hears of the write.
    let mut changes = b.changes().unwrap();
    wait_until("b to see a's write", Duration::from_secs(10), async || {
        *changes.borrow_and_update() >= won
    })
    .await;

    // One leader; the other's leader writes are refused.
    wait_until("a leader", Duration::from_secs(10), async || {
        a.is_leader() != b.is_leader()
    })
    .await;
    let (leader, follower) = if a.is_leader() { (&a, &b) } else { (&b, &a) };
    let err = follower
        .save(&with_version("x"), won, Fence::Leader)
        .await
        .unwrap_err();
    assert!(
        matches!(err, gov_control_plane::Error::NotLeader { .. }),
        "{err}"
    );
    // The leader loses its lease behind its back (revoked, as etcd does
    // when it is not renewed): its next leader write is refused by etcd
    // itself, whatever the replica still believes.
    let client = Client::connect(&etcd.endpoints(), &ConnectOptions::default()).unwrap();
    let holder = client.get("store/leader").await.unwrap();
    let lease = holder.kvs[0].lease;
    client.lease_revoke(lease).await.unwrap();
    let err = leader
        .save(&with_version("stale"), won, Fence::Leader)
        .await
        .unwrap_err();
    assert!(
        matches!(err, gov_control_plane::Error::NotLeader { .. }),
        "{err}"
    );
    assert_eq!(a.load().await.unwrap().state.history[0].version, "va");
    // A new lease and a leader again (one of them).
    wait_until("a new leader", Duration::from_secs(10), async || {
        a.is_leader() != b.is_leader()
    })
    .await;
    // Audit records from both replicas, none lost, in time order.
    for (s, who) in [(&a, "a"), (&b, "b"), (&a, "a2")] {
        s.audit(&gov_control_plane::store::AuditEntry {
            at_unix_ms: 5,
            who: who.into(),
            action: "apply".into(),
            intent: String::new(),
            version: String::new(),
            kind: String::new(),
            rule: String::new(),
            key: String::new(),
            targets: vec![],
            detail: String::new(),
        })
        .await
        .unwrap();
    }
    let page = b
        .audit_page(gov_control_plane::audit::Query::default())
        .await
        .unwrap();
    let whos: BTreeSet<String> = page.records.iter().map(|(_, e)| e.who.clone()).collect();
    assert_eq!(whos, ["a", "a2", "b"].map(String::from).into());
    shutdown.cancel();
}

/// A prefix an earlier govd wrote (the whole state in `PREFIX/state`, the
/// fixture the state directory's conversion reads too) loads and is
/// converted to one key per part: `PREFIX/state` removed, another replica
/// reads the parts, and a trip then writes its latch alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_value_of_an_earlier_govd_loads_and_is_converted_to_parts() {
    let etcd = Etcd::start().await;
    let shutdown = CancellationToken::new();
    let fixture = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/legacy-state/state.json"),
    )
    .unwrap();
    let client = Client::connect(&etcd.endpoints(), &ConnectOptions::default()).unwrap();
    client.put("store/state", fixture).await.unwrap();
    let a = store(&etcd, "a", &shutdown).await;
    let loaded = a.load_converted().await.unwrap();
    let version = "0132180f030b77d8";
    assert_eq!(loaded.state.applied.as_ref().unwrap().version, version);
    assert_eq!(loaded.state.history.len(), 2);
    assert_eq!(loaded.state.latches.len(), 1);
    assert_eq!(loaded.state.releases.len(), 1);
    assert!(client.get("store/state").await.unwrap().kvs.is_empty());
    let keys_only = RangeRequest::prefix("store/state/").keys_only();
    let parts = client.range(keys_only).await.unwrap();
    assert_eq!(
        parts.kvs.len(),
        9,
        "policy, its services' list, its one service's config, 2 entries, 2 texts, latch, release"
    );

    let b = store(&etcd, "b", &shutdown).await;
    let back = b.load().await.unwrap();
    assert_eq!(back.revision, loaded.revision);
    assert_eq!(
        back.state.history[1].sources,
        loaded.state.history[1].sources
    );
    assert_eq!(back.state.latches, loaded.state.latches);
    let mut tripped = back.state.clone();
    let mut trip = tripped.latches[0].clone();
    trip.rule = "fixture_order/other".into();
    tripped.latches.push(trip);
    let before = b.bytes_written();
    b.save(&tripped, back.revision, Fence::Any).await.unwrap();
    let written = b.bytes_written() - before;
    assert!(written < 600, "a trip wrote {written} bytes");
    shutdown.cancel();
}

/// `tests/fixtures/parts-state/` is the state in parts as the govd before
/// per-service config parts wrote it (`policy.json` holds the whole
/// bundle), `tests/fixtures/targets-state/` as the govd after it wrote it
/// (`policy.json` lists each service's config by content address, a second
/// service added): as etcd keys, each loads, and the next write writes each
/// service's config as a key of its own and the list of services, and
/// removes the keys of the layout before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_of_the_layouts_before_load_from_etcd_and_are_converted() {
    let etcd = Etcd::start().await;
    let shutdown = CancellationToken::new();
    let client = Client::connect(&etcd.endpoints(), &ConnectOptions::default()).unwrap();
    for (fixture, services) in [
        ("parts-state", &["fixture_order"][..]),
        ("targets-state", &["fixture_order", "fixture_pay"][..]),
    ] {
        let prefix = format!("store-{fixture}");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(fixture);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if name.ends_with(".json") {
                let value = std::fs::read(entry.path()).unwrap();
                client
                    .put(format!("{prefix}/state/{name}"), value)
                    .await
                    .unwrap();
            }
        }
        client
            .put(format!("{prefix}/revision"), "parts 1")
            .await
            .unwrap();
        let url = etcd.url(&prefix);
        let a = store_at(&url, "a", &shutdown).await;
        let loaded = a.load_converted().await.unwrap();
        let policy = loaded.state.applied.clone().unwrap();
        assert_eq!(policy.version, "0132180f030b77d8");
        let names: Vec<&str> = policy
            .bundle
            .targets
            .iter()
            .map(|t| t.service.as_str())
            .collect();
        assert_eq!(names, services, "{fixture}");
        assert!(policy.bundle.targets.iter().all(|t| !t.rules.is_empty()));
        assert_eq!(loaded.state.history.len(), 2);
        assert_eq!(loaded.state.latches.len(), 1);
        assert_eq!(a.bytes_written(), 0, "read as it is");
        let mut next = loaded.state.clone();
        if let Some(p) = next.applied.as_mut() {
            p.who = "carol".into();
            p.at_unix_ms += 1;
        }
        a.save(&next, loaded.revision, Fence::Any).await.unwrap();
        let keys = |kind: &str| RangeRequest::prefix(format!("{prefix}/state/{kind}-")).keys_only();
        let configs = client.range(keys("config")).await.unwrap();
        assert_eq!(configs.kvs.len(), services.len(), "{fixture}");
        assert_eq!(client.range(keys("services")).await.unwrap().kvs.len(), 1);
        assert!(client.range(keys("target")).await.unwrap().kvs.is_empty());
        let back = store_at(&url, "b", &shutdown).await.load().await.unwrap();
        let back_policy = back.state.applied.unwrap();
        assert_eq!(back_policy.who, "carol");
        assert_eq!(back_policy.bundle, policy.bundle);
        assert_eq!(back.state.history.len(), 2);
    }
    shutdown.cancel();
}

/// The agents' registry on etcd is a key per agent: the registry of an
/// earlier release (every agent in one value) is read and converted at the
/// first load; an ACK writes its agent's version key alone; a forgotten
/// agent's keys go; a new store of the same replica reads them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_etcd_are_a_key_each_and_an_ack_writes_its_own() {
    use gov_control_plane::store::{AgentChanges, KnownAgent};
    let etcd = Etcd::start().await;
    let shutdown = CancellationToken::new();
    let client = Client::connect(&etcd.endpoints(), &ConnectOptions::default()).unwrap();
    let agent = |instance: &str, version: &str| KnownAgent {
        service: "order".into(),
        instance: instance.into(),
        address: "127.0.0.1:1".into(),
        last_good_version: version.into(),
        labels: Default::default(),
        identity: "token `order`".into(),
    };
    let legacy = vec![agent("order-a", "v1"), agent("order-b", "v1")];
    let value = serde_json::to_vec(&legacy).unwrap();
    client.put("store/agents/a", value).await.unwrap();
    let a = store(&etcd, "a", &shutdown).await;
    assert_eq!(a.load().await.unwrap().state.agents, legacy);
    assert!(client.get("store/agents/a").await.unwrap().kvs.is_empty());
    let keys = async || {
        let prefix = RangeRequest::prefix("store/agents/a/");
        let got = client.range(prefix).await.unwrap();
        got.kvs
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                (key, kv.mod_revision)
            })
            .collect::<BTreeMap<String, i64>>()
    };
    let before = keys().await;
    assert_eq!(before.len(), 4, "{before:?}");
    // An ACK of order-a, order-b forgotten.
    let changes = AgentChanges {
        changed: vec![agent("order-a", "v2")],
        gone: vec![("order".into(), "order-b".into())],
        live: 1,
    };
    a.append_agents(&changes, &Vec::new).unwrap().await.unwrap();
    let after = keys().await;
    let changed: Vec<&String> = after
        .iter()
        .filter(|(k, rev)| before.get(*k) != Some(rev))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(changed, ["store/agents/a/order/order-a/v"], "{after:?}");
    assert_eq!(after.len(), 2, "{after:?}");
    let back = store(&etcd, "a", &shutdown).await.load().await.unwrap();
    assert_eq!(back.state.agents, [agent("order-a", "v2")]);
    // Another replica's agents are its own.
    let b = store(&etcd, "b", &shutdown).await.load().await.unwrap();
    assert!(b.state.agents.is_empty());
    shutdown.cancel();
}

/// A replica's agents are read page by page (1,000 keys a page) at one
/// revision: 2,500 agents (5,000 keys, three pages of the read) all load
/// with the versions they ACKed, where one answer of every key would grow
/// with the fleet past a gRPC message's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_agents_on_etcd_load_page_by_page() {
    use gov_control_plane::store::KnownAgent;
    let etcd = Etcd::start().await;
    let shutdown = CancellationToken::new();
    let client = Client::connect(&etcd.endpoints(), &ConnectOptions::default()).unwrap();
    let agent = |i: usize| KnownAgent {
        service: "order".into(),
        instance: format!("order-{i:05}"),
        address: "127.0.0.1:1".into(),
        last_good_version: "v1".into(),
        labels: Default::default(),
        identity: "token `order`".into(),
    };
    let count = 2_500;
    let puts: Vec<RequestOp> = (0..count)
        .flat_map(|i| {
            let key = format!("store/agents/a/order/order-{i:05}");
            let record = serde_json::to_vec(&agent(i)).unwrap();
            let version = format!("v{}", i % 7 + 2);
            [
                RequestOp::put(key.as_str(), record, 0),
                RequestOp::put(format!("{key}/v"), version, 0),
            ]
        })
        .collect();
    for batch in puts.chunks(100) {
        let txn = TxnRequest::default().and_then(batch.to_vec());
        client.txn(txn).await.unwrap();
    }
    let loaded = store(&etcd, "a", &shutdown).await.load().await.unwrap();
    let agents = loaded.state.agents;
    assert_eq!(agents.len(), count);
    for (i, a) in agents.iter().enumerate() {
        let mut want = agent(i);
        want.last_good_version = format!("v{}", i % 7 + 2);
        assert_eq!(*a, want);
    }
    shutdown.cancel();
}

/// govd on etcd: an agent that ACKed is read back from its keys after a
/// restart (DISCONNECTED, with the version it ACKed, until it reconnects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_acked_on_etcd_is_known_after_a_restart() {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let govd = replica(&etcd, dir.path(), "a").start().await;
    let port = govd.addr.port();
    let up = upstream().await;
    let agent = agent("order", "order-a")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    govd.wait_for_agents(1).await;
    let applied = apply_on(&govd, &policy(5)).await.unwrap();
    assert!(applied.applied);
    let synced = applied.outcomes.iter().map(pb::AgentOutcome::state);
    assert_eq!(synced.collect::<Vec<_>>(), [pb::SyncState::Synced]);
    // The service's config version the agent ACKed.
    let version = applied.outcomes[0].version.clone();
    let client = Client::connect(&etcd.endpoints(), &ConnectOptions::default()).unwrap();
    let key = "gov/agents/a/order/order-a/v";
    wait_until(
        "the agent's version in etcd",
        Duration::from_secs(10),
        async || {
            let got = client.get(key).await.unwrap();
            got.kvs
                .first()
                .is_some_and(|kv| kv.value == version.as_bytes())
        },
    )
    .await;
    agent.stop().await;
    govd.stop().await;
    let govd = replica(&etcd, dir.path(), "a").start_on(port).await;
    let view = govd.status().await;
    let row = view.agents.iter().find(|a| a.instance == "order-a");
    let row = row.expect("order-a is known after the restart");
    assert_eq!(row.state(), pb::SyncState::Disconnected);
    assert_eq!(row.last_good_version, version);
    govd.stop().await;
}

// === three replicas ===

/// order: a limit of 3 calls per minute on /burst that releases itself
/// after 4 s; a bulkhead on everything else.
pub(super) fn policy(max: u32) -> String {
    format!(
        r#"service order {{
  match burst = path prefix "/burst"
  match rest = path prefix "/"

  limit bursty on burst {{
    calls 3 per 1m
    release after 4s
  }}

  bulkhead wide on rest {{
    max_concurrent {max}
  }}
}}
"#
    )
}

fn replica(etcd: &Etcd, dir: &Path, name: &str) -> ControlPlaneBuilder {
    let mut b = control_plane(&dir.join(name));
    b.store = Some(etcd.url("gov"));
    b.args(&["--replica", name, "--leader-lease", "2s"])
        .metrics()
}

/// `govd_leader` from its `/metrics`.
async fn leader_gauge(govd: &Govd) -> String {
    let (_, _, body) = http_get(govd.metrics.unwrap(), "/metrics").await;
    body.lines()
        .find(|l| l.starts_with("govd_leader "))
        .unwrap_or_default()
        .to_owned()
}

pub(super) async fn apply_on(govd: &Govd, text: &str) -> Result<pb::ApplyResult, tonic::Status> {
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(pb::ApplyRequest {
        sources: vec![pb::SourceFile {
            name: "order.gov".into(),
            text: text.into(),
        }],
        who: "e2e".into(),
        wait_ms: 5_000,
        ..Default::default()
    });
    gov_control_plane::auth::authorize(&mut request, TOKEN).unwrap();
    client.apply(request).await.map(tonic::Response::into_inner)
}

async fn audit_of(govd: &Govd) -> Vec<pb::AuditRecord> {
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    client
        .audit(as_viewer(pb::AuditRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .records
}

fn leads(govd: &Govd) -> bool {
    read(&govd.log)
        .lines()
        .rfind(|l| l.contains("elected leader") || l.contains("lost the leader lease"))
        .is_some_and(|l| l.contains("elected leader"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_survive_an_etcd_member_and_the_leader_dying_during_an_apply_under_load() {
    let mut etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    eprintln!("DEBUG logs in {}", dir.path().display());
    let dir = Box::leak(Box::new(dir));
    let mut govds = Vec::new();
    for name in ["g0", "g1", "g2"] {
        govds.push(replica(&etcd, dir.path(), name).start().await);
    }
    wait_until("one leader", Duration::from_secs(15), async || {
        govds.iter().filter(|g| leads(g)).count() == 1
    })
    .await;
    let leader = govds.iter().position(leads).unwrap();
    for (i, g) in govds.iter().enumerate() {
        let want = if i == leader {
            "govd_leader 1"
        } else {
            "govd_leader 0"
        };
        assert_eq!(leader_gauge(g).await, want, "replica {i}");
    }
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let urls = |first: usize| -> String {
        std::iter::once(first)
            .chain((0..3).filter(|i| *i != first))
            .map(|i| govds[i].url())
            .collect::<Vec<_>>()
            .join(",")
    };
    let up = upstream().await;
    // a1 talks to the leader, a2 to a follower; each knows all three.
    let a1 = agent("order", "a1")
        .upstream(up)
        .control_plane_url(urls(leader))
        .start(dir.path())
        .await;
    let a2 = agent("order", "a2")
        .upstream(up)
        .control_plane_url(urls(others[0]))
        .start(dir.path())
        .await;

    // An apply on the other follower reaches both agents through etcd.
    let v1 = apply_on(&govds[others[1]], &policy(50)).await.unwrap();
    assert!(v1.applied, "{v1:?}");
    wait_until(
        "a1 SYNCED on v1 at the leader",
        Duration::from_secs(15),
        async || {
            let view = govds[leader].status().await;
            view.version == v1.version && all_synced(&govds[leader], &["a1"]).await
        },
    )
    .await;
    wait_until(
        "a2 SYNCED on v1 at its follower",
        Duration::from_secs(15),
        async || {
            govds[others[0]].status().await.version == v1.version
                && all_synced(&govds[others[0]], &["a2"]).await
        },
    )
    .await;

    // The limit engages on a2 (a follower's agent): a latch with a deadline.
    for _ in 0..4 {
        http_get(a2.inbound, "/burst").await;
    }
    let engaged = Instant::now();
    wait_until(
        "the latch in the leader's view",
        Duration::from_secs(15),
        async || !govds[leader].status().await.limits.is_empty(),
    )
    .await;

    // One etcd member dies: a majority remains, nothing visible changes.
    etcd.kill(0).await;

    // Load through both agents while the leader dies during an apply.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = [a1.inbound, a2.inbound].map(|addr| {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            let start = Instant::now();
            // Bounded in count and time.
            for _ in 0..5_000 {
                if stop.load(Ordering::Relaxed) || start.elapsed() > Duration::from_secs(30) {
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(2), http_get(addr, "/ok")).await {
                    Ok((200, _, _)) => ok += 1,
                    _ => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (ok, failed)
        })
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let v2_text = policy(40);
    let apply = {
        let url = govds[leader].url();
        let text = v2_text.clone();
        tokio::spawn(async move {
            let govd_url = url;
            let mut client =
                gov_control_plane::client::connect(&govd_url, Duration::from_secs(5)).await?;
            let mut request = tonic::Request::new(pb::ApplyRequest {
                sources: vec![pb::SourceFile {
                    name: "order.gov".into(),
                    text,
                }],
                who: "e2e".into(),
                ..Default::default()
            });
            gov_control_plane::auth::authorize(&mut request, TOKEN).unwrap();
            Ok::<_, gov_control_plane::client::Unreachable>(
                client.apply(request).await.map(tonic::Response::into_inner),
            )
        })
    };
    // Killed while the apply is on its way or being written (or just
    // after): every outcome must leave one consistent state.
    tokio::time::sleep(Duration::from_millis(3)).await;
    let dead = govds.remove(leader);
    dead.kill().await;
    let answered = apply.await.unwrap();
    let killed_at = Instant::now();

    // The survivors agree on one version: the new one if the apply
    // answered applied, else the old one or the new one, never a mix.
    let mut agreed = String::new();
    wait_until(
        "the survivors to agree",
        Duration::from_secs(15),
        async || {
            let (x, y) = (govds[0].status().await, govds[1].status().await);
            agreed.clone_from(&x.version);
            x.version == y.version
        },
    )
    .await;
    if let Ok(Ok(result)) = &answered {
        assert!(result.applied);
        assert_eq!(
            agreed, result.version,
            "an answered apply is the one in force"
        );
    }
    let v2 = gov_compiler::compile(&[gov_compiler::SourceFile::new("order.gov", &v2_text)])
        .unwrap()
        .bundle
        .version;
    assert!(
        agreed == v1.version || agreed == v2,
        "`{agreed}` is neither v1 `{}` nor v2 `{v2}`",
        v1.version
    );
    // Both agents are SYNCED on it at a survivor within seconds (a1
    // reconnected to another replica).
    wait_until(
        "both agents SYNCED at the survivors",
        Duration::from_secs(15),
        async || {
            let mut synced = BTreeSet::new();
            for g in &govds {
                let view = g.status().await;
                for a in &view.agents {
                    if view.version == agreed && a.state() == pb::SyncState::Synced {
                        synced.insert(a.instance.clone());
                    }
                }
            }
            synced.len() == 2
        },
    )
    .await;
    let reconnected = killed_at.elapsed();
    // A new leader among the survivors.
    wait_until("a new leader", Duration::from_secs(15), async || {
        govds.iter().filter(|g| leads(g)).count() == 1
    })
    .await;

    // The latch ends once, at its deadline: by the new leader's timer (or
    // by the agent's own timer first, audited as such), never twice.
    wait_until("the latch released", Duration::from_secs(20), async || {
        govds[0].status().await.limits.is_empty() && govds[1].status().await.limits.is_empty()
    })
    .await;
    assert!(
        engaged.elapsed() >= Duration::from_secs(3),
        "not before its deadline"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let audit = audit_of(&govds[0]).await;
    let releases: Vec<&pb::AuditRecord> = audit
        .iter()
        .filter(|r| r.rule == "order/bursty" && matches!(r.action.as_str(), "release" | "untrip"))
        .collect();
    let timer_releases = releases
        .iter()
        .filter(|r| r.action == "release" && r.who == "govd (release after)")
        .count();
    assert!(timer_releases <= 1, "the timer fired twice: {releases:?}");
    assert!(
        !releases.is_empty(),
        "the latch's end is audited: {audit:?}"
    );
    // Nothing in the audit is lost: the first apply, the trip, and the
    // second apply if it took effect.
    let applied: Vec<&str> = audit
        .iter()
        .filter(|r| r.action == "apply")
        .map(|r| r.version.as_str())
        .collect();
    assert!(applied.contains(&v1.version.as_str()), "{applied:?}");
    if agreed != v1.version {
        assert!(applied.contains(&agreed.as_str()), "{applied:?}");
    }
    assert!(
        audit
            .iter()
            .any(|r| r.action == "trip" && r.rule == "order/bursty"),
        "{audit:?}"
    );
    // The agents served throughout.
    for (i, h) in load.into_iter().enumerate() {
        let (ok, failed) = h.await.unwrap();
        assert!(ok > 0 && failed == 0, "agent {i}: {ok} ok, {failed} failed");
    }
    eprintln!(
        "apply during the leader's death: {}; in force after: {}; agents SYNCED again {reconnected:?} after the kill",
        match &answered {
            Ok(Ok(r)) => format!("applied {}", r.version),
            Ok(Err(s)) => format!("refused: {}", s.message()),
            Err(e) => format!("unreachable: {e}"),
        },
        if agreed == v1.version {
            "v1 (the old)"
        } else {
            "v2 (the new)"
        }
    );
    a1.stop().await;
    a2.stop().await;
    for g in govds {
        g.stop().await;
    }
    drop(etcd);
}

/// The first config a raw agent `Connect` as `order` gets from `govd` (the
/// agent token of the e2e token file), or why it got none.
async fn first_config_from(govd: &Govd) -> Result<pb::TargetConfig, tonic::Status> {
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let hello = pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Hello(pb::Hello {
            service: "order".into(),
            instance: "order-paused-test".into(),
            address: "127.0.0.1:9".into(),
            ..Default::default()
        })),
    };
    // The stream stays open (no more messages) until the config is read.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(hello).await.unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    gov_control_plane::auth::authorize(&mut request, &service_agent_token("order")).unwrap();
    let mut incoming = tokio::time::timeout(Duration::from_secs(10), client.connect(request))
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no answer to Connect in 10s"))??
        .into_inner();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), incoming.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no config in 10s"))??
            .ok_or_else(|| tonic::Status::aborted("the stream ended"))?;
        if let Some(pb::control_message::Msg::Config(config)) = msg.msg {
            drop(tx);
            return config
                .target
                .ok_or_else(|| tonic::Status::internal("a config without a target"));
        }
    }
}

/// A replica stopped (SIGSTOP) for longer than its lease while the policy
/// moved on, then resumed, never hands a connecting agent the policy it held
/// before the pause: it reads etcd's revision first (issue 26).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_resumed_after_its_lease_never_serves_the_policy_it_held_before() {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = replica(&etcd, dir.path(), "a").start().await;
    let b = replica(&etcd, dir.path(), "b").start().await;
    apply_on(&a, &policy(1)).await.unwrap();
    let old = a.status().await.version;
    wait_until(
        "b takes in the first policy",
        Duration::from_secs(10),
        async || b.status().await.version == old,
    )
    .await;

    signal(&b.child, rustix::process::Signal::STOP);
    // Past b's 2s lease, and past its etcd client's 5s keepalive: its
    // watch is gone when it resumes.
    tokio::time::sleep(Duration::from_secs(6)).await;
    apply_on(&a, &policy(2)).await.unwrap();
    apply_on(&a, &policy(3)).await.unwrap();
    let current = a.status().await.version;
    assert_ne!(current, old);
    let expected = first_config_from(&a).await.unwrap().version;
    signal(&b.child, rustix::process::Signal::CONT);

    let served = first_config_from(&b).await.unwrap();
    assert_eq!(
        served.version, expected,
        "the resumed replica served an older config"
    );
}

/// One etcd member of three SIGKILLed while applies go on (the docs say
/// nothing visible happens): every apply succeeds, and each is audited
/// once (issue 26). Each member in turn, so the one govd's client was
/// talking to is among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applies_go_on_when_one_etcd_member_of_three_dies_under_them() {
    for member in 0..3 {
        let mut etcd = Etcd::start().await;
        let dir = tempfile::tempdir().unwrap();
        let govd = replica(&etcd, dir.path(), "a").start().await;
        apply_on(&govd, &policy(1)).await.unwrap();
        let url = govd.url();
        // An apply in flight when the member dies, then more.
        let during = tokio::spawn(async move {
            let mut client = gov_control_plane::client::connect(&url, Duration::from_secs(5))
                .await
                .unwrap();
            let mut request = tonic::Request::new(pb::ApplyRequest {
                sources: vec![pb::SourceFile {
                    name: "order.gov".into(),
                    text: policy(2),
                }],
                who: "e2e".into(),
                ..Default::default()
            });
            gov_control_plane::auth::authorize(&mut request, TOKEN).unwrap();
            client.apply(request).await.map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        etcd.kill(member).await;
        let mut results = vec![during.await.unwrap()];
        for max in 3..6 {
            results.push(apply_on(&govd, &policy(max)).await.map(|_| ()));
        }
        for (i, result) in results.iter().enumerate() {
            assert!(
                result.is_ok(),
                "apply {i} after member {member} died: {result:?}"
            );
        }
        let applies: Vec<String> = audit_of(&govd)
            .await
            .into_iter()
            .filter(|r| r.action == "apply")
            .map(|r| r.version)
            .collect();
        let distinct: BTreeSet<&String> = applies.iter().collect();
        assert_eq!(applies.len(), 5, "one record per apply: {applies:?}");
        assert_eq!(distinct.len(), 5, "{applies:?}");
    }
}

/// Two etcd members of three SIGKILLed: the replica can reach no quorum,
/// and `govc status` says so within two probes (a `Store:` line with NO
/// QUORUM, a warning on stderr that applies will fail, still exit 0),
/// as do `-o json` and `/metrics`; and an apply does fail (issue 26).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govc_status_warns_when_etcd_has_lost_its_majority_and_applies_fail() {
    let mut etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let govd = replica(&etcd, dir.path(), "a").start().await;
    apply_on(&govd, &policy(1)).await.unwrap();
    wait_until("a leads", Duration::from_secs(10), async || leads(&govd)).await;
    let healthy = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(healthy.code, 0, "{}", healthy.stderr);
    let line = healthy
        .stdout
        .lines()
        .find(|l| l.starts_with("Store: etcd://"))
        .unwrap_or_else(|| panic!("no store line: {}", healthy.stdout));
    assert!(line.contains("/gov: quorum "), "{line}");
    assert!(line.contains("this replica leads"), "{line}");
    assert!(!healthy.stderr.contains("warning"), "{}", healthy.stderr);

    etcd.kill(1).await;
    etcd.kill(2).await;
    let killed = Instant::now();
    let mut status = None;
    while killed.elapsed() < Duration::from_secs(15) {
        let s = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
        if s.stderr.contains("etcd has no quorum from this replica") {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = status.expect("govc status warns within 15s of etcd losing its majority");
    assert_eq!(status.code, 0, "a readable status: {}", status.stderr);
    assert!(
        status.stderr.contains("applies and releases will fail"),
        "{}",
        status.stderr
    );
    assert!(
        status.stdout.contains(": NO QUORUM since "),
        "{}",
        status.stdout
    );
    let json = govc(&govd, Some(VIEWER_TOKEN), &["status", "-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["store"]["writable"], false, "{json}");
    let (_, _, metrics) = http_get(govd.metrics.unwrap(), "/metrics").await;
    assert!(metrics.contains("\ngovd_store_reachable 0\n"), "{metrics}");

    let apply = tokio::time::timeout(Duration::from_secs(60), apply_on(&govd, &policy(2)))
        .await
        .expect("an apply without etcd's majority ends");
    assert!(apply.is_err(), "an apply without a quorum: {apply:?}");
}
