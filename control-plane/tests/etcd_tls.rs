//! govd on etcd over TLS (`--store etcds://`): a real etcd member (Debian's
//! `etcd-server`, which `.ci/run` installs) on loopback serving clients only
//! over TLS with `--client-cert-auth`, and certificates made here (rcgen):
//! its CA, the member's certificate for 127.0.0.1, govd's client
//! certificate, and a foreign CA. Each test starts its own member (killed
//! on drop); every wait is bounded.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gov_control_plane::etcd::client::{Client, ConnectOptions};
use gov_control_plane::etcd::{EtcdConfig, EtcdStore, EtcdTlsFiles};
use gov_control_plane::store::Store as _;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// A CA and the certificates it signs, as PEM files in `dir`.
struct Pki {
    dir: PathBuf,
    name: String,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
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
        std::fs::write(
            dir.join(format!("{name}.key")),
            issuer.key().serialize_pem(),
        )
        .unwrap();
        Self {
            dir: dir.to_owned(),
            name: name.to_owned(),
            issuer,
        }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    fn key(&self) -> PathBuf {
        self.dir.join(format!("{}.key", self.name))
    }

    /// A certificate for `sans`, as (cert, key) files.
    fn issue(&self, stem: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, stem);
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One etcd member whose clients must use TLS with a certificate of `pki`.
struct TlsEtcd {
    _member: Child,
    port: u16,
}

impl TlsEtcd {
    /// Started, and answering over TLS (new ports and another try, three at
    /// most, when it could not bind the ones picked).
    async fn start(dir: &Path, pki: &Pki, client: &(PathBuf, PathBuf)) -> Self {
        let (cert, key) = pki.issue("etcd-member", &["127.0.0.1", "localhost"]);
        for attempt in 0..3 {
            let (port, peer) = (free_port(), free_port());
            let data = dir.join(format!("member-{attempt}"));
            let log = std::fs::File::create(dir.join(format!("member-{attempt}.log"))).unwrap();
            let mut member = Command::new(etcd_bin())
                .args(["--name", "m0"])
                .arg("--data-dir")
                .arg(&data)
                .arg("--listen-client-urls")
                .arg(format!("https://127.0.0.1:{port}"))
                .arg("--advertise-client-urls")
                .arg(format!("https://127.0.0.1:{port}"))
                .arg("--listen-peer-urls")
                .arg(format!("http://127.0.0.1:{peer}"))
                .arg("--initial-advertise-peer-urls")
                .arg(format!("http://127.0.0.1:{peer}"))
                .arg("--initial-cluster")
                .arg(format!("m0=http://127.0.0.1:{peer}"))
                .arg("--cert-file")
                .arg(&cert)
                .arg("--key-file")
                .arg(&key)
                .arg("--trusted-ca-file")
                .arg(pki.ca())
                .arg("--client-cert-auth")
                .args(["--logger", "zap", "--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) {
                if member.try_wait().unwrap().is_some() {
                    break;
                }
                if answers(port, pki, client).await {
                    return Self {
                        _member: member,
                        port,
                    };
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("an etcd member with TLS did not come up on loopback in three tries");
    }

    fn url(&self, prefix: &str) -> String {
        format!("etcds://127.0.0.1:{}/{prefix}", self.port)
    }
}

/// Whether the member answers a put over mutual TLS.
async fn answers(port: u16, pki: &Pki, client: &(PathBuf, PathBuf)) -> bool {
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(pki.ca()).unwrap(),
        ))
        .identity(tonic::transport::Identity::from_pem(
            std::fs::read(&client.0).unwrap(),
            std::fs::read(&client.1).unwrap(),
        ));
    let options = ConnectOptions {
        timeout: Some(Duration::from_secs(1)),
        connect_timeout: Some(Duration::from_secs(1)),
        tls: Some(tls),
        ..ConnectOptions::default()
    };
    let client = Client::connect(&[format!("https://127.0.0.1:{port}")], &options).unwrap();
    let put = client.put("gov-test/health", "ok");
    matches!(
        tokio::time::timeout(Duration::from_secs(2), put).await,
        Ok(Ok(_))
    )
}

fn files(ca: PathBuf, client: Option<&(PathBuf, PathBuf)>) -> EtcdTlsFiles {
    EtcdTlsFiles {
        ca: Some(ca),
        cert: client.map(|c| c.0.clone()),
        key: client.map(|c| c.1.clone()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reads_writes_and_leads_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "etcd-ca");
    let client = pki.issue("govd", &["govd.test"]);
    let etcd = TlsEtcd::start(dir.path(), &pki, &client).await;
    let config = EtcdConfig::parse(&etcd.url("tls"), "r1", Duration::from_secs(2))
        .unwrap()
        .with_tls(files(pki.ca(), Some(&client)))
        .unwrap();
    let shutdown = CancellationToken::new();
    let store = EtcdStore::connect(config, shutdown.clone()).await.unwrap();
    assert!(store.describe().starts_with("etcds://127.0.0.1:"));
    store.load().await.unwrap();
    // Leading takes a lease and a transaction on the leader key: writes.
    let start = Instant::now();
    while !store.is_leader() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "r1 never became the leader over TLS"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
}

/// The real govd: it starts on `etcds://` with the three flags, and stops
/// at start (exit 1, the reason on stderr) when the handshake fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govd_starts_on_etcds_and_stops_when_the_handshake_fails() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "etcd-ca");
    let foreign = Pki::new(dir.path(), "foreign-ca");
    let client = pki.issue("govd", &["govd.test"]);
    let etcd = TlsEtcd::start(dir.path(), &pki, &client).await;
    let govd_on = |store: &str, extra: Vec<PathBuf>, flags: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_govd"));
        cmd.args(["--listen", "127.0.0.1:0", "--insecure"])
            .args(["--store", store])
            .env("GOV_LOG", "info")
            .env_remove("GOV_TOKEN_FILE")
            .stdout(Stdio::null())
            .kill_on_drop(true);
        for (flag, file) in flags.iter().zip(extra) {
            cmd.arg(flag).arg(file);
        }
        cmd
    };
    let tls = etcd.url("govd");
    let govd = |extra: Vec<PathBuf>, flags: &[&str]| govd_on(&tls, extra, flags);

    // Started: it says so, and names the store it uses.
    let log = dir.path().join("govd.log");
    let mut started = govd(
        vec![pki.ca(), client.0.clone(), client.1.clone()],
        &["--etcd-ca", "--etcd-cert", "--etcd-key"],
    )
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("govd started") {
            assert!(text.contains("etcds://127.0.0.1:"), "{text}");
            break;
        }
        assert!(
            started.try_wait().unwrap().is_none(),
            "govd exited on etcds://: {text}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "govd never started: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.kill().await.unwrap();

    // Refused handshakes: no client certificate; a CA that did not sign the
    // member; plain gRPC to a member that serves TLS. Each help says which
    // flag to change, not "is etcd up?".
    let plain = etcd.url("govd").replace("etcds://", "etcd://");
    for (case, extra, flags, help) in [
        (
            "no client certificate",
            vec![pki.ca()],
            &["--etcd-ca"][..],
            "--etcd-cert",
        ),
        (
            "a foreign CA",
            vec![foreign.ca(), client.0.clone(), client.1.clone()],
            &["--etcd-ca", "--etcd-cert", "--etcd-key"][..],
            "not signed by the CA given with --etcd-ca",
        ),
        ("etcd:// to a TLS member", vec![], &[][..], "etcds://"),
    ] {
        let store = if flags.is_empty() { &plain } else { &tls };
        let mut cmd = govd_on(store, extra, flags);
        let out =
            tokio::time::timeout(Duration::from_secs(40), cmd.stderr(Stdio::piped()).output())
                .await
                .unwrap_or_else(|_| panic!("{case}: govd neither started nor stopped in 40 s"))
                .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{case}: {stderr}");
        assert!(stderr.contains("etcd ("), "{case}: {stderr}");
        assert!(!stderr.contains("govd started"), "{case}: {stderr}");
        let help_line = stderr.lines().find(|l| l.contains("help:")).unwrap_or("");
        assert!(help_line.contains(help), "{case}: {stderr}");
    }
}

/// Endpoints that are not etcd stop govd with the cause said once and a
/// help that fits it: a closed port (is etcd up?), an HTTP server (not
/// etcd's client URL), a name that does not resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govd_says_what_is_wrong_with_an_endpoint_that_is_not_etcd() {
    let closed = free_port();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_port = http.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut conn, _)) = http.accept().await {
            let mut buf = [0_u8; 1024];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
            // Kept open, as an HTTP/1.1 server keeps it, until govd closes it.
            tokio::spawn(async move { while conn.read(&mut buf).await.is_ok_and(|n| n > 0) {} });
        }
    });
    for (case, store, cause, help) in [
        (
            "a closed port",
            format!("etcd://127.0.0.1:{closed}"),
            "Connection refused",
            "majority of the etcd members",
        ),
        (
            "an HTTP server",
            format!("etcd://127.0.0.1:{http_port}"),
            // h2 reads the HTTP/1.1 answer as a frame (`h2 protocol error`)
            // or first sees the request end (`connection closed`).
            "failed to answer",
            "names the members' client URLs",
        ),
        (
            "a name that does not resolve",
            "etcd://no-such-host.invalid:2379".to_owned(),
            "dns error",
            "does not resolve",
        ),
    ] {
        let out = tokio::time::timeout(
            Duration::from_secs(40),
            Command::new(env!("CARGO_BIN_EXE_govd"))
                .args(["--listen", "127.0.0.1:0", "--insecure", "--store", &store])
                .env_remove("GOV_TOKEN_FILE")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{case}: govd neither started nor stopped in 40 s"))
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{case}: {stderr}");
        assert!(stderr.contains(cause), "{case}: {stderr}");
        let help_line = stderr.lines().find(|l| l.contains("help:")).unwrap_or("");
        assert!(help_line.contains(help), "{case}: {stderr}");
        // Each cause once: tonic's chain repeats `transport error`,
        // `tcp connect error`, `dns error` between the status and the OS error.
        let causes: Vec<&str> = stderr
            .lines()
            .filter_map(|l| l.trim().strip_prefix("caused by: "))
            .collect();
        assert!(!causes.contains(&"transport error"), "{case}: {stderr}");
        for (i, c) in causes.iter().enumerate() {
            assert!(
                !causes[..i].iter().any(|earlier| earlier.contains(c)),
                "{case}: `{c}` said twice: {stderr}"
            );
        }
    }
    server.abort();
}

/// The flags' mistakes are named before any connection.
#[tokio::test]
async fn tls_flags_that_cannot_work_stop_govd_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "etcd-ca");
    let ca = pki.ca();
    let ca = ca.to_str().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let not_pem = not_pem.to_str().unwrap();
    // An X.509 v1 client certificate, as `openssl x509 -req` makes without -extfile.
    let (v1_cert, v1_key) = (
        dir.path().join("v1.pem").display().to_string(),
        dir.path().join("v1.key").display().to_string(),
    );
    let openssl = |args: &str| {
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("openssl {args}"))
            .current_dir(dir.path())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "openssl {args}");
    };
    openssl(
        "req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=govd -keyout v1.key -out v1.csr",
    );
    openssl(&format!(
        "x509 -req -in v1.csr -CA '{ca}' -CAkey '{}' -CAcreateserial -days 1 -out v1.pem",
        pki.key().display()
    ));
    for (args, code, says) in [
        (
            vec!["--store", "etcds://127.0.0.1:1"],
            1,
            "`etcds://` needs --etcd-ca",
        ),
        (
            vec!["--store", "etcd://127.0.0.1:1", "--etcd-ca", ca],
            1,
            "are for `etcds://`",
        ),
        (
            vec!["--store", "etcds://127.0.0.1:1", "--etcd-ca", not_pem],
            1,
            "not PEM",
        ),
        (
            vec![
                "--store",
                "etcds://127.0.0.1:1",
                "--etcd-ca",
                ca,
                "--etcd-key",
                ca,
            ],
            1,
            "go together",
        ),
        (
            vec![
                "--store",
                "etcds://127.0.0.1:1",
                "--etcd-ca",
                ca,
                "--etcd-cert",
                &v1_cert,
                "--etcd-key",
                &v1_key,
            ],
            1,
            "is X.509 v1: rustls takes v3 only",
        ),
        (vec!["--etcd-ca", ca], 64, "need --store etcd://"),
    ] {
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            Command::new(env!("CARGO_BIN_EXE_govd"))
                .args(["--listen", "127.0.0.1:0", "--insecure"])
                .args(&args)
                .env_remove("GOV_TOKEN_FILE")
                .current_dir(dir.path())
                .output(),
        )
        .await
        .expect("govd must exit, not serve")
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
