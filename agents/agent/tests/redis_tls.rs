//! `scope cluster` limits over TLS (`--redis rediss://...`): a real
//! `redis-server` on 127.0.0.1 with only a TLS port, and certificates made
//! here (rcgen): a CA, the server's certificate for 127.0.0.1, a client
//! certificate for mutual TLS (`tls-auth-clients yes`), and a foreign CA;
//! and `rediss+cluster://`, a three-master Redis Cluster whose clients and
//! cluster bus speak only TLS (built with `redis-cli --tls --cluster create`).
//!
//! Each test starts its own server on an ephemeral port (killed on drop);
//! every loop is bounded in count and time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gov_agent::cluster::{ClusterError, RedisTlsFiles};
use gov_engine::{Engine, RejectReason, Rejection, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

/// A CA and the certificates it signs, as PEM files in `dir`.
struct Pki {
    dir: PathBuf,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    name: String,
}

impl Pki {
    fn new(dir: &Path, name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), issuer.pem()).unwrap();
        Self {
            dir: dir.to_owned(),
            issuer,
            name: name.to_owned(),
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    /// A certificate for `sans` (IP addresses or DNS names), as (cert, key) files.
    fn issue(&self, stem: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        let params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            self.dir.join(format!("{stem}.crt")),
            self.dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// A `redis-server` listening only on a TLS port of 127.0.0.1.
struct TlsRedis {
    port: u16,
    child: Child,
}

impl TlsRedis {
    /// Started with `pki`'s server certificate; `mutual`: clients must
    /// present a certificate of `pki` too. `None` (with a message on stderr)
    /// when this redis-server was built without TLS.
    fn start(dir: &Path, pki: &Pki, mutual: bool) -> Option<Self> {
        Self::start_with(dir, pki, mutual, &[])
    }

    /// Like [`TlsRedis::start`] with more arguments (`{port}` and `{bus}`
    /// replaced by its TLS port and a free cluster bus port).
    fn start_with(dir: &Path, pki: &Pki, mutual: bool, extra: &[&str]) -> Option<Self> {
        let (cert, key) = pki.issue("redis-server", &["127.0.0.1", "localhost"]);
        let free = || {
            TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (port, bus) = (free(), free());
        let log = dir.join(format!("redis-{port}.log"));
        let mut child = Command::new("redis-server")
            .args(["--port", "0", "--bind", "127.0.0.1"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(pki.ca())
            .args(["--tls-auth-clients", if mutual { "yes" } else { "no" }])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra.iter().map(|a| {
                a.replace("{port}", &port.to_string())
                    .replace("{bus}", &bus.to_string())
            }))
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `redis-server` ({e}); these tests need it on PATH: \
                     `apt-get install -y redis-server` (.ci/run installs it)"
                )
            });
        for _ in 0..200 {
            if let Ok(Some(status)) = child.try_wait() {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                if said.contains("tls") || said.contains("TLS") {
                    eprintln!(
                        "SKIPPED: this redis-server cannot serve TLS ({status}): {}",
                        said.trim()
                    );
                    return None;
                }
                panic!("redis-server with --tls-port exited ({status}): {said}");
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(Self { port, child });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server never listened on its TLS port {port}");
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `sync exact` limit whose calls wait up to 2 s for Redis: the first
/// call of an agent makes the TLS connection (over 100 ms in a debug build,
/// the default `timeout`, which would count it locally).
fn limit_config(amount: u64) -> TargetConfig {
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
    sync: CLUSTER_SYNC_EXACT
    sync_timeout_ms: 2000
"
    );
    let mut target = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut target);
    target
}

fn agent(url: &str, tls: &RedisTlsFiles, config: &TargetConfig) -> Engine {
    let store = gov_agent::cluster::redis_with(url, Duration::from_secs(1), tls).unwrap();
    let engine = Engine::with_cluster_store("order", store);
    engine.apply_target(config).unwrap();
    engine
}

async fn call(engine: &Engine) -> Result<(), Rejection> {
    let headers = HeaderMap::new();
    let info = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
    tokio::time::timeout(Duration::from_secs(3), engine.admit(&info))
        .await
        .expect("a decision took more than 3s")
        .map(drop)
}

/// Waits (up to 20 s) for the start of a minute with 20 s left, so that a
/// test's calls fall in one 60 s window.
async fn fit_in_one_window() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let left = 60_000 - now % 60_000;
    if left < 20_000 {
        tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap() + 20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_share_an_exact_limit_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "redis-ca");
    let Some(redis) = TlsRedis::start(dir.path(), &pki, true) else {
        return;
    };
    let (cert, key) = pki.issue("agent", &["order.agent"]);
    let tls = RedisTlsFiles {
        ca: Some(pki.ca()),
        cert: Some(cert),
        key: Some(key),
    };
    let config = limit_config(12);
    let (a, b) = (
        agent(&redis.url(), &tls, &config),
        agent(&redis.url(), &tls, &config),
    );
    fit_in_one_window().await;
    let mut admitted = 0;
    for i in 0..20 {
        let engine = if i % 2 == 0 { &a } else { &b };
        match call(engine).await {
            Ok(()) => admitted += 1,
            Err(r) => assert_eq!(r.reason, RejectReason::LimitCalls),
        }
    }
    assert_eq!(
        admitted, 12,
        "two agents share one counter in Redis over TLS"
    );
    assert_eq!(a.stats().cluster_store_up, Some(true));
    assert_eq!(b.stats().cluster_store_up, Some(true));
}

/// The store is down (calls count locally, the gauge says 0) when the
/// handshake fails: no client certificate for a server that asks for one,
/// or a server certificate that the given CA did not sign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_handshake_is_an_outage_not_a_shared_counter() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "redis-ca");
    let foreign = Pki::new(dir.path(), "foreign-ca");
    let Some(redis) = TlsRedis::start(dir.path(), &pki, true) else {
        return;
    };
    let (cert, key) = pki.issue("agent", &["order.agent"]);
    let config = limit_config(3);
    let cases = [
        (
            "no client certificate",
            RedisTlsFiles {
                ca: Some(pki.ca()),
                ..RedisTlsFiles::default()
            },
        ),
        (
            "a CA that did not sign the server",
            RedisTlsFiles {
                ca: Some(foreign.ca()),
                cert: Some(cert),
                key: Some(key),
            },
        ),
    ];
    for (case, tls) in cases {
        let a = agent(&redis.url(), &tls, &config);
        for _ in 0..3 {
            call(&a).await.unwrap();
        }
        assert_eq!(a.stats().cluster_store_up, Some(false), "{case}");
    }
}

#[test]
fn tls_files_that_cannot_work_are_usage_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "redis-ca");
    let (cert, key) = pki.issue("agent", &["order.agent"]);
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let with = |ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>| RedisTlsFiles {
            ca: ca.map(Path::to_owned),
            cert: cert.map(Path::to_owned),
            key: key.map(Path::to_owned),
        };
        let ca = pki.ca();
        let missing = dir.path().join("missing.pem");
        for (url, files, says, help) in [
            (
                "redis://127.0.0.1:1",
                with(Some(&ca), None, None),
                "plain Redis",
                "rediss://",
            ),
            (
                "redis+cluster://127.0.0.1:1",
                with(Some(&ca), None, None),
                "plain Redis",
                "rediss+cluster://",
            ),
            (
                "rediss://127.0.0.1:1",
                with(None, Some(&cert), None),
                "--redis-key is missing",
                "both",
            ),
            (
                "rediss://127.0.0.1:1",
                with(None, None, Some(&key)),
                "--redis-cert is missing",
                "both",
            ),
            (
                "rediss://127.0.0.1:1",
                with(Some(&missing), None, None),
                "cannot read the Redis CA certificate",
                "path",
            ),
            (
                "rediss+cluster://127.0.0.1:1",
                with(Some(&not_pem), None, None),
                "not PEM",
                "PEM",
            ),
            (
                "rediss://127.0.0.1:1",
                with(None, Some(&cert), Some(&cert)),
                "cannot set up TLS",
                "--redis-key",
            ),
            (
                "rediss+sentinel://127.0.0.1:1/m",
                RedisTlsFiles::default(),
                "not supported yet",
                "rediss://",
            ),
        ] {
            let Err(e) = gov_agent::cluster::redis_with(url, Duration::from_secs(1), &files) else {
                panic!("{url} with {files:?} was accepted");
            };
            let text = e.to_string();
            assert!(text.contains(says), "{url}: {text}");
            let hint = miette::Diagnostic::help(&e).map(|h| h.to_string());
            assert!(
                hint.as_deref().is_some_and(|h| h.contains(help)),
                "{url}: {text}: {hint:?}"
            );
            if matches!(e, ClusterError::Url { .. }) {
                assert!(text.contains(&format!("`{url}`")), "{text}");
            }
        }
    });
}

/// `redis-cli` over TLS to `port`, with `pki`'s CA and `client` certificate.
fn tls_cli(port: u16, pki: &Pki, client: &(PathBuf, PathBuf), args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["--tls", "-h", "127.0.0.1", "-p", &port.to_string()])
        .arg("--cacert")
        .arg(pki.ca())
        .arg("--cert")
        .arg(&client.0)
        .arg("--key")
        .arg(&client.1)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `rediss+cluster://`: a Redis Cluster of three masters whose clients and
/// cluster bus speak only TLS; two agents share one exact limit through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_share_an_exact_limit_through_a_tls_redis_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "redis-ca");
    let client = pki.issue("agent", &["order.agent"]);
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let Some(node) = TlsRedis::start_with(
            dir.path(),
            &pki,
            true,
            &[
                "--tls-cluster",
                "yes",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes-{port}.conf",
                "--cluster-port",
                "{bus}",
                "--cluster-node-timeout",
                "1000",
            ],
        ) else {
            return;
        };
        nodes.push(node);
    }
    let mut create = vec!["--cluster".to_owned(), "create".to_owned()];
    create.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
    let create: Vec<&str> = create.iter().map(String::as_str).collect();
    let made = tls_cli(nodes[0].port, &pki, &client, &create);
    assert!(made.is_some(), "redis-cli --tls --cluster create failed");
    let start = std::time::Instant::now();
    while !nodes.iter().all(|n| {
        tls_cli(n.port, &pki, &client, &["CLUSTER", "INFO"])
            .is_some_and(|info| info.contains("cluster_state:ok"))
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the TLS cluster never reached cluster_state:ok"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!(
        "rediss+cluster://127.0.0.1:{},127.0.0.1:{}",
        nodes[0].port, nodes[1].port
    );
    let tls = RedisTlsFiles {
        ca: Some(pki.ca()),
        cert: Some(client.0.clone()),
        key: Some(client.1.clone()),
    };
    let config = limit_config(12);
    let (a, b) = (agent(&url, &tls, &config), agent(&url, &tls, &config));
    fit_in_one_window().await;
    let mut admitted = 0;
    for i in 0..20 {
        let engine = if i % 2 == 0 { &a } else { &b };
        match call(engine).await {
            Ok(()) => admitted += 1,
            Err(r) => assert_eq!(r.reason, RejectReason::LimitCalls),
        }
    }
    assert_eq!(
        admitted, 12,
        "two agents share one counter in a TLS cluster"
    );
    assert_eq!(a.stats().cluster_store_up, Some(true));
}
