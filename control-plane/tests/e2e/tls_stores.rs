//! Both stores over mutual TLS, end to end: `govd` keeps its state in an
//! etcd member that takes only TLS clients with a certificate
//! (`--store etcds://`), and two agents of `order` share a `scope cluster`
//! limit in a `redis-server` that serves only TLS and wants a client
//! certificate (`--redis rediss://`). Real processes on loopback; the
//! certificates are made here.

use std::collections::BTreeMap;

use super::*;

/// A CA for the stores and the certificates it signs (`Pki` of the e2e
/// harness is govd's).
struct StorePki {
    dir: PathBuf,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl StorePki {
    fn new(dir: &Path) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "stores CA");
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("stores-ca.pem"), issuer.pem()).unwrap();
        Self {
            dir: dir.to_owned(),
            issuer,
        }
    }

    fn ca(&self) -> String {
        self.dir.join("stores-ca.pem").display().to_string()
    }

    /// (cert, key) files for `sans`.
    fn issue(&self, stem: &str, sans: &[&str]) -> (String, String) {
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
        (c.display().to_string(), k.display().to_string())
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `port` accepts TCP, for at most 20 s.
async fn listening(what: &str, port: u16) {
    wait_until(what, Duration::from_secs(20), async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
}

const POLICY: &str = r#"service order {
  match api = path prefix "/"

  limit shared on api {
    calls 10 per 1m
    scope cluster sync exact timeout 1s fallback reject
  }
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govd_on_etcds_and_agents_on_rediss_enforce_one_cluster_limit() {
    let dir = tempfile::tempdir().unwrap();
    let pki = StorePki::new(&dir.path().join("stores"));
    let server = pki.issue("server", &["127.0.0.1", "localhost"]);
    let govd_client = pki.issue("govd", &["govd.test"]);
    let agent_client = pki.issue("agent", &["order.agent"]);

    // etcd: one member, clients over TLS with a certificate only.
    let (client_port, peer_port) = (free_port(), free_port());
    let _etcd = Command::new(std::env::var_os("GOV_TEST_ETCD").unwrap_or_else(|| "etcd".into()))
        .args(["--name", "m0"])
        .arg("--data-dir")
        .arg(dir.path().join("etcd"))
        .arg("--listen-client-urls")
        .arg(format!("https://127.0.0.1:{client_port}"))
        .arg("--advertise-client-urls")
        .arg(format!("https://127.0.0.1:{client_port}"))
        .arg("--listen-peer-urls")
        .arg(format!("http://127.0.0.1:{peer_port}"))
        .arg("--initial-advertise-peer-urls")
        .arg(format!("http://127.0.0.1:{peer_port}"))
        .arg("--initial-cluster")
        .arg(format!("m0=http://127.0.0.1:{peer_port}"))
        .args(["--cert-file", &server.0, "--key-file", &server.1])
        .args(["--trusted-ca-file", &pki.ca(), "--client-cert-auth"])
        .args(["--logger", "zap", "--log-level", "error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("`etcd` (Debian's etcd-server; .ci/run installs it)");
    // redis-server: only a TLS port, a client certificate required.
    let redis_port = free_port();
    let _redis = Command::new("redis-server")
        .args(["--port", "0", "--bind", "127.0.0.1"])
        .args(["--tls-port", &redis_port.to_string()])
        .args(["--tls-cert-file", &server.0, "--tls-key-file", &server.1])
        .args(["--tls-ca-cert-file", &pki.ca(), "--tls-auth-clients", "yes"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("`redis-server` (.ci/run installs it)");
    listening("etcd's TLS client port", client_port).await;
    listening("redis-server's TLS port", redis_port).await;

    // govd on etcds://: it starts only once it has read the state over TLS
    // (etcd may need a moment to elect itself: a few tries).
    let mut govd = None;
    for _ in 0..5 {
        let mut b = control_plane(&dir.path().join("state"));
        b.store = Some(format!("etcds://127.0.0.1:{client_port}/gov"));
        let b = b.args(&[
            "--etcd-ca",
            &pki.ca(),
            "--etcd-cert",
            &govd_client.0,
            "--etcd-key",
            &govd_client.1,
        ]);
        let started = tokio::time::timeout(Duration::from_secs(20), b.start()).await;
        if let Ok(g) = started {
            govd = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let govd = govd.expect("govd never started on etcds://");
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(
        status.stdout.contains("etcds://127.0.0.1:"),
        "{}{}",
        status.stdout,
        status.stderr
    );

    // Two agents of `order` on rediss://.
    let up = upstream().await;
    let redis = format!("rediss://127.0.0.1:{redis_port}");
    let mut agents = Vec::new();
    for name in ["order-1", "order-2"] {
        let mut b = agent("order", name).upstream(up).control_plane(&govd);
        for arg in [
            "--redis",
            &redis,
            "--redis-ca",
            &pki.ca(),
            "--redis-cert",
            &agent_client.0,
            "--redis-key",
            &agent_client.1,
        ] {
            b.args.push(arg.into());
        }
        agents.push(b.start(dir.path()).await);
    }
    let policy = write(dir.path(), "shared.gov", POLICY);
    let applied = govc(&govd, Some(TOKEN), &["apply", &policy]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    wait_until("both agents SYNCED", Duration::from_secs(30), async || {
        all_synced(&govd, &["order-1", "order-2"]).await
    })
    .await;

    // 30 calls, alternating, in one window: the two admit 10 in all.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let left = 60_000 - now_ms % 60_000;
    if left < 25_000 {
        tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap() + 50)).await;
    }
    let mut statuses = BTreeMap::<u16, usize>::new();
    for i in 0..30 {
        let (code, _) = call(agents[i % 2].inbound, "order").await;
        *statuses.entry(code).or_default() += 1;
    }
    assert_eq!(
        statuses.get(&200),
        Some(&10),
        "{statuses:?}; agent log:\n{}",
        read(&agents[0].log)
    );
    assert_eq!(statuses.values().sum::<usize>(), 30, "{statuses:?}");
    for agent in &agents {
        let (_, _, metrics) = http_get(agent.admin, "/metrics").await;
        assert!(
            metrics.contains("gov_agent_cluster_store_up 1"),
            "the agent counted in Redis over TLS, not locally"
        );
    }
}
