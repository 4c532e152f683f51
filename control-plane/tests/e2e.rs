//! End-to-end: the real `govd`, `gov-agent` and `govc` binaries on loopback,
//! with a real hyper upstream, driven through builders that read like the
//! scenarios of issue 5.
//!
//! `govd` is this package's binary; `gov-agent` and `govc` belong to other
//! packages, so they are taken from the target directory next to this test
//! (`cargo test --workspace` builds them first). Alone:
//!
//! ```text
//! cargo build -j2 -p gov-agent -p govc && cargo test -j2 -p gov-control-plane --test e2e
//! ```
//!
//! The NACK scenario uses a genuinely unsupported setup, not a test hook: the
//! agents run without a shared counter store (no Redis configured), so the
//! engine refuses a config with a `scope cluster` limit, naming the rule.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gov_proto::v1 as pb;
use http_body_util::Full;
use hyper::body::Bytes;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

/// The admin token (named `e2e`), the operator's and the viewer's.
const TOKEN: &str = "e2e-admin-token";
const OPERATOR_TOKEN: &str = "e2e-operator-token";
const VIEWER_TOKEN: &str = "e2e-viewer-token";
/// govd's token file: one `name token role` line each.
const TOKEN_FILE: &str = "# the e2e tests' people\ne2e e2e-admin-token admin\noncall e2e-operator-token operator\nboard e2e-viewer-token viewer\n# and agents, one token per service\norder-agents e2e-agent-order agent order\npayment-agents e2e-agent-payment agent payment\ninv-agents e2e-agent-inv agent inv\nweb-agents e2e-agent-web agent web\nshop-agents e2e-agent-shop agent order,payment\n";
/// The `--agent-token-file` token (any service).
const AGENT_TOKEN: &str = "e2e-agent-token";

/// The token of `TOKEN_FILE`'s `agent` line for `service`.
fn service_agent_token(service: &str) -> String {
    format!("e2e-agent-{service}")
}

#[path = "e2e/agent_identity.rs"]
mod agent_identity;
#[path = "e2e/canary.rs"]
mod canary;
#[path = "e2e/chaos.rs"]
mod chaos;
#[path = "e2e/day2.rs"]
mod day2;
#[path = "e2e/expiry.rs"]
mod expiry;
#[path = "e2e/failover.rs"]
mod failover;
#[path = "e2e/floods.rs"]
mod floods;
#[path = "e2e/identity.rs"]
mod identity;
#[path = "e2e/mtls.rs"]
mod mtls;
#[path = "e2e/replicas.rs"]
mod replicas;
#[path = "e2e/tls_stores.rs"]
mod tls_stores;
#[path = "e2e/unsaved.rs"]
mod unsaved;
#[path = "e2e/warmup.rs"]
mod warmup;

// === policies ===

/// order: a bulkhead of 2 on /slow, a manual fuse on /fail (3 errors), a
/// limit of 3 calls per minute on /burst that latches for 2h; payment: one
/// wide bulkhead.
const V1: &str = r#"service order {
  match slow = path prefix "/slow"
  match failing = path prefix "/fail"
  match burst = path prefix "/burst"

  bulkhead slow_calls on slow {
    max_concurrent 2
  }

  fuse errors on failing {
    trip when errors >= 3 over 10s
    recover manual
  }

  limit bursty on burst {
    calls 3 per 1m
    release after 2h
  }
}

service payment {
  match all = path prefix "/"
  bulkhead pay on all {
    max_concurrent 50
  }
}
"#;

/// V1 with the order bulkhead raised to 4; payment unchanged.
fn v2() -> String {
    V1.replacen("max_concurrent 2", "max_concurrent 4", 1)
}

/// V2 plus a `scope cluster` limit, which agents cannot enforce.
fn cluster_limit() -> String {
    v2().replacen(
        "  limit bursty on burst {",
        "  limit shared on slow {\n    calls 100 per 1s\n    scope cluster sync exact\n  }\n\n  limit bursty on burst {",
        1,
    )
}

/// Refers to a match that does not exist.
const INVALID: &str = r#"service order {
  bulkhead slow_calls on slwo {
    max_concurrent 1
  }
}
"#;

// === binaries ===

fn target_dir() -> PathBuf {
    // .../target/debug/deps/e2e-HASH -> .../target/debug
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn binary(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "`{}` is missing: build it first with `cargo build -j2 -p gov-agent -p govc` \
         (cargo test --workspace does it)",
        path.display()
    );
    path
}

fn govd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_govd"))
}

/// Polls `f` every 50ms until it is true or `timeout` passes.
async fn wait_until(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Reads `key=VALUE` from the first log line containing `marker`.
async fn log_field(log: &Path, marker: &str, key: &str) -> SocketAddr {
    let mut found = None;
    wait_until(
        &format!("`{marker}` in {}", log.display()),
        Duration::from_secs(15),
        async || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            found = text.lines().find(|l| l.contains(marker)).and_then(|l| {
                let start = l.find(&format!("{key}="))? + key.len() + 1;
                l[start..].split_whitespace().next()?.parse().ok()
            });
            found.is_some()
        },
    )
    .await;
    found.unwrap()
}

// === govd ===

struct ControlPlaneBuilder {
    state_dir: PathBuf,
    /// `--store URL` instead of `--state-dir` (logs still go beside `state_dir`).
    store: Option<String>,
    token: bool,
    agent_token: bool,
    metrics: bool,
    tls: Option<Pki>,
    args: Vec<String>,
}

fn control_plane(state_dir: &Path) -> ControlPlaneBuilder {
    ControlPlaneBuilder {
        state_dir: state_dir.to_owned(),
        store: None,
        token: true,
        agent_token: false,
        metrics: false,
        tls: None,
        args: Vec::new(),
    }
}

struct Govd {
    child: Child,
    addr: SocketAddr,
    /// With [`ControlPlaneBuilder::metrics`].
    metrics: Option<SocketAddr>,
    log: PathBuf,
    /// With TLS: the CA that signed govd's certificate.
    ca: Option<PathBuf>,
}

impl ControlPlaneBuilder {
    /// Agents must present `AGENT_TOKEN`.
    fn agent_token(mut self) -> Self {
        self.agent_token = true;
        self
    }

    /// A metrics listener (`--metrics-listen 127.0.0.1:0`).
    fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// More flags.
    fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// TLS with `pki`'s server certificate, and mutual TLS for agents with
    /// its CA.
    fn tls(mut self, pki: &Pki) -> Self {
        self.tls = Some(pki.clone());
        self
    }

    /// Starts `govd` on `127.0.0.1:0` (or on `port`, for a restart).
    async fn start_on(self, port: u16) -> Govd {
        let log = self
            .state_dir
            .with_extension(format!("govd-{}.log", rand_suffix()));
        let mut cmd = Command::new(govd_bin());
        cmd.arg("--listen").arg(format!("127.0.0.1:{port}"));
        match &self.store {
            Some(url) => cmd.args(["--store", url]),
            None => cmd.arg("--state-dir").arg(&self.state_dir),
        };
        cmd.arg("--drain-timeout")
            .arg("2s")
            .env("GOV_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        if self.token {
            let token_file = self.state_dir.with_extension("token");
            std::fs::write(&token_file, TOKEN_FILE).unwrap();
            cmd.arg("--token-file").arg(token_file);
        } else {
            cmd.arg("--insecure");
        }
        if self.agent_token {
            let token_file = self.state_dir.with_extension("agent-token");
            std::fs::write(&token_file, format!("{AGENT_TOKEN}\n")).unwrap();
            cmd.arg("--agent-token-file").arg(token_file);
        }
        cmd.args(&self.args);
        if let Some(pki) = &self.tls {
            cmd.arg("--tls-cert")
                .arg(&pki.server_cert)
                .arg("--tls-key")
                .arg(&pki.server_key)
                .arg("--tls-client-ca")
                .arg(&pki.ca);
        }
        if self.metrics {
            cmd.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        let child = cmd.spawn().unwrap();
        let addr = log_field(&log, "govd started", "listen").await;
        let metrics = if self.metrics {
            Some(log_field(&log, "govd started", "metrics").await)
        } else {
            None
        };
        let ca = self.tls.map(|pki| pki.ca);
        Govd {
            child,
            addr,
            metrics,
            log,
            ca,
        }
    }

    async fn start(self) -> Govd {
        self.start_on(0).await
    }
}

impl Govd {
    fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    async fn client(
        &self,
    ) -> pb::control_plane_client::ControlPlaneClient<tonic::transport::Channel> {
        let tls = gov_proto::tls::ClientTls::read(&gov_proto::tls::ClientTlsFiles {
            ca: self.ca.clone(),
            ..Default::default()
        })
        .unwrap();
        gov_control_plane::client::connect_tls(&self.url(), &tls, Duration::from_secs(5))
            .await
            .unwrap()
    }

    async fn status(&self) -> pb::ClusterView {
        self.client()
            .await
            .status(as_viewer(pb::StatusRequest::default()))
            .await
            .unwrap()
            .into_inner()
    }

    /// SIGKILL: no flush, no goodbye (the harshest restart).
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM and wait (bounded) for a clean exit.
    async fn stop(self) {
        self.stop_within(Duration::from_secs(10)).await;
    }

    /// SIGTERM and wait at most `bound` for a clean exit (a large state takes
    /// a debug build longer to write).
    async fn stop_within(mut self, bound: Duration) {
        signal(&self.child, rustix::process::Signal::TERM);
        let Ok(status) = tokio::time::timeout(bound, self.child.wait()).await else {
            panic!(
                "govd did not stop within {bound:?} of SIGTERM; log:\n{}",
                read(&self.log)
            );
        };
        let status = status.unwrap();
        assert!(
            status.success(),
            "govd exited with {status}; log:\n{}",
            read(&self.log)
        );
    }
}

/// `message` with the viewer's token (reads need one).
fn as_viewer<T>(message: T) -> tonic::Request<T> {
    as_token(VIEWER_TOKEN, message)
}

/// `message` with `token`.
fn as_token<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    gov_control_plane::auth::authorize(&mut request, token).unwrap();
    request
}

/// Sends `sig` with kill(2) (no `kill` binary needed).
fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), sig).unwrap();
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

// === gov-agent ===

struct AgentBuilder {
    service: String,
    instance: String,
    upstream: SocketAddr,
    control_plane: String,
    state_dir: Option<PathBuf>,
    token: AgentToken,
    outbound: bool,
    args: Vec<std::ffi::OsString>,
}

fn agent(service: &str, instance: &str) -> AgentBuilder {
    AgentBuilder {
        service: service.into(),
        instance: instance.into(),
        upstream: SocketAddr::from(([127, 0, 0, 1], 1)),
        control_plane: String::new(),
        state_dir: None,
        token: AgentToken::Service,
        outbound: false,
        args: Vec::new(),
    }
}

/// What an agent presents to govd.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AgentToken {
    /// Its service's token (`TOKEN_FILE`'s `agent` line).
    Service,
    /// The `--agent-token-file` token ([`ControlPlaneBuilder::agent_token`]).
    Shared,
    None,
}

struct Agent {
    child: Child,
    inbound: SocketAddr,
    admin: SocketAddr,
    /// With [`AgentBuilder::outbound`].
    outbound: Option<SocketAddr>,
    log: PathBuf,
}

impl AgentBuilder {
    fn upstream(mut self, addr: SocketAddr) -> Self {
        self.upstream = addr;
        self
    }
    /// TLS to govd with `pki`'s CA and the certificate `cert` (a name from
    /// [`Pki::agent`]).
    fn tls(mut self, pki: &Pki, cert: Option<&(PathBuf, PathBuf)>) -> Self {
        self.args.push("--tls-ca".into());
        self.args.push(pki.ca.clone().into());
        if let Some((cert, key)) = cert {
            self.args.push("--tls-cert".into());
            self.args.push(cert.clone().into());
            self.args.push("--tls-key".into());
            self.args.push(key.clone().into());
        }
        self
    }
    fn control_plane(self, govd: &Govd) -> Self {
        self.control_plane_url(govd.url())
    }
    fn control_plane_url(mut self, url: String) -> Self {
        self.control_plane = url;
        self
    }
    /// The `--agent-token-file` token instead of its service's.
    fn token(mut self) -> Self {
        self.token = AgentToken::Shared;
        self
    }
    /// No token at all.
    fn no_token(mut self) -> Self {
        self.token = AgentToken::None;
        self
    }
    fn state_dir(mut self, dir: &Path) -> Self {
        self.state_dir = Some(dir.to_owned());
        self
    }
    /// Also an outbound listener (no `--instances`: govd says where calls go).
    fn outbound(mut self) -> Self {
        self.outbound = true;
        self
    }
    async fn start(self, logs: &Path) -> Agent {
        let log = logs.join(format!("agent-{}-{}.log", self.instance, rand_suffix()));
        let mut cmd = Command::new(binary("gov-agent"));
        cmd.args(["--service", &self.service, "--instance", &self.instance])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .arg("--upstream")
            .arg(self.upstream.to_string())
            .arg("--control-plane")
            .arg(&self.control_plane)
            .args(["--drain-timeout", "1s"])
            .env("GOV_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        let token = match self.token {
            AgentToken::Service => Some(service_agent_token(&self.service)),
            AgentToken::Shared => Some(AGENT_TOKEN.to_owned()),
            AgentToken::None => None,
        };
        if let Some(token) = token {
            let token_file = logs.join(format!("agent-token-{}", rand_suffix()));
            std::fs::write(&token_file, token).unwrap();
            cmd.arg("--control-plane-token-file").arg(token_file);
        }
        if let Some(dir) = &self.state_dir {
            cmd.arg("--state-dir").arg(dir);
        }
        if self.outbound {
            cmd.args(["--outbound-listen", "127.0.0.1:0"]);
        }
        cmd.args(&self.args);
        let child = cmd.spawn().unwrap();
        let inbound = log_field(&log, "gov-agent started", "inbound").await;
        let admin = log_field(&log, "gov-agent started", "admin").await;
        let outbound = if self.outbound {
            Some(log_field(&log, "gov-agent started", "outbound").await)
        } else {
            None
        };
        Agent {
            child,
            inbound,
            admin,
            outbound,
            log,
        }
    }
}

impl Agent {
    /// Configs applied since start, from `/metrics`.
    async fn configs_applied(&self) -> u64 {
        let (_, _, body) = http_get(self.admin, "/metrics").await;
        body.lines()
            .find(|l| l.starts_with("gov_agent_config_reloads_total{result=\"applied\"}"))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(0)
    }

    async fn stop(mut self) {
        signal(&self.child, rustix::process::Signal::TERM);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    /// SIGKILL (`kill -9`): no shutdown step runs.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

// === the upstream: a real hyper server ===

/// An upstream whose every path answers 500, counting the calls that reach it.
async fn failing_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |_req: hyper::Request<hyper::body::Incoming>| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(500)
                                    .body(Full::new(Bytes::from_static(b"failing")))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, calls)
}

/// `/slow*` answers after 1.5s, `/fail*` with 500, everything else 200 at once.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let path = req.uri().path().to_owned();
                        if path.starts_with("/slow") {
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                        }
                        let status = if path.starts_with("/fail") { 500 } else { 200 };
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::from_static(b"upstream")))
                                .unwrap(),
                        )
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    addr
}

/// An upstream whose every answer is 200 with `name` as the body.
async fn named_upstream(name: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| async move {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(name.as_bytes()),
                    )))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    addr
}

/// An upstream named `name` whose `/ready` answers 503 until `ready` is set;
/// `served` counts the other requests.
async fn gated_upstream(
    name: &'static str,
) -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let (r, s) = (ready.clone(), served.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (r, s) = (r.clone(), s.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (r, s) = (r.clone(), s.clone());
                        async move {
                            let status = if req.uri().path() == "/ready" {
                                if r.load(Ordering::SeqCst) { 200 } else { 503 }
                            } else {
                                s.fetch_add(1, Ordering::SeqCst);
                                200
                            };
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from_static(name.as_bytes())))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, ready, served)
}

/// One GET through an agent's outbound listener to `service`: (status, body).
async fn call(outbound: SocketAddr, service: &str) -> (u16, String) {
    call_with(outbound, service, "/x", "").await
}

/// One GET of `path` through an agent's outbound listener to `service`,
/// with `headers` (whole `name: value\r\n` lines): (status, body); `(0, "")`
/// when no answer came within 10 s.
async fn call_with(
    outbound: SocketAddr,
    service: &str,
    path: &str,
    headers: &str,
) -> (u16, String) {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(outbound).await.ok()?;
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: {service}\r\n{headers}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or((0, String::new()))
}

/// Applies to `govd` a policy of `inv` (its body as given) and a plain `web`.
async fn apply_inv_and_web(govd: &Govd, dir: &Path, inv: &str) {
    let text = format!("service inv {{\n{inv}}}\nservice web {{\n  capacity workers 10\n}}\n");
    let policy = write(dir, "p.gov", &text);
    let applied = govc(govd, Some(TOKEN), &["apply", &policy]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
}

/// An instance `inv-NAME` of `inv` whose upstream answers `NAME`.
async fn inv_instance(govd: &Govd, dir: &Path, name: &'static str) -> Agent {
    agent("inv", &format!("inv-{name}"))
        .upstream(named_upstream(name).await)
        .control_plane(govd)
        .start(dir)
        .await
}

/// The instances of `inv` (by their answer) `caller` reaches, calling until it
/// has seen `want` of them, for at most 60 s. The bound is time, not a count of
/// calls: an instance is reached once its agent has connected, registered and
/// govd's push has been acknowledged by the caller, which on a busy machine can
/// take longer than a few hundred calls (the count this used to have).
async fn reached(caller: SocketAddr, want: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut seen = std::collections::BTreeSet::new();
    loop {
        if let (200, body) = call(caller, "inv").await {
            seen.insert(body);
        }
        if seen.len() >= want || std::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen.into_iter().collect()
}

/// 300 calls to `inv` through `caller`, 5 ms apart, in the background: the
/// ones that failed.
fn load_through(caller: SocketAddr) -> tokio::task::JoinHandle<Vec<(u16, String)>> {
    tokio::spawn(async move {
        let mut failed = Vec::new();
        for _ in 0..300 {
            let (status, body) = call(caller, "inv").await;
            if status != 200 {
                failed.push((status, body));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        failed
    })
}

/// One HTTP/1.1 GET: (status, `gov-rejected-by` header, body).
async fn http_get(addr: SocketAddr, path: &str) -> (u16, Option<String>, String) {
    http_get_with(addr, path, "").await
}

/// [`http_get`] as `consumer` (the `x-gov-consumer` header).
async fn http_get_as(
    addr: SocketAddr,
    path: &str,
    consumer: &str,
) -> (u16, Option<String>, String) {
    http_get_with(addr, path, &format!("x-gov-consumer: {consumer}\r\n")).await
}

/// [`http_get`] with `headers` (whole `name: value\r\n` lines).
async fn http_get_with(
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> (u16, Option<String>, String) {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let rejected = head.lines().find_map(|l| {
            l.strip_prefix("gov-rejected-by:")
                .map(|v| v.trim().to_owned())
        });
        Some((status, rejected, body.to_owned()))
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Some(r)) => r,
        _ => (0, None, String::new()),
    }
}

/// `n` concurrent GETs of `/slow` through `agent`: how many got through
/// and how many the bulkhead rejected (408 by `order/slow_calls`).
async fn slow_burst(agent: SocketAddr, n: usize) -> (usize, usize) {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(http_get(
                agent,
                Box::leak(format!("/slow/{i}").into_boxed_str()),
            ))
        })
        .collect();
    let (mut ok, mut rejected) = (0, 0);
    for c in calls {
        match c.await.unwrap() {
            (200, None, _) => ok += 1,
            (408, Some(rule), _) if rule == "order/slow_calls" => rejected += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    (ok, rejected)
}

// === govc ===

struct Govc {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn govc(govd: &Govd, token: Option<&str>, args: &[&str]) -> Govc {
    let mut cmd = Command::new(binary("govc"));
    // Not a terminal: an apply needs `--auto-approve`.
    let approve = (args.first() == Some(&"apply")).then_some("--auto-approve");
    cmd.args(args.first())
        .args(approve)
        .args(args.iter().skip(1))
        .env("GOV_CONTROL_PLANE", govd.url())
        .env("NO_COLOR", "1")
        .env("USER", "e2e")
        .env_remove("GOV_TOKEN");
    if let Some(t) = token {
        cmd.env("GOV_TOKEN", t);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .unwrap()
        .unwrap();
    Govc {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn agent_state(view: &pb::ClusterView, instance: &str) -> pb::AgentView {
    view.agents
        .iter()
        .find(|a| a.instance == instance)
        .cloned()
        .unwrap_or_else(|| panic!("no agent {instance} in {view:?}"))
}

async fn all_synced(govd: &Govd, instances: &[&str]) -> bool {
    let view = govd.status().await;
    instances.iter().all(|i| {
        view.agents
            .iter()
            .any(|a| a.instance == *i && a.state() == pb::SyncState::Synced)
    })
}

// === scenarios ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_reaches_every_agent_of_the_changed_service_and_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let up = upstream().await;
    let order1 = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let order2 = agent("order", "order-2")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let pay = agent("payment", "payment-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until(
        "three agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 3,
    )
    .await;

    // Without the token, nothing is applied.
    let v1 = write(dir.path(), "v1.gov", V1);
    let refused = govc(&govd, None, &["apply", &v1]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("token"), "{}", refused.stderr);
    assert_eq!(govd.status().await.version, "");

    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(
        applied.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        applied.stdout, applied.stderr
    );
    assert!(
        applied.stdout.contains("+ service order"),
        "{}",
        applied.stdout
    );
    assert_eq!(
        applied.stdout.matches("SYNCED").count(),
        3,
        "{}",
        applied.stdout
    );
    // 2 in flight at most on each order agent: 4 of 6 concurrent slow calls are shed.
    assert_eq!(slow_burst(order1.inbound, 6).await, (2, 4));
    assert_eq!(slow_burst(order2.inbound, 6).await, (2, 4));
    assert_eq!(pay.configs_applied().await, 1);

    // The TUI's stream: one view at once, then one per change.
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let mut watch = client
        .watch(as_viewer(pb::WatchRequest {
            service: "order".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(
        first.agents.iter().all(|a| a.service == "order") && first.agents.len() == 2,
        "{first:?}"
    );

    // V2 changes only order: both order agents enforce 4, payment gets nothing.
    let v2 = write(dir.path(), "v2.gov", &v2());
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v2]).await;
    assert_eq!(
        applied.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        applied.stdout, applied.stderr
    );
    assert!(
        applied.stdout.contains("~ service order"),
        "{}",
        applied.stdout
    );
    assert!(
        !applied.stdout.contains("payment"),
        "payment is unchanged:\n{}",
        applied.stdout
    );
    assert_eq!(
        applied.stdout.matches("SYNCED").count(),
        2,
        "{}",
        applied.stdout
    );
    assert!(all_synced(&govd, &["order-1", "order-2", "payment-1"]).await);
    assert_eq!(slow_burst(order1.inbound, 6).await, (4, 2));
    assert_eq!(slow_burst(order2.inbound, 6).await, (4, 2));
    assert_eq!(
        pay.configs_applied().await,
        1,
        "the payment agent must receive nothing"
    );
    let version = govd.status().await.version;
    let watched = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let view = watch.message().await.unwrap().unwrap();
            if view.version == version {
                return view;
            }
        }
    })
    .await
    .expect("the watch stream shows the new version");
    assert!(
        watched.rules.iter().any(|r| r.rule == "order/slow_calls"),
        "{watched:?}"
    );
    assert!(
        watched.rules.iter().all(|r| r.rule.starts_with("order/")),
        "{watched:?}"
    );

    // An invalid policy is refused with the diagnostics; nothing changes.
    let bad = write(dir.path(), "bad.gov", INVALID);
    let refused = govc(&govd, Some(TOKEN), &["apply", &bad]).await;
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("gov::unknown-match"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("bad.gov:2:"), "{}", refused.stderr);
    assert!(refused.stderr.contains("slwo"), "{}", refused.stderr);
    assert_eq!(govd.status().await.version, version);
    assert_eq!(slow_burst(order1.inbound, 6).await, (4, 2));
    assert_eq!(order1.configs_applied().await, 2);

    // `govc plan` against the live control plane costs a compile and shows
    // the policy in force: it needs the token like an apply.
    let plan = govc(&govd, None, &["plan", "--detailed-exitcode", &v2]).await;
    assert_eq!(plan.code, 1, "{}{}", plan.stdout, plan.stderr);
    assert!(
        flat(&plan.stderr).contains("needs a token with the admin role"),
        "{}",
        plan.stderr
    );
    // No change for V2.
    let plan = govc(&govd, Some(TOKEN), &["plan", "--detailed-exitcode", &v2]).await;
    assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
    let plan = govc(&govd, Some(TOKEN), &["plan", "--detailed-exitcode", &v1]).await;
    assert_eq!(plan.code, 2, "{}{}", plan.stdout, plan.stderr);
    assert!(
        plan.stdout.contains("max_concurrent 4 -> 2"),
        "{}",
        plan.stdout
    );

    // The audit log says who applied what.
    let audit = read(&dir.path().join("state").join("audit.jsonl"));
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"action\":\"apply\""))
            .count(),
        2,
        "{audit}"
    );
    assert!(audit.contains("\"who\":\"e2e\""), "{audit}");

    for a in [order1, order2, pay] {
        a.stop().await;
    }
    govd.stop().await;
    // The watch stream ends when govd drains.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = watch.message().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch stream must end when govd stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_the_agent_cannot_enforce_is_nacked_by_rule_and_the_old_one_stays() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .agent_token()
        .start()
        .await;
    let up = upstream().await;
    // Without the agent token, an agent is refused (and keeps retrying).
    let intruder = agent("order", "intruder")
        .upstream(up)
        .control_plane(&govd)
        .no_token()
        .start(dir.path())
        .await;
    wait_until(
        "the intruder refused",
        Duration::from_secs(10),
        // Said as what it is, with what to check (not "unavailable").
        async || read(&intruder.log).contains("the control plane refused this agent's credentials"),
    )
    .await;
    intruder.stop().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .token()
        .start(dir.path())
        .await;
    wait_until("the agent connected", Duration::from_secs(10), async || {
        govd.status().await.agents.len() == 1
    })
    .await;
    assert_eq!(
        agent_state(&govd.status().await, "order-1").instance,
        "order-1"
    );

    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    let good = agent_state(&govd.status().await, "order-1").last_good_version;

    let bad = write(dir.path(), "cluster.gov", &cluster_limit());
    let nacked = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &bad]).await;
    assert_eq!(
        nacked.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        nacked.stdout, nacked.stderr
    );
    assert!(nacked.stdout.contains("NACKED"), "{}", nacked.stdout);
    assert!(
        // The rule once, as the agent's reason names it (not "rule x: rule `x`").
        nacked.stdout.contains("NACKED  ")
            && nacked
                .stdout
                .contains("rule `order/shared`: `scope cluster`")
            && !nacked.stdout.contains("rule order/shared: rule"),
        "{}",
        nacked.stdout
    );
    assert!(nacked.stdout.contains("scope cluster"), "{}", nacked.stdout);
    assert!(
        nacked.stderr.contains("refused the config"),
        "{}",
        nacked.stderr
    );

    // Never reported as applied (istio#30498): NACKED, still on the old version.
    let view = govd.status().await;
    let a = agent_state(&view, "order-1");
    assert_eq!(a.state(), pb::SyncState::Nacked);
    assert_eq!(a.rule, "order/shared");
    assert_eq!(a.last_good_version, good);
    // ...and the agent still enforces V1's bulkhead of 2.
    assert_eq!(slow_burst(order.inbound, 6).await, (2, 4));
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(status.stdout.contains("NACKED"), "{}", status.stdout);
    assert!(
        status.stdout.contains("rule order/shared: "),
        "{}",
        status.stdout
    );
    assert!(status.stdout.contains("scope cluster"), "{}", status.stdout);

    order.stop().await;
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_restarts_of_govd_and_of_agents_while_govd_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let up = upstream().await;
    let a_dir = dir.path().join("agent-a");
    let a = agent("order", "order-a")
        .upstream(up)
        .control_plane(&govd)
        .state_dir(&a_dir)
        .start(dir.path())
        .await;
    let b = agent("order", "order-b")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until(
        "two agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 2,
    )
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(
        govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1])
            .await
            .code,
        0
    );
    let version = govd.status().await.version;

    // Trip the fuse and engage the limit on agent b.
    for _ in 0..3 {
        assert_eq!(http_get(b.inbound, "/fail").await.0, 500);
    }
    let tripped = http_get(b.inbound, "/fail").await;
    assert_eq!(
        (tripped.0, tripped.1.as_deref()),
        (503, Some("order/errors"))
    );
    for _ in 0..3 {
        assert_eq!(http_get(b.inbound, "/burst").await.0, 200);
    }
    assert_eq!(http_get(b.inbound, "/burst").await.0, 429);
    wait_until(
        "fuse and limit recorded",
        Duration::from_secs(10),
        async || {
            let v = govd.status().await;
            v.fuses.len() == 1 && v.limits.len() == 1
        },
    )
    .await;
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(
        status.stdout.contains("order/errors  OPEN"),
        "{}",
        status.stdout
    );
    // A filter naming no known service is an error, not an empty table.
    let unknown = govc(&govd, Some(VIEWER_TOKEN), &["status", "-s", "nosuch"]).await;
    assert_eq!(unknown.code, 1, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("govd knows no service `nosuch`"),
        "{}",
        unknown.stderr
    );
    let known = govc(&govd, Some(VIEWER_TOKEN), &["status", "-s", "order"]).await;
    assert_eq!(known.code, 0, "{}", known.stderr);
    assert!(
        status.stdout.contains("manual (govc release fuse)"),
        "{}",
        status.stdout
    );
    // govd shows a trip as soon as it holds it, and writes it (audit, then
    // its latch's file) right after: a crash in between loses nothing the agents
    // enforce (they report the latch again), but the limit's release would
    // count from the report after the restart. This test is about what was
    // written, so it kills govd only once both trips are on disk.
    wait_until("both trips written", Duration::from_secs(10), async || {
        gov_control_plane::store::DirStore::open(&state)
            .and_then(|s| s.load())
            .is_ok_and(|p| p.trips.len() == 2)
    })
    .await;
    let before = govd.status().await;
    let remaining_before = before.limits[0].remaining_ms;
    assert!(
        remaining_before > 7_100_000 && remaining_before <= 7_200_000,
        "{remaining_before}"
    );

    // govd dies hard; the agents keep enforcing.
    govd.kill().await;
    assert_eq!(slow_burst(a.inbound, 6).await, (2, 4));
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);

    // Agent a restarts while govd is down: it enforces its last good config from disk.
    a.stop().await;
    let a = agent("order", "order-a")
        .upstream(up)
        .control_plane_url(format!("http://127.0.0.1:{port}"))
        .state_dir(&a_dir)
        .start(dir.path())
        .await;
    wait_until(
        "agent a loaded its config from disk",
        Duration::from_secs(10),
        async || read(&a.log).contains("enforcing the last good config from disk"),
    )
    .await;
    assert_eq!(slow_burst(a.inbound, 6).await, (2, 4));

    // govd comes back on the same port: agents reconnect, state is as before.
    let govd = control_plane(&state).start_on(port).await;
    wait_until(
        "both agents reconnected and synced",
        Duration::from_secs(40),
        async || all_synced(&govd, &["order-a", "order-b"]).await,
    )
    .await;
    let after = govd.status().await;
    assert_eq!(after.version, version);
    assert_eq!(after.fuses.len(), 1, "{after:?}");
    assert_eq!(after.fuses[0].since_unix_ms, before.fuses[0].since_unix_ms);
    assert_eq!(after.limits.len(), 1, "{after:?}");
    let remaining_after = after.limits[0].remaining_ms;
    assert!(
        remaining_after < remaining_before && remaining_after > 7_000_000,
        "{remaining_before} -> {remaining_after}"
    );
    // One apply (its intent and its outcome), and the trip of the fuse and
    // of the limit (each once, across the restart).
    let audit = read(&state.join("audit.jsonl"));
    let count = |action: &str| {
        audit
            .lines()
            .filter(|l| l.contains(&format!("\"action\":\"{action}\"")))
            .count()
    };
    assert_eq!(
        (count("apply-intended"), count("apply"), count("trip")),
        (1, 1, 2),
        "{audit}"
    );
    assert_eq!(audit.lines().count(), 4, "{audit}");

    // Release: refused without the token, then traffic flows again on every agent.
    let refused = govc(&govd, None, &["release", "fuse", "order/errors"]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);
    let released = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(
        released
            .stdout
            .contains("released fuse `order/errors` on 2 agent(s)"),
        "{}",
        released.stdout
    );
    wait_until(
        "the fuse admits again",
        Duration::from_secs(5),
        async || http_get(b.inbound, "/fail").await.0 == 500,
    )
    .await;
    let released = govc(&govd, Some(TOKEN), &["release", "limit", "order/bursty"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    // The latch is gone (the calls-per-minute window itself still counts): the
    // agents' next stats (every second) would put it back if it were still engaged.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = govd.status().await;
    assert!(view.fuses.is_empty() && view.limits.is_empty(), "{view:?}");
    let audit = read(&state.join("audit.jsonl"));
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"action\":\"release\""))
            .count(),
        2,
        "{audit}"
    );
    // And each release's intent.
    assert_eq!(audit.lines().count(), 8, "{audit}");
    assert!(audit.contains("\"rule\":\"order/errors\""), "{audit}");

    a.stop().await;
    b.stop().await;
    govd.stop().await;
}

/// The state directory made read-only for as long as it lives: by
/// permissions, or (for root, whom permissions do not stop) by the
/// immutable attribute, or, where neither is available, by making govd's
/// temp files of the parts an apply and a release of `order/errors` write
/// first (`policy.json`, its release) impossible to create. Restored on drop.
struct ReadOnly {
    dir: PathBuf,
    immutable: bool,
    blockers: Vec<PathBuf>,
}

impl ReadOnly {
    fn new(dir: &Path, govd: &Govd) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        let mut guard = ReadOnly {
            dir: dir.to_owned(),
            immutable: false,
            blockers: Vec::new(),
        };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        if Self::writable(dir) {
            guard.immutable = std::process::Command::new("chattr")
                .arg("+i")
                .arg(dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        }
        if Self::writable(dir) {
            let release = gov_control_plane::store::parts::release_part(
                gov_control_plane::store::TripKind::Fuse,
                "order/errors",
                "",
            );
            for part in ["policy.json", release.as_str()] {
                let blocker = dir.join(format!(".{part}.tmp.{}", govd.child.id().unwrap()));
                std::fs::create_dir(&blocker).unwrap();
                guard.blockers.push(blocker);
            }
        }
        guard
    }

    fn writable(dir: &Path) -> bool {
        let probe = dir.join(".probe");
        let ok = std::fs::write(&probe, b"x").is_ok();
        let _ = std::fs::remove_file(&probe);
        ok
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt as _;
        if self.immutable {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(&self.dir)
                .status();
        }
        let _ = std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755));
        for b in &self.blockers {
            let _ = std::fs::remove_dir(b);
        }
    }
}

/// An agent restarted with a last good config written by an older release (one
/// repeated field per rule kind, before `rules`) does not crash: it says the file
/// cannot be read, starts without it, and enforces what govd sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_good_config_of_an_older_release_is_reported_and_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    let a_dir = dir.path().join("agent-a");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::write(
        a_dir.join("last-good-config.json"),
        r#"{"service": "order", "version": "old", "consumer_header": "x-gov-consumer",
            "limits": [{"rule": "order/bursty", "on": {"any": true},
                        "calls": {"amount": 1, "window_ms": 60000}}]}"#,
    )
    .unwrap();
    let a = agent("order", "order-a")
        .upstream(upstream().await)
        .control_plane(&govd)
        .state_dir(&a_dir)
        .start(dir.path())
        .await;
    wait_until(
        "the agent enforces govd's config",
        Duration::from_secs(10),
        async || {
            govd.status()
                .await
                .agents
                .iter()
                .any(|x| x.instance == "order-a" && x.state() == pb::SyncState::Synced)
        },
    )
    .await;
    let log = read(&a.log);
    assert!(log.contains("cannot load the last good config"), "{log}");
    assert!(log.contains("unknown field `limits`"), "{log}");
    // The old file's limit (1 call per minute on everything) is not enforced;
    // govd's `bursty` (3 per minute on /burst) is.
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/burst").await.0, 200);
    }
    assert_eq!(http_get(a.inbound, "/burst").await.0, 429);
}

/// Issue 12, item 3: an apply refused because the state directory cannot
/// be written leaves every agent as it was (no STALE on a version never
/// sent), says why, and the same apply works once the directory is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_refused_by_a_read_only_state_dir_changes_nothing_and_works_once_writable() {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let govd = control_plane(&state_dir).start().await;
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until("the agent connected", Duration::from_secs(10), async || {
        govd.status().await.agents.len() == 1
    })
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    let version = govd.status().await.version;
    let v1_order = agent_state(&govd.status().await, "order-1").version;
    assert_eq!(order.configs_applied().await, 1);

    let v2 = write(dir.path(), "v2.gov", &v2());
    {
        let _read_only = ReadOnly::new(&state_dir, &govd);
        let refused = govc(&govd, Some(TOKEN), &["apply", &v2]).await;
        assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
        assert!(
            refused.stderr.contains("nothing was applied")
                && refused.stderr.contains("--state-dir"),
            "{}",
            refused.stderr
        );
        assert!(
            !refused.stderr.contains("is govd running"),
            "govd is running: {}",
            refused.stderr
        );
        let view = govd.status().await;
        assert_eq!(view.version, version);
        let a = agent_state(&view, "order-1");
        assert_eq!(a.state(), pb::SyncState::Synced, "{a:?}");
        assert_eq!(a.version, v1_order, "no version was sent");
        assert_eq!(order.configs_applied().await, 1);
    }

    // Writable again: the same apply is a change and reaches the agent.
    let again = govc(&govd, Some(TOKEN), &["apply", &v2]).await;
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert!(
        again.stdout.contains("Applied version") && !again.stdout.contains("No changes"),
        "{}",
        again.stdout
    );
    assert!(
        again.stdout.contains("max_concurrent 2 -> 4"),
        "{}",
        again.stdout
    );
    wait_until(
        "order-1 SYNCED on the new version",
        Duration::from_secs(10),
        async || all_synced(&govd, &["order-1"]).await,
    )
    .await;
    assert_eq!(order.configs_applied().await, 2);
    // The state on disk is the new version: a restart keeps it.
    assert_ne!(govd.status().await.version, version);
    let audit = read(&state_dir.join("audit.jsonl"));
    assert!(audit.contains("\"action\":\"apply-refused\""), "{audit}");

    order.stop().await;
    govd.stop().await;
}

/// Issue 12, item 2: a dry run against govd costs what its size allows.
/// 1,000 limits on one match give one `conflicting-rules` per rule (999),
/// not one per pair (499,500); a policy over `--max-statements` is refused
/// before the compiler runs, naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_of_many_rules_on_one_match_is_linear_and_capped() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .args(&["--max-statements", "3000"])
        .start()
        .await;
    let limits = |n: usize| -> String {
        let rules: String = (0..n)
            .map(|i| {
                format!(
                    "  limit l{i} on all {{\n    calls {} per 1s\n  }}\n",
                    10 + i
                )
            })
            .collect();
        format!("service wide {{\n  match all = path prefix \"/\"\n{rules}}}\n")
    };
    let thousand = write(dir.path(), "thousand.gov", &limits(1_000));
    let planned = govc(&govd, Some(TOKEN), &["plan", &thousand]).await;
    let out = format!("{}{}", planned.stdout, planned.stderr);
    let conflicts = out.matches("conflicting-rules").count();
    assert!(
        (1..=1_000).contains(&conflicts),
        "{conflicts} conflicts reported:\n{}",
        &out[..out.len().min(2_000)]
    );
    let too_many = write(dir.path(), "many.gov", &limits(5_000));
    let refused = govc(&govd, Some(TOKEN), &["plan", &too_many]).await;
    assert_ne!(refused.code, 0);
    assert!(
        flat(&refused.stderr).contains("GOV_MAX_STATEMENTS"),
        "{}",
        refused.stderr
    );
    // govd is not busy with either: an apply goes through at once.
    let small = write(dir.path(), "small.gov", &limits(1));
    let applied = govc(&govd, Some(TOKEN), &["apply", &small]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    govd.stop().await;
}

/// Issue 12, item 4: a release that cannot be recorded (read-only state
/// directory) is refused: `govc release` fails with the reason, the fuse
/// stays tripped at govd and at the agent, and the refusal is audited. Once
/// writable, the same release works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_cannot_be_recorded_is_refused_and_the_fuse_stays() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let a = agent("order", "order-a")
        .upstream(upstream().await)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until("the agent connected", Duration::from_secs(10), async || {
        govd.status().await.agents.len() == 1
    })
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;
    {
        let _read_only = ReadOnly::new(&state, &govd);
        let refused = govc(
            &govd,
            Some(OPERATOR_TOKEN),
            &["release", "fuse", "order/errors"],
        )
        .await;
        assert_ne!(refused.code, 0, "{}{}", refused.stdout, refused.stderr);
        assert!(
            flat(&refused.stderr).contains("nothing was released")
                && refused.stderr.contains("--state-dir"),
            "{}",
            refused.stderr
        );
        assert!(
            !refused.stderr.contains("is govd running"),
            "{}",
            refused.stderr
        );
        assert_eq!(govd.status().await.fuses.len(), 1, "govd still holds it");
        assert_eq!(http_get(a.inbound, "/fail").await.0, 503, "the agent too");
    }
    let released = govc(
        &govd,
        Some(OPERATOR_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(govd.status().await.fuses.is_empty());
    let audit = read(&state.join("audit.jsonl"));
    assert!(audit.contains("\"action\":\"release-refused\""), "{audit}");
    a.stop().await;
    govd.stop().await;
}

/// Issue 12, item 1, govd's half: an agent restart never makes govd drop a
/// tripped manual fuse silently. Either the restarted agent still enforces
/// it, or govd keeps the latch, shows the instance as not enforcing it and
/// audits that; only an operator's release ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_never_drops_a_manual_fuse_from_govd_unaudited() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let up = upstream().await;
    let a_dir = dir.path().join("agent-a");
    let start_a = || {
        agent("order", "order-a")
            .upstream(up)
            .control_plane(&govd)
            .state_dir(&a_dir)
            .start(dir.path())
    };
    let a = start_a().await;
    wait_until("the agent connected", Duration::from_secs(10), async || {
        govd.status().await.agents.len() == 1
    })
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;

    // The agent restarts (govd up) and reports its stats again.
    a.stop().await;
    let a = start_a().await;
    wait_until(
        "the restarted agent synced",
        Duration::from_secs(15),
        async || all_synced(&govd, &["order-a"]).await,
    )
    .await;
    // Stats go out every second: give it two.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = govd.status().await;
    assert_eq!(view.fuses.len(), 1, "the latch holds: {view:?}");
    let enforced = http_get(a.inbound, "/fail").await.0 == 503;
    let audit = read(&state.join("audit.jsonl"));
    if !enforced {
        assert!(
            view.fuses[0].reason.contains("NOT ENFORCED by order-a"),
            "{:?}",
            view.fuses[0]
        );
        assert!(
            audit.contains("\"action\":\"latch-not-enforced\""),
            "{audit}"
        );
        let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
        assert!(status.stdout.contains("NOT ENFORCED"), "{}", status.stdout);
    }
    assert!(!audit.contains("\"action\":\"untrip\""), "{audit}");

    // A release that cannot be recorded is refused and changes nothing.
    {
        let _read_only = ReadOnly::new(&state, &govd);
        let refused = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
        assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
        assert!(
            refused.stderr.contains("nothing was released"),
            "{}",
            refused.stderr
        );
        assert_eq!(govd.status().await.fuses.len(), 1);
    }

    // An operator's release ends it, on govd and on the agent.
    let released = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(govd.status().await.fuses.is_empty());
    assert_eq!(http_get(a.inbound, "/fail").await.0, 500);

    a.stop().await;
    govd.stop().await;
}

/// govd is the registry: a caller's outbound listener, started with no
/// `--instances`, learns the instances of `inv` from govd as they register
/// (their lifecycle says READY), and an instance that is stopped leaves the
/// caller's set: no call fails while it goes.
#[tokio::test]
async fn callers_learn_instances_from_govd_and_lose_none_when_one_stops() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 10\n").await;

    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    // Before any instance registered, govd knows none: the call cannot be routed.
    assert_eq!(call(caller, "inv").await.0, 502);

    let a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    // Both registered: the caller reaches both (bounded: 200 calls).
    assert_eq!(
        reached(caller, 2).await,
        ["a", "b"],
        "the caller reaches both instances govd registered"
    );

    // Stop `b` under a bounded load: it deregisters (DRAINING), govd pushes the
    // set without it, and a call that still finds its port closed connects to `a`.
    let load = load_through(caller);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.stop().await;
    let failed = load.await.unwrap();
    assert!(failed.is_empty(), "calls failed while `b` left: {failed:?}");
    wait_until(
        "govd to drop `inv-b` from the registry",
        Duration::from_secs(10),
        async || {
            let view = govd.status().await;
            view.agents
                .iter()
                .find(|x| x.instance == "inv-b")
                .is_none_or(|x| x.state() == pb::SyncState::Disconnected)
        },
    )
    .await;
    for _ in 0..20 {
        assert_eq!(call(caller, "inv").await, (200, "a".to_owned()));
    }
    drop(a);
}

/// govd down: a caller restarted with its state directory still routes to the
/// instances govd last pushed (the sets are kept on disk like configs).
#[tokio::test]
async fn a_caller_restarted_while_govd_is_down_keeps_the_last_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let url = govd.url();
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 10\n").await;
    let web_state = dir.path().join("web-state");
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .state_dir(&web_state)
        .start(dir.path())
        .await;
    let a = inv_instance(&govd, dir.path(), "a").await;
    let caller = web.outbound.unwrap();
    assert_eq!(
        reached(caller, 1).await,
        ["a"],
        "the caller reaches `a` through govd's registry"
    );

    govd.kill().await;
    web.stop().await;
    let web = agent("web", "web-1")
        .control_plane_url(url)
        .outbound()
        .state_dir(&web_state)
        .start(dir.path())
        .await;
    assert_eq!(
        call(web.outbound.unwrap(), "inv").await,
        (200, "a".to_owned()),
        "the restarted caller routes by the kept set while govd is down"
    );
    web.stop().await;
    a.stop().await;
}

/// Scale-out: a new instance gets no call before its readiness probe passes
/// (govd registers it only then), and then takes a share of the calls; none
/// fails meanwhile.
#[tokio::test]
async fn a_new_instance_gets_no_call_before_it_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  warmup {\n    ready when http GET \"/ready\" is 200 every 1s after 0s\n  }\n",
    )
    .await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let (a_up, a_ready, _) = gated_upstream("a").await;
    a_ready.store(true, Ordering::SeqCst);
    let a = agent("inv", "inv-a")
        .upstream(a_up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let mut reached = false;
    for _ in 0..300 {
        if call(caller, "inv").await == (200, "a".to_owned()) {
            reached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reached, "`a` became ready and registered");

    let (c_up, c_ready, c_served) = gated_upstream("c").await;
    let c = agent("inv", "inv-c")
        .upstream(c_up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    // Not ready: 100 calls, none reaches `c`, none fails.
    for _ in 0..100 {
        assert_eq!(call(caller, "inv").await, (200, "a".to_owned()));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        c_served.load(Ordering::SeqCst),
        0,
        "a call reached `c` before it was ready"
    );
    // Ready: its next probe (every 1s) registers it, and calls come.
    c_ready.store(true, Ordering::SeqCst);
    let mut failed = 0;
    for _ in 0..600 {
        if call(caller, "inv").await.0 != 200 {
            failed += 1;
        }
        if c_served.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(failed, 0);
    assert!(
        c_served.load(Ordering::SeqCst) > 0,
        "`c` never got a call once ready"
    );
    c.stop().await;
    a.stop().await;
}

/// SIGKILL of an instance's agent under load: its stream drops, govd removes it
/// from every caller's set, and a call that still tries it is retried on the
/// other instance (connect failures are retried once, any method): GETs see no
/// failure.
#[tokio::test]
async fn a_killed_instance_costs_its_callers_no_failed_get() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 10\n").await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    assert_eq!(reached(caller, 2).await, ["a", "b"]);
    let load = load_through(caller);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.kill().await;
    let failed = load.await.unwrap();
    assert!(
        failed.is_empty(),
        "GETs failed after `b` was killed: {failed:?}"
    );
    a.stop().await;
}

/// Instance names are unique: a second agent claiming a live agent's name is
/// refused with a reason that says what to do, and the first keeps its place.
#[tokio::test]
async fn a_second_agent_with_a_live_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let first = agent("inv", "inv-1")
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until(
        "the first agent connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 1,
    )
    .await;
    let second = agent("inv", "inv-1")
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let log = second.log.clone();
    wait_until(
        "the second agent to be refused",
        Duration::from_secs(10),
        async || read(&log).contains("give each agent its own `--instance`"),
    )
    .await;
    let view = govd.status().await;
    assert_eq!(view.agents.len(), 1);
    assert_eq!(view.agents[0].address, first.inbound.to_string());
    second.stop().await;
    first.stop().await;
}

/// The agent's log line when govd says every caller dropped it (`wait for
/// gov` ends on govd's word). Not a bare "every caller has dropped this
/// instance": the step's first line, "waiting until every caller has
/// dropped this instance", contains that too.
const CALLERS_DROPPED: &str = "lifecycle: every caller has dropped this instance";

/// `wait for gov`: an instance that stops deregisters, waits until every
/// agent connected to govd has acknowledged the set without it (not a fixed
/// sleep), then drains; its callers' calls all succeed meanwhile.
#[tokio::test]
async fn wait_for_gov_ends_when_every_caller_has_dropped_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  shutdown {\n    deregister\n    wait for gov\n    drain 5s\n  }\n",
    )
    .await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    assert_eq!(
        reached(caller, 2).await,
        ["a", "b"],
        "both instances registered"
    );

    let load = load_through(caller);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = b.log.clone();
    b.stop().await;
    let failed = load.await.unwrap();
    assert!(failed.is_empty(), "calls failed while `b` left: {failed:?}");
    let text = read(&log);
    assert!(
        text.contains(CALLERS_DROPPED),
        "the step ended on govd's word, not on its 30 s timeout:\n{text}"
    );
    assert!(!text.contains("not every caller acknowledged"), "{text}");
    drop(a);
}

/// Issue 11 (govd's side): while an instance is being removed, `govc status`
/// names the callers that have not yet acknowledged the endpoint set without
/// it, in the table and in `-o json`; a caller that is stopped (SIGSTOP) is
/// named until it runs again (SIGCONT) and acknowledges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_caller_a_removal_waits_for_until_it_acknowledges() {
    let dir = tempfile::tempdir().unwrap();
    // A stopped caller answers no HTTP/2 ping: with the default keepalive
    // (10s + 5s) govd would drop it mid-test on a loaded box, and the removal
    // would stop waiting on it for that reason instead of the one under test.
    let govd = control_plane(&dir.path().join("state"))
        .args(&["--http2-keepalive-interval", "300s"])
        .start()
        .await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  shutdown {\n    deregister\n    wait for gov\n    drain 5s\n  }\n",
    )
    .await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let _a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    assert_eq!(reached(caller, 2).await, ["a", "b"]);

    // The caller stops reading its stream; `b` leaves.
    signal(&web.child, rustix::process::Signal::STOP);
    let b_log = b.log.clone();
    signal(&b.child, rustix::process::Signal::TERM);
    // `inv-a` acknowledges at once; the stopped caller does not.
    wait_until(
        "govd to show inv-b waiting on web-1 only",
        Duration::from_secs(10),
        async || agent_state(&govd.status().await, "inv-b").removal_waiting_on == ["web/web-1"],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        agent_state(&govd.status().await, "inv-b").removal_waiting_on,
        ["web/web-1"],
        "still waiting on the stopped caller"
    );
    let table = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    let row = table
        .stdout
        .lines()
        .find(|l| l.contains("inv-b"))
        .unwrap_or_else(|| panic!("no inv-b row:\n{}", table.stdout));
    assert!(row.contains("DRAINING"), "{row}");
    assert!(row.contains("removal waiting on web/web-1"), "{row}");
    let json = govc(&govd, Some(VIEWER_TOKEN), &["status", "-o", "json"]).await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let view: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let inv_b = view["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["instance"] == "inv-b")
        .unwrap();
    assert_eq!(
        inv_b["removal_waiting_on"],
        serde_json::json!(["web/web-1"])
    );

    // The caller runs again, acknowledges, and `b` hears it is dropped.
    signal(&web.child, rustix::process::Signal::CONT);
    wait_until(
        "inv-b's wait for gov to end",
        Duration::from_secs(15),
        async || read(&b_log).contains(CALLERS_DROPPED),
    )
    .await;
    let view = govd.status().await;
    assert!(
        view.agents
            .iter()
            .filter(|a| a.instance == "inv-b")
            .all(|a| a.removal_waiting_on.is_empty()),
        "{view:?}\nB LOG:\n{}\nWEB LOG:\n{}\nGOVD LOG:\n{}",
        read(&b_log),
        read(&web.log),
        read(&govd.log)
    );
    let table = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(
        !table.stdout.contains("removal waiting on"),
        "{}",
        table.stdout
    );
}

/// Issue 12, item 1, the agent's half: a tripped manual fuse survives a `kill -9` of
/// its agent, with govd up and with govd down; no call reaches the failing upstream
/// until an operator releases it, and the release is audited. An agent restarted
/// without its state directory gets the latch back from govd when it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_keeps_its_tripped_manual_fuse_with_govd_up_or_down() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let url = format!("http://127.0.0.1:{port}");
    let (up, reached) = failing_upstream().await;
    let reached = move || reached.load(Ordering::SeqCst);
    let a_dir = dir.path().join("agent-a");
    let start_a = || {
        agent("order", "order-a")
            .upstream(up)
            .control_plane_url(url.clone())
            .state_dir(&a_dir)
            .start(dir.path())
    };
    // b keeps no state: only govd can give its latch back.
    let start_b = || {
        agent("order", "order-b")
            .upstream(up)
            .control_plane_url(url.clone())
            .start(dir.path())
    };
    let (a, b) = (start_a().await, start_b().await);
    wait_until(
        "two agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 2,
    )
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for agent in [&a, &b] {
        for _ in 0..3 {
            assert_eq!(http_get(agent.inbound, "/fail").await.0, 500);
        }
        let tripped = http_get(agent.inbound, "/fail").await;
        assert_eq!(
            (tripped.0, tripped.1.as_deref()),
            (503, Some("order/errors"))
        );
    }
    assert_eq!(reached(), 6);
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;
    // Both trip events and a round of stats.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // kill -9 with govd up: the restarted agent refuses from its first call.
    a.kill().await;
    let a = start_a().await;
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    }
    assert_eq!(
        reached(),
        6,
        "a call reached the failing upstream after a restart"
    );

    // b comes back without its state: govd re-arms the latch it holds for it.
    b.kill().await;
    let b = start_b().await;
    wait_until(
        "govd re-armed b's latch",
        Duration::from_secs(15),
        async || read(&b.log).contains("re-armed a latch the control plane holds"),
    )
    .await;
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);

    // kill -9 with govd down: the same.
    govd.kill().await;
    a.kill().await;
    let a = start_a().await;
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    }
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);
    assert_eq!(
        reached(),
        6,
        "a call reached the failing upstream while govd was down"
    );

    // govd back: one latch, enforced by both, never ended.
    let govd = control_plane(&state).start_on(port).await;
    wait_until(
        "both agents reconnected and synced",
        Duration::from_secs(40),
        async || all_synced(&govd, &["order-a", "order-b"]).await,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = govd.status().await;
    assert_eq!(view.fuses.len(), 1, "{view:?}");
    assert!(!view.fuses[0].reason.contains("NOT ENFORCED"), "{view:?}");
    let audit = read(&state.join("audit.jsonl"));
    assert!(!audit.contains("\"action\":\"untrip\""), "{audit}");
    assert!(
        !audit
            .lines()
            .any(|l| l.contains("latch-not-enforced") && l.contains("order-a")),
        "{audit}"
    );

    // Only an operator's release lets calls through again, and it is audited.
    let released = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    for agent in [&a, &b] {
        wait_until(
            "the fuse admits again",
            Duration::from_secs(5),
            async || http_get(agent.inbound, "/fail").await.0 == 500,
        )
        .await;
    }
    assert!(reached() > 6);
    let audit = read(&state.join("audit.jsonl"));
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"release\"") && l.contains("order/errors")),
        "{audit}"
    );

    a.stop().await;
    b.stop().await;
    govd.stop().await;
}

/// order: one call per second per consumer on /keyed, latched until an
/// operator releases it.
const PER_CONSUMER: &str = r#"service order {
  match keyed = path prefix "/keyed"

  limit per_caller on keyed {
    calls 1 per 1s
    algorithm fixed window
    per consumer
    release manual
  }
  consumer from header "x-gov-consumer"
}
"#;

/// The latched keys govd shows for `order/per_caller`, sorted.
async fn latched_keys(govd: &Govd) -> Vec<String> {
    let mut keys: Vec<String> = govd
        .status()
        .await
        .limits
        .into_iter()
        .filter(|l| l.rule == "order/per_caller")
        .map(|l| l.key)
        .collect();
    keys.sort();
    keys
}

/// The keys agent stats report latched for `order/per_caller`.
async fn reported_keys(govd: &Govd) -> Vec<String> {
    govd.status()
        .await
        .rules
        .into_iter()
        .find(|r| r.rule == "order/per_caller")
        .and_then(|r| r.stats)
        .map(|s| s.engaged_keys)
        .unwrap_or_default()
}

#[tokio::test]
async fn latches_of_two_consumers_of_one_limit_are_released_and_kept_apart_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let url = format!("http://127.0.0.1:{port}");
    let up = upstream().await;
    let start_a = |state_dir: PathBuf| {
        agent("order", "order-a")
            .upstream(up)
            .control_plane_url(url.clone())
            .state_dir(&state_dir)
            .start(dir.path())
    };
    let a = start_a(dir.path().join("agent-a")).await;
    wait_until("the agent connected", Duration::from_secs(10), async || {
        govd.status().await.agents.len() == 1
    })
    .await;
    let policy = write(dir.path(), "keyed.gov", PER_CONSUMER);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &policy]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);

    // alice and bob each exceed the limit: two latches of one rule.
    for consumer in ["alice", "bob"] {
        assert_eq!(http_get_as(a.inbound, "/keyed", consumer).await.0, 200);
        let refused = http_get_as(a.inbound, "/keyed", consumer).await;
        assert_eq!(
            (refused.0, refused.1.as_deref()),
            (429, Some("order/per_caller")),
            "{consumer}"
        );
    }
    wait_until(
        "govd holds both latches",
        Duration::from_secs(10),
        async || latched_keys(&govd).await == ["alice", "bob"],
    )
    .await;
    wait_until(
        "stats list both keys",
        Duration::from_secs(10),
        async || reported_keys(&govd).await == ["alice", "bob"],
    )
    .await;
    let status = govc(&govd, Some(TOKEN), &["status"]).await;
    assert!(
        status.stdout.contains("alice") && status.stdout.contains("bob"),
        "{}",
        status.stdout
    );

    // Release bob only.
    let released = govc(
        &govd,
        Some(TOKEN),
        &["release", "limit", "order/per_caller", "--key", "bob"],
    )
    .await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(released.stdout.contains("key `bob`"), "{}", released.stdout);
    assert_eq!(latched_keys(&govd).await, ["alice"]);
    wait_until(
        "the agent released bob",
        Duration::from_secs(10),
        async || reported_keys(&govd).await == ["alice"],
    )
    .await;
    // A new window: bob's count is spent in the one it was latched in.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(http_get_as(a.inbound, "/keyed", "bob").await.0, 200);
    assert_eq!(http_get_as(a.inbound, "/keyed", "alice").await.0, 429);
    let audit = read(&state.join("audit.jsonl"));
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"release\"") && l.contains("\"key\":\"bob\"")),
        "{audit}"
    );
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"trip\"") && l.contains("\"key\":\"alice\"")),
        "{audit}"
    );

    // A govd restart keeps alice (and only alice).
    govd.kill().await;
    let govd = control_plane(&state).start_on(port).await;
    wait_until(
        "the agent synced again",
        Duration::from_secs(40),
        async || all_synced(&govd, &["order-a"]).await,
    )
    .await;
    assert_eq!(latched_keys(&govd).await, ["alice"]);

    // The agent restarts with a fresh state directory: only govd knows of
    // alice's latch, and re-arms it; bob stays free.
    a.kill().await;
    let a = start_a(dir.path().join("agent-a-fresh")).await;
    wait_until(
        "govd re-armed alice's latch",
        Duration::from_secs(15),
        async || read(&a.log).contains("re-armed a latch the control plane holds"),
    )
    .await;
    assert_eq!(http_get_as(a.inbound, "/keyed", "alice").await.0, 429);
    assert_eq!(http_get_as(a.inbound, "/keyed", "bob").await.0, 200);
    wait_until(
        "stats list alice again",
        Duration::from_secs(10),
        async || reported_keys(&govd).await == ["alice"],
    )
    .await;
    let view = govd.status().await;
    assert!(
        view.limits
            .iter()
            .all(|l| !l.reason.contains("NOT ENFORCED")),
        "{view:?}"
    );
    let audit = read(&state.join("audit.jsonl"));
    assert!(!audit.contains("\"action\":\"untrip\""), "{audit}");

    // A release without --key ends every key and names them.
    let all = govc(
        &govd,
        Some(TOKEN),
        &["release", "limit", "order/per_caller"],
    )
    .await;
    assert_eq!(all.code, 0, "{}{}", all.stdout, all.stderr);
    assert!(all.stdout.contains("`alice`"), "{}", all.stdout);
    assert!(!all.stdout.contains("bob"), "{}", all.stdout);
    assert!(latched_keys(&govd).await.is_empty());
    // A fuse has no keys.
    let fuse = govc(
        &govd,
        Some(TOKEN),
        &["release", "fuse", "order/per_caller", "--key", "x"],
    )
    .await;
    assert_eq!(fuse.code, 64, "{}{}", fuse.stdout, fuse.stderr);

    a.stop().await;
    govd.stop().await;
}

// === operability (issue 13) ===

/// `govd 2>&1 | head -3`: once `head` has its lines, stderr is a closed pipe.
/// govd must still stop on SIGTERM (it used to panic inside the log write of
/// its signal task, before cancelling, and needed SIGKILL).
#[tokio::test]
async fn govd_stops_on_sigterm_with_a_closed_stderr() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(govd_bin())
        .args(["--listen", "127.0.0.1:0", "--insecure", "--state-dir"])
        .arg(dir.path().join("state"))
        .env("GOV_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("govd started") {
                return;
            }
        }
        panic!("govd ended its log before `govd started`");
    })
    .await
    .expect("govd did not start within 15 s");
    drop(lines);
    signal(&child, rustix::process::Signal::TERM);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("govd ignored SIGTERM with its stderr closed")
        .unwrap();
    assert!(status.success(), "govd exited with {status}");
}

/// `--log-format json` writes one JSON object per line with the event's fields at
/// the top level, and `RUST_LOG` filters when `GOV_LOG` is unset.
#[tokio::test]
async fn govd_logs_json_lines_filtered_by_rust_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("govd.log");
    let mut child = Command::new(govd_bin())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--insecure",
            "--log-format",
            "json",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .env_remove("GOV_LOG")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until(
        "`govd started` in the log",
        Duration::from_secs(15),
        async || read(&log).contains("govd started"),
    )
    .await;
    signal(&child, rustix::process::Signal::TERM);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    let text = read(&log);
    let started = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .find(|v| v["message"] == "govd started")
        .unwrap_or_else(|| panic!("no `govd started` object in:\n{text}"));
    assert_eq!(started["level"], "INFO");
    let listen: SocketAddr = started["listen"].as_str().unwrap().parse().unwrap();
    assert!(listen.ip().is_loopback());

    // A bad filter is a usage error naming its variable.
    let out = Command::new(govd_bin())
        .args(["--listen", "127.0.0.1:0", "--insecure", "--state-dir"])
        .arg(dir.path().join("state"))
        .env_remove("GOV_LOG")
        .env("RUST_LOG", "info,[{")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`RUST_LOG=info,[{` is not a valid log filter"),
        "{stderr}"
    );
}

/// Every family both binaries export is in docs/metrics.md with its type, and
/// every family the doc marks `always` is exported. The scenario makes the
/// optional ones appear too: a control plane, a state directory, an outbound
/// listener with endpoints from govd, and a limit that rejects and latches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_metrics_lists_every_family_both_binaries_export() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .start()
        .await;
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .state_dir(&dir.path().join("agent-state"))
        .outbound()
        .start(dir.path())
        .await;
    let _payment = agent("payment", "payment-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let file = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &file]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    // The limit: 3 calls per minute, then rejected and latched.
    let mut rejected = 0;
    for _ in 0..5 {
        if http_get(order.inbound, "/burst").await.0 == 429 {
            rejected += 1;
        }
    }
    assert!(rejected > 0);
    // The outbound listener knows payment's instance once govd says so.
    wait_until(
        "payment's endpoint at order",
        Duration::from_secs(15),
        async || {
            http_get(order.admin, "/metrics")
                .await
                .2
                .contains("gov_agent_endpoint_requests_total{service=\"payment\"")
        },
    )
    .await;
    wait_until(
        "govd holding the limit",
        Duration::from_secs(15),
        async || !govd.status().await.limits.is_empty(),
    )
    .await;

    let agent_text = http_get(order.admin, "/metrics").await.2;
    assert!(
        agent_text.contains("gov_agent_control_plane_connected 1\n"),
        "{agent_text}"
    );
    let govd_text = http_get(govd.metrics.unwrap(), "/metrics").await.2;
    for line in [
        "govd_agents{state=\"SYNCED\"} 2\n",
        "govd_applies_total{result=\"applied\"} 1\n",
        "govd_limits_engaged{rule=\"order/bursty\"} 1\n",
        "govd_config_nacks_total 0\n",
    ] {
        assert!(govd_text.contains(line), "missing {line:?} in\n{govd_text}");
    }
    assert!(
        !govd_text.contains("govd_config_answer_seconds_count 0\n"),
        "{govd_text}"
    );

    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"))
            .unwrap();
    // `| `name` | type | labels | when | what |`
    let documented: Vec<(String, String, bool)> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((
                name.to_owned(),
                cells.get(2)?.to_string(),
                cells.get(4)?.starts_with("always"),
            ))
        })
        .collect();
    for (binary, text, prefix) in [
        ("gov-agent", &agent_text, "gov_agent_"),
        ("govd", &govd_text, "govd_"),
    ] {
        let exported: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        for (name, kind) in &exported {
            assert!(
                documented.iter().any(|(n, k, _)| n == name && k == kind),
                "{binary} exports `{name}` ({kind}), which docs/metrics.md does not list with that type"
            );
        }
        for (name, _, always) in &documented {
            let ours = name.starts_with(prefix) || name.starts_with("process_");
            if *always && ours {
                assert!(
                    exported.iter().any(|(n, _)| n == name),
                    "docs/metrics.md says {binary} always exports `{name}`; it does not:\n{text}"
                );
            }
        }
    }
    order.stop().await;
    govd.stop().await;
}

/// A real Prometheus (Debian's `prometheus` package) scrapes an agent and govd,
/// and a PromQL query over its HTTP API sees the limit's rejections and govd's
/// engaged limit. Skipped, saying so, when `prometheus` is not installed
/// (`.ci/run` installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_agent_and_govd_and_sees_a_rejection() {
    if std::process::Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: `prometheus` is not installed (apt-get install prometheus)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .start()
        .await;
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let file = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &file]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    let mut rejected = 0;
    for _ in 0..5 {
        if http_get(order.inbound, "/burst").await.0 == 429 {
            rejected += 1;
        }
    }
    assert!(rejected > 0);

    // Prometheus cannot report a port it chose: take a free one and hand it over.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             scrape_configs:\n\
             \x20 - job_name: gov\n\
             \x20   static_configs:\n\
             \x20     - targets: ['{}', '{}']\n",
            order.admin,
            govd.metrics.unwrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("prometheus.log");
    let _prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let api = SocketAddr::from(([127, 0, 0, 1], port));
    let query = async |q: &str| -> Option<f64> {
        let path = format!("/api/v1/query?query={}", percent_encode(q));
        let (status, _, body) = http_get(api, &path).await;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    wait_until(
        "Prometheus to see the agent's rejections and govd's limit",
        Duration::from_secs(60),
        async || {
            let rejections = query(
                "sum(gov_agent_rule_rejected_total{rule=\"order/bursty\",reason=\"limit_calls\"})",
            )
            .await;
            let engaged = query("govd_limits_engaged{rule=\"order/bursty\"}").await;
            rejections.is_some_and(|n| n >= 1.0) && engaged == Some(1.0)
        },
    )
    .await;
    order.stop().await;
    govd.stop().await;
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters kept).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `govc apply` shows the plan and applies only when confirmed: without a
/// terminal it needs `--auto-approve` (exit 64, nothing sent); a removed
/// service is called out in the plan.
#[tokio::test]
async fn apply_without_a_terminal_needs_auto_approve_and_calls_out_a_removal() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    let version = govd.status().await.version;

    let order_only = write(
        dir.path(),
        "order.gov",
        &V1[..V1.find("service payment").unwrap()],
    );
    let out = Command::new(binary("govc"))
        .args(["apply", &order_only])
        .env("GOV_CONTROL_PLANE", govd.url())
        .env("GOV_TOKEN", TOKEN)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(64), "{stdout}{stderr}");
    assert!(
        stdout.contains("- service payment"),
        "the plan is shown:\n{stdout}"
    );
    assert!(
        stdout.contains("WARNING: this removes service payment"),
        "{stdout}"
    );
    assert!(stderr.contains("--auto-approve"), "{stderr}");
    assert_eq!(govd.status().await.version, version, "nothing was applied");

    let approved = govc(&govd, Some(TOKEN), &["apply", &order_only]).await;
    assert_eq!(approved.code, 0, "{}{}", approved.stdout, approved.stderr);
    assert!(
        approved
            .stdout
            .contains("WARNING: this removes service payment")
    );
    assert_ne!(govd.status().await.version, version);

    // A file with no service would empty every agent: refused by govc, and
    // by govd for a client that does not ask first, unless it is asked for.
    let version = govd.status().await.version;
    let empty = write(dir.path(), "empty.gov", "\n");
    let refused = govc(&govd, Some(TOKEN), &["apply", &empty]).await;
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert!(
        flat(&refused.stderr).contains("--remove-all-services"),
        "{}",
        refused.stderr
    );
    assert_eq!(govd.status().await.version, version, "nothing was applied");
    let direct = govd
        .client()
        .await
        .apply(as_token(
            TOKEN,
            pb::ApplyRequest {
                sources: vec![pb::SourceFile {
                    name: "empty.gov".into(),
                    text: "\n".into(),
                }],
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(direct.code(), tonic::Code::FailedPrecondition, "{direct:?}");
    assert_eq!(govd.status().await.version, version, "nothing was applied");
    let removed = govc(
        &govd,
        Some(TOKEN),
        &["apply", "--remove-all-services", &empty],
    )
    .await;
    assert_eq!(removed.code, 0, "{}{}", removed.stdout, removed.stderr);
    assert_ne!(govd.status().await.version, version);
}

// === tokens, roles and the audit log ===

/// govc's stderr with miette's wrapping undone: words joined by one space.
fn flat(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| *w != "│")
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `govd` with `args` (and a fresh state directory) and expects it to
/// refuse to start: its exit code and stderr.
async fn govd_refuses(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        Command::new(govd_bin())
            .args(args)
            .arg("--state-dir")
            .arg(dir.join(format!("refused-{}", rand_suffix())))
            .env_remove("GOV_TOKEN_FILE")
            .env_remove("GOV_INSECURE")
            .output(),
    )
    .await
    .expect("govd must exit, not serve")
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn govd_will_not_start_open_unless_told_and_only_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = govd_refuses(dir.path(), &["--listen", "127.0.0.1:0"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("govd needs tokens"), "{stderr}");
    assert!(stderr.contains("--token-file FILE"), "{stderr}");
    let (code, stderr) = govd_refuses(dir.path(), &["--listen", "0.0.0.0:0", "--insecure"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--insecure is only allowed on a loopback address, not `0.0.0.0:0`"),
        "{stderr}"
    );
    // A token file with a bad line says which line and what is wrong.
    let tokens = write(
        dir.path(),
        "bad.tokens",
        "alice a-token admin\nbob b-token root\n",
    );
    let (code, stderr) = govd_refuses(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--token-file", &tokens],
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("line 2: unknown role `root`"), "{stderr}");
    // etcd's settings without etcd are a usage error, not ignored (clap alone
    // let them through beside `--state-dir`).
    for flag in [["--leader-lease", "5s"], ["--replica", "r1"]] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--insecure"];
        args.extend(flag);
        let (code, stderr) = govd_refuses(dir.path(), &args).await;
        assert_eq!(code, 64, "{flag:?}: {stderr}");
        assert!(stderr.contains("need --store etcd://"), "{stderr}");
    }
    // --insecure on loopback starts (and serves without a token).
    let govd = ControlPlaneBuilder {
        state_dir: dir.path().join("open"),
        store: None,
        token: false,
        agent_token: false,
        metrics: false,
        tls: None,
        args: Vec::new(),
    }
    .start()
    .await;
    let status = govc(&govd, None, &["status", "-o", "json"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, None, &["apply", "--who", "mallory", &v1]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    // Without tokens the claim is all govd has: it is marked as such.
    let audit = govc(&govd, None, &["audit", "-o", "json"]).await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    // The apply's intent and its outcome.
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(
        records.iter().all(|r| r["who"] == "mallory (unverified)"),
        "{records:?}"
    );
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_do_what_it_says_and_the_audit_names_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);

    // Reads need a token too.
    let status = govc(&govd, None, &["status"]).await;
    assert_eq!(status.code, 1, "{}", status.stdout);
    assert!(
        flat(&status.stderr)
            .contains("`Status` needs a token with the viewer, operator or admin role"),
        "{}",
        status.stderr
    );
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let wrong = govc(&govd, Some("not-a-token"), &["status"]).await;
    assert_eq!(wrong.code, 1);
    assert!(
        flat(&wrong.stderr).contains("not one govd knows"),
        "{}",
        wrong.stderr
    );

    // A viewer cannot apply, an operator cannot apply; the refusal names the
    // role needed and the token's role.
    for (token, name, role) in [
        (VIEWER_TOKEN, "board", "viewer"),
        (OPERATOR_TOKEN, "oncall", "operator"),
    ] {
        let refused = govc(&govd, Some(token), &["apply", &v1]).await;
        assert_eq!(refused.code, 1, "{}", refused.stdout);
        let want = format!("`Apply` needs the admin role; the token `{name}` has the {role} role");
        assert!(flat(&refused.stderr).contains(&want), "{}", refused.stderr);
    }
    assert_eq!(govd.status().await.version, "", "nothing was applied");

    // The admin applies; the audit names the token, not `--who` or $USER.
    let applied = govc(&govd, Some(TOKEN), &["apply", "--who", "mallory", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);

    // A viewer cannot release; an operator can.
    let refused = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(refused.code, 1);
    assert!(
        flat(&refused.stderr).contains(
            "`Release` needs the operator or admin role; the token `board` has the viewer role"
        ),
        "{}",
        refused.stderr
    );
    let released = govc(
        &govd,
        Some(OPERATOR_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(released.code, 0, "{}", released.stderr);

    // `govc audit` reads the log over gRPC, with a viewer's token.
    let refused = govc(&govd, None, &["audit"]).await;
    assert_eq!(refused.code, 1);
    assert!(
        flat(&refused.stderr).contains("`Audit` needs a token"),
        "{}",
        refused.stderr
    );
    let audit = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--since", "1h", "-o", "json"],
    )
    .await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let who: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r["who"].as_str().unwrap(), r["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        who,
        [
            ("e2e", "apply-intended"),
            ("e2e", "apply"),
            ("oncall", "release-intended"),
            ("oncall", "release")
        ],
        "{records:?}"
    );
    assert_eq!(records[3]["rule"], "order/errors");
    assert!(records[0]["at"].as_str().unwrap().ends_with('Z'));
    let table = govc(&govd, Some(VIEWER_TOKEN), &["audit"]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.stdout.starts_with("SEQ  TIME (UTC)"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("fuse order/errors"),
        "{}",
        table.stdout
    );
    // --since a time after both: nothing.
    let later = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--since", "2999-01-01"],
    )
    .await;
    assert_eq!(later.code, 0, "{}", later.stderr);
    assert_eq!(later.stdout, "no audit records\n");
    // --limit keeps the newest and says how many were left out.
    let last = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--limit", "1", "-o", "json"],
    )
    .await;
    let records: Vec<serde_json::Value> = serde_json::from_str(&last.stdout).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["action"], "release");
    assert!(
        flat(&last.stderr).contains("3 older record(s) left out"),
        "{}",
        last.stderr
    );
    let bad = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--since", "yesterday"],
    )
    .await;
    assert_eq!(bad.code, 64, "{}", bad.stderr);
    govd.stop().await;
}

/// Issue 12: `govc audit` pages over a long log. govd answers one bounded
/// page (never the whole log), `--before` walks back from the note's cursor
/// without gaps or repeats, and `--since` still bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govc_audit_pages_back_over_a_long_log_in_bounded_answers() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // 25,000 records of an old govd, 1 ms apart (older than any page bound).
    let mut log = String::new();
    for i in 1..=25_000u64 {
        log.push_str(&format!(
            "{{\"at_unix_ms\":{},\"who\":\"bot-{i}\",\"action\":\"apply\",\"version\":\"v{i}\"}}\n",
            1_700_000_000_000 + i
        ));
    }
    std::fs::write(state.join("audit.jsonl"), log).unwrap();
    let govd = control_plane(&state).start().await;
    let page = |args: Vec<String>| {
        let govd = &govd;
        async move {
            let mut all = vec!["audit".to_owned(), "-o".into(), "json".into()];
            all.extend(args);
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            let out = govc(govd, Some(VIEWER_TOKEN), &args).await;
            assert_eq!(out.code, 0, "{}", out.stderr);
            let records: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
            let seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
            let next = flat(&out.stderr)
                .split("govc audit --before ")
                .nth(1)
                .map(|n| n.trim().parse::<u64>().unwrap());
            (seqs, next)
        }
    };
    // Asking for everything gets govd's cap, the newest first page.
    let (seqs, next) = page(vec!["--limit".into(), "0".into()]).await;
    assert_eq!(seqs.len(), 10_000);
    assert_eq!((seqs[0], *seqs.last().unwrap()), (15_001, 25_000));
    assert_eq!(next, Some(15_001));
    // Pages of 7,000 walk back to the first record.
    let mut seen: Vec<u64> = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let mut args = vec!["--limit".to_owned(), "7000".into()];
        if let Some(b) = before {
            args.extend(["--before".into(), b.to_string()]);
        }
        let (seqs, next) = page(args).await;
        assert!(seqs.len() <= 7_000);
        seen.splice(0..0, seqs);
        match next {
            Some(n) => before = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, (1..=25_000).collect::<Vec<u64>>());
    // --since bounds the pages too: its last 1,001 records, in two pages
    // of the default 1,000.
    let since = "2023-11-14T22:13:44Z"; // 1_700_000_024_000
    let (seqs, next) = page(vec!["--since".into(), since.into()]).await;
    assert_eq!(seqs, (24_001..=25_000).collect::<Vec<u64>>());
    assert_eq!(next, Some(24_001));
    let (seqs, next) = page(vec![
        "--since".into(),
        since.into(),
        "--before".into(),
        "24001".into(),
    ])
    .await;
    assert_eq!((seqs, next), (vec![24_000], None));
    govd.stop().await;
}

/// Issue 12: govd re-reads its token file on SIGHUP. A token taken out of
/// the file stops working without a restart, a new one works, the reload
/// is audited; a broken file keeps the tokens in force and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_token_file_and_a_bad_one_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let token_file = state.with_extension("token");
    let status = async |token: &str| govc(&govd, Some(token), &["status"]).await;
    assert_eq!(status(OPERATOR_TOKEN).await.code, 0);

    // The operator's token is revoked, a new viewer's added.
    std::fs::write(
        &token_file,
        "e2e e2e-admin-token admin\nboard e2e-viewer-token viewer\nauditor e2e-new-token viewer\n",
    )
    .unwrap();
    signal(&govd.child, rustix::process::Signal::HUP);
    wait_until(
        "govd to reload its tokens",
        Duration::from_secs(10),
        async || read(&govd.log).contains("token files reloaded"),
    )
    .await;
    let revoked = status(OPERATOR_TOKEN).await;
    assert_ne!(
        revoked.code, 0,
        "a revoked token still works: {}",
        revoked.stdout
    );
    assert!(
        flat(&revoked.stderr).contains("not one govd knows"),
        "{}",
        revoked.stderr
    );
    assert_eq!(status("e2e-new-token").await.code, 0);
    assert_eq!(status(VIEWER_TOKEN).await.code, 0);
    let audit = govc(&govd, Some(VIEWER_TOKEN), &["audit", "-o", "json"]).await;
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let reload = records
        .iter()
        .find(|r| r["action"] == "tokens-reloaded")
        .unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!(reload["who"], "govd (SIGHUP)");
    let detail = reload["detail"].as_str().unwrap();
    assert!(
        detail.contains("auditor (viewer)") && !detail.contains("oncall"),
        "{detail}"
    );
    assert!(
        !audit.stdout.contains("e2e-new-token"),
        "a token in the audit log"
    );

    // A broken file: the tokens in force stay, and the log says why.
    std::fs::write(&token_file, "e2e e2e-admin-token superuser\n").unwrap();
    signal(&govd.child, rustix::process::Signal::HUP);
    wait_until(
        "govd to refuse the broken file",
        Duration::from_secs(10),
        async || read(&govd.log).contains("keeping the tokens in force"),
    )
    .await;
    let log = read(&govd.log);
    assert!(log.contains("unknown role `superuser`"), "{log}");
    assert_eq!(status("e2e-new-token").await.code, 0);
    assert_ne!(status(OPERATOR_TOKEN).await.code, 0);
    govd.stop().await;
}

// === TLS ===

/// Throwaway certificates: a CA, govd's certificate for 127.0.0.1, and
/// agent certificates, as PEM files in one directory.
#[derive(Clone)]
struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    issuer: Arc<rcgen::CertifiedIssuer<'static, rcgen::KeyPair>>,
}

impl Pki {
    fn new(dir: &Path) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "gov e2e CA");
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, issuer.pem()).unwrap();
        let mut pki = Pki {
            dir: dir.to_owned(),
            ca,
            server_cert: PathBuf::new(),
            server_key: PathBuf::new(),
            issuer: Arc::new(issuer),
        };
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        (pki.server_cert, pki.server_key) = pki.sign("govd", params);
        pki
    }

    /// A certificate and key signed by the CA, as (cert, key) files.
    fn sign(&self, name: &str, params: rcgen::CertificateParams) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// An agent certificate: a SPIFFE ID for `service`, or only CN=`service`.
    fn agent(&self, service: &str, spiffe: bool) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        if spiffe {
            let id = format!("spiffe://gov.test/ns/default/service/{service}");
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(id.try_into().unwrap()));
        } else {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, service);
        }
        self.sign(&format!("agent-{service}-{spiffe}"), params)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_an_agent_is_the_service_its_certificate_names_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .start()
        .await;
    let up = upstream().await;
    let ca = pki.ca.display().to_string();

    // People: govc over TLS with the CA; plain HTTP/2 or no CA gets nothing.
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status", "--tls-ca", &ca]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let no_ca = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(no_ca.code, 1);
    assert!(
        flat(&no_ca.stderr).contains("no CA to check govd's certificate"),
        "{}",
        no_ca.stderr
    );
    let plain_url = format!("http://{}", govd.addr);
    let plain = Command::new(binary("govc"))
        .args(["status", "--control-plane", &plain_url])
        .env("GOV_TOKEN", VIEWER_TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(
        plain.status.code(),
        Some(1),
        "plain HTTP/2 must not be served"
    );
    let tls_on_http = Command::new(binary("govc"))
        .args(["status", "--control-plane", &plain_url, "--tls-ca", &ca])
        .env("GOV_TOKEN", VIEWER_TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(tls_on_http.status.code(), Some(1));
    assert!(
        flat(&String::from_utf8_lossy(&tls_on_http.stderr))
            .contains("is plain HTTP, but TLS files were given"),
        "{}",
        String::from_utf8_lossy(&tls_on_http.stderr)
    );

    // An agent with a SPIFFE certificate for its service, and one with CN.
    let order_cert = pki.agent("order", true);
    let pay_cert = pki.agent("payment", false);
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, Some(&order_cert))
        .start(dir.path())
        .await;
    let pay = agent("payment", "payment-1")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, Some(&pay_cert))
        .start(dir.path())
        .await;
    wait_until(
        "both agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 2,
    )
    .await;

    // The payment certificate cannot claim order; an agent without a
    // certificate is refused too.
    let posing = agent("order", "order-fake")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, Some(&pay_cert))
        .start(dir.path())
        .await;
    let anonymous = agent("order", "order-anon")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, None)
        .start(dir.path())
        .await;
    wait_until(
        "both refusals logged",
        Duration::from_secs(10),
        async || {
            let (a, b) = (read(&posing.log), read(&anonymous.log));
            a.contains("refused this agent's credentials")
                && b.contains("refused this agent's credentials")
        },
    )
    .await;
    assert!(
        read(&posing.log).contains("certificate is for service `payment`, not `order`"),
        "{}",
        read(&posing.log)
    );
    assert!(
        read(&anonymous.log).contains("requires agents to present a client certificate"),
        "{}",
        read(&anonymous.log)
    );
    // The refused agents say so on /ready and in /metrics; the accepted
    // one does not.
    for refused in [&posing, &anonymous] {
        let (_, _, ready) = http_get(refused.admin, "/ready").await;
        assert!(
            ready.contains("control plane refused this agent's credentials"),
            "{ready}"
        );
        let (_, _, metrics) = http_get(refused.admin, "/metrics").await;
        assert!(
            metrics.contains("gov_agent_control_plane_refused 1"),
            "{metrics}"
        );
        assert!(
            !metrics.contains("gov_agent_control_plane_auth_failures_total 0"),
            "{metrics}"
        );
    }
    let (_, _, ready) = http_get(order.admin, "/ready").await;
    assert!(!ready.contains("refused"), "{ready}");
    let (_, _, metrics) = http_get(order.admin, "/metrics").await;
    assert!(
        metrics.contains("gov_agent_control_plane_refused 0"),
        "{metrics}"
    );
    let view = govd.status().await;
    let mut names: Vec<_> = view.agents.iter().map(|a| a.instance.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["order-1", "payment-1"]);
    // The attempt to pose as order is audited and logged.
    let audit = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "-o", "json", "--tls-ca", &ca],
    )
    .await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let refused: Vec<_> = records
        .iter()
        .filter(|r| r["action"] == "agent-refused")
        .collect();
    assert!(!refused.is_empty(), "{records:?}");
    assert_eq!(refused[0]["targets"][0], "order/order-fake");
    assert!(
        read(&govd.log).contains("refused an agent: its certificate is for another service"),
        "{}",
        read(&govd.log)
    );

    // Configs flow over TLS: an apply reaches the order agent.
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--tls-ca", &ca, &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    assert_eq!(order.configs_applied().await, 1);
    for a in [order, pay, posing, anonymous] {
        a.stop().await;
    }
    govd.stop().await;
}

// === connections ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_are_closed_and_connections_beyond_the_cap_wait_for_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .args(&["--max-connections", "2", "--handshake-timeout", "1s"])
        .start()
        .await;

    // Two sockets that never speak hold both slots, until the handshake
    // deadline closes them.
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(tokio::net::TcpStream::connect(govd.addr).await.unwrap());
    }
    for mut socket in idle {
        // govd's HTTP/2 settings come first; then the close.
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            while matches!(socket.read(&mut buf).await, Ok(1..)) {}
        })
        .await;
        assert!(
            closed.is_ok(),
            "govd must close a connection that says nothing"
        );
    }

    // Two clients with a watch each fill the cap; a third waits for a slot
    // and gets one when a watcher leaves.
    let watcher = || async {
        let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
            .await
            .unwrap();
        let mut stream = client
            .watch(as_viewer(pb::WatchRequest::default()))
            .await
            .unwrap()
            .into_inner();
        stream.message().await.unwrap().unwrap();
        (client, stream)
    };
    let first = watcher().await;
    let _second = watcher().await;
    wait_until("the cap is reported", Duration::from_secs(10), async || {
        read(&govd.log).contains("connection cap reached")
    })
    .await;
    let url = govd.url();
    let third = tokio::spawn(async move {
        let mut client = gov_control_plane::client::connect(&url, Duration::from_secs(30))
            .await
            .unwrap();
        client
            .status(as_viewer(pb::StatusRequest::default()))
            .await
            .map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served beyond the cap"
    );
    drop(first);
    tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a slot freed")
        .unwrap()
        .unwrap();
    govd.stop().await;
}

// === history ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_applies_of_the_examples_keep_one_copy_of_each_source() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<String> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gov"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    let examples_bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    // Two versions of one more file, alternating: every apply is a change.
    let mut first = 0;
    for i in 0..50 {
        let extra = write(
            dir.path(),
            "extra.gov",
            &format!(
                "service extra_svc {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent {}\n  }}\n}}\n",
                2 + i % 2
            ),
        );
        let mut args = vec!["apply", "--wait", "0s", &extra];
        args.extend(files.iter().map(String::as_str));
        let applied = govc(&govd, Some(TOKEN), &args).await;
        assert_eq!(
            applied.code, 0,
            "apply {i}: {}{}",
            applied.stdout, applied.stderr
        );
        if i == 0 {
            first = state_bytes(&state);
        }
    }
    govd.stop().await;
    let size = state_bytes(&state);
    assert_eq!(state_files(&state, "history-").len(), 50);
    // 49 more versions cost their metadata (names, content addresses), not
    // 49 more copies of the examples (before: about 49 x the examples).
    assert!(
        (size - first) * 10 < 49 * examples_bytes,
        "the state grew from {first} to {size} bytes over 49 applies of {examples_bytes} bytes of examples"
    );
    println!(
        "the state: {first} bytes after 1 apply, {size} bytes after 50; the examples: {examples_bytes} bytes"
    );
}

/// The part files of the state directory whose names start with `prefix`.
fn state_files(state: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with(prefix) && name.ends_with(".json") && !name.starts_with('.')
        })
        .collect();
    files.sort();
    files
}

/// Bytes of the shared state in the state directory (its parts: not the
/// agents' journal, not the audit log).
fn state_bytes(state: &Path) -> u64 {
    [
        "policy", "history-", "text-", "latch-", "release-", "canary",
    ]
    .iter()
    .flat_map(|p| state_files(state, p))
    .map(|f| std::fs::metadata(f).unwrap().len())
    .sum()
}

/// Issue 12: the history is bounded by size. Six applies of a 150 KB policy
/// that changes every time, under `--history-bytes 400000`: the state
/// keeps the two newest versions (two distinct texts fit, three do not),
/// not six.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_of_large_changing_policies_stops_at_history_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state)
        .args(&["--history-bytes", "400000"])
        .start()
        .await;
    for i in 0..6 {
        let comment: String = (0..12_000).map(|n| format!("# {i} {n:08}\n")).collect();
        assert!(comment.len() > 140_000);
        let policy = write(
            dir.path(),
            "big.gov",
            &format!(
                "{comment}service big_svc {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent {}\n  }}\n}}\n",
                2 + i
            ),
        );
        let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "0s", &policy]).await;
        assert_eq!(
            applied.code, 0,
            "apply {i}: {}{}",
            applied.stdout, applied.stderr
        );
    }
    govd.stop().await;
    let size = state_bytes(&state);
    let versions = state_files(&state, "history-");
    assert_eq!(versions.len(), 2, "{versions:?}");
    let newest: serde_json::Value = serde_json::from_str(&read(&versions[1])).unwrap();
    let policy: serde_json::Value =
        serde_json::from_str(&read(&state.join("policy.json"))).unwrap();
    assert_eq!(
        newest["version"], policy["version"],
        "the version in force is kept"
    );
    assert_eq!(
        state_files(&state, "text-").len(),
        2,
        "the texts of the versions dropped are removed"
    );
    assert!(size < 700_000, "the state is {size} bytes");
}

// === a release an agent missed ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_made_while_an_agent_is_away_is_not_a_new_trip_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let (up, _reached) = failing_upstream().await;
    let a_dir = dir.path().join("agent-a");
    let start_a = || {
        agent("order", "order-a")
            .upstream(up)
            .control_plane(&govd)
            .state_dir(&a_dir)
            .start(dir.path())
    };
    let a = start_a().await;
    wait_until("the agent connected", Duration::from_secs(10), async || {
        govd.status().await.agents.len() == 1
    })
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;

    // The agent goes away with its latch on disk; the operator releases.
    a.kill().await;
    let released = govc(
        &govd,
        Some(OPERATOR_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(released.code, 0, "{}", released.stderr);
    assert!(govd.status().await.fuses.is_empty());

    // Back with the latch it kept: govd sends it the release it missed,
    // and records no new trip.
    let a = start_a().await;
    wait_until(
        "the agent released the fuse",
        Duration::from_secs(15),
        async || http_get(a.inbound, "/fail").await.0 == 500,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        govd.status().await.fuses.is_empty(),
        "the missed release became a new trip: {:?}",
        govd.status().await.fuses
    );
    let audit = govc(&govd, Some(VIEWER_TOKEN), &["audit", "-o", "json"]).await;
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let actions: Vec<&str> = records
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "apply-intended",
            "apply",
            "trip",
            "release-intended",
            "release"
        ],
        "{records:?}"
    );
    a.stop().await;
    govd.stop().await;
}

/// What an agent's lifecycle reports reaches govd: STARTING (weight 0) until its
/// readiness probe passes, WARMING with a weight that rises over its ramp, READY at
/// 100%, and DRAINING once SIGTERM begins its shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govd_shows_each_agents_phase_and_weight_from_start_to_drain() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  warmup {\n    ready when http GET \"/ready\" is 200 every 1s after 0s\n    \
         register\n    ramp 3s from 10%\n  }\n  shutdown {\n    deregister\n    \
         wait 3s\n    drain 1s\n  }\n",
    )
    .await;
    let (up, ready, _) = gated_upstream("a").await;
    let a = agent("inv", "inv-a")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let state = async || {
        let view = govd.status().await;
        view.agents
            .iter()
            .find(|a| a.instance == "inv-a")
            .map(|a| (a.phase(), a.weight_milli_percent))
    };
    // Its probe fails: STARTING, no weight (and it stays so while the probe fails).
    wait_until("inv-a connected", Duration::from_secs(15), async || {
        state().await.is_some()
    })
    .await;
    assert_eq!(state().await, Some((pb::Phase::Starting, 0)));

    // Ready: WARMING from 10% up, then READY at 100%; what govd shows never falls.
    ready.store(true, Ordering::SeqCst);
    let mut seen = Vec::new();
    wait_until("inv-a READY", Duration::from_secs(30), async || {
        let now = state().await.unwrap();
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        now.0 == pb::Phase::Ready
    })
    .await;
    let warming: Vec<u32> = seen
        .iter()
        .filter(|(p, _)| *p == pb::Phase::Warming)
        .map(|(_, w)| *w)
        .collect();
    assert!(
        warming.iter().any(|w| (10_000..100_000).contains(w)),
        "no WARMING weight between 10% and 100%: {seen:?}"
    );
    assert!(warming.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&(pb::Phase::Ready, 100_000)), "{seen:?}");

    // SIGTERM: the shutdown's wait (3s) keeps it connected and DRAINING.
    signal(&a.child, rustix::process::Signal::TERM);
    wait_until("inv-a DRAINING", Duration::from_secs(15), async || {
        state().await.is_some_and(|(p, _)| p == pb::Phase::Draining)
    })
    .await;
    a.stop().await;
}

/// The TUI's own client against govd: its watch needs no token and shows a tripped
/// fuse; a release with a wrong token or none is refused with govd's readable reason
/// and changes nothing; the token as read from a file (with its newline) releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tuis_watch_and_token_release_work_against_govd() {
    use gov_tui::Msg;
    use gov_tui::proto::ReleaseKind;

    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let (failing, _) = failing_upstream().await;
    let a = agent("order", "order-a")
        .upstream(failing)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    // `apply --wait` waits for the agents connected when it applies: one not
    // connected yet would get the policy later, after the calls below.
    wait_until("the agent connected", Duration::from_secs(10), async || {
        govd.status().await.agents.len() == 1
    })
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);

    let opts = |token: Option<&str>| gov_tui::WatchOptions {
        url: govd.url(),
        token: token.map(str::to_owned),
        tls: gov_proto::tls::ClientTls::default(),
        service: String::new(),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let watcher = tokio::spawn(gov_tui::watch(opts(Some(VIEWER_TOKEN)), tx));
    // Views until one shows the tripped fuse (bounded: 30 s).
    let until = async |rx: &mut tokio::sync::mpsc::Receiver<Msg>, tripped: bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some(Msg::View(v))) if v.fuses.is_empty() != tripped => return v,
                Ok(Some(Msg::View(_))) => {}
                Ok(Some(other)) => panic!("the watch failed against govd: {other:?}"),
                Ok(None) | Err(_) => panic!("no view with the fuse tripped={tripped} in 30 s"),
            }
        }
    };
    let view = until(&mut rx, true).await;
    assert_eq!(view.fuses[0].rule, "order/errors");

    for (token, reason) in [
        (None, "needs a token with the operator or admin role"),
        (Some("not-the-token"), "the token is not one govd knows"),
    ] {
        let err = gov_tui::release(
            &opts(token),
            ReleaseKind::Fuse,
            "order/errors".into(),
            "e2e".into(),
        )
        .await
        .unwrap_err();
        assert!(err.contains(reason), "{token:?}: {err}");
    }
    assert_eq!(
        govd.status().await.fuses.len(),
        1,
        "a refused release released"
    );
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);

    // As read from a token file: with its newline, which the TUI trims.
    let token = format!("{OPERATOR_TOKEN}\n");
    let result = gov_tui::release(
        &opts(Some(&token)),
        ReleaseKind::Fuse,
        "order/errors".into(),
        "e2e".into(),
    )
    .await
    .unwrap();
    assert!(result.released, "{result:?}");
    until(&mut rx, false).await;
    wait_until(
        "the agent admits again",
        Duration::from_secs(10),
        async || http_get(a.inbound, "/fail").await.0 == 500,
    )
    .await;
    drop(rx);
    tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("the watch task ends once its receiver is gone")
        .unwrap();
    a.stop().await;
}

// === shadow mode (issue 14) ===

/// One limit on `/api`, as a team would first roll it out.
const API_LIMIT: &str = r#"service order {
  match api = path prefix "/api"
  limit api_rate on api {
    calls 20 per 1s
  }
}
"#;

/// A counter sample of `/metrics` text (0 when absent).
fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The same limit applied with `govc apply --shadow` to one govd and as
/// written to another, each with one agent, under the same load at the same
/// time (every call sent to both at once; limit windows are Unix-time
/// aligned on every agent). The shadow agent rejects nothing and counts as
/// would-be rejections what the enforced agent rejects, within one window's
/// worth (20 calls): the two copies of a call reach their agents a few
/// microseconds apart, so only the pairs in flight at a window boundary (at
/// most 4 per boundary here) can fall into different windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_limit_rejects_nothing_and_counts_what_the_enforced_limit_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream().await;
    let policy = write(dir.path(), "api.gov", API_LIMIT);
    let shadow_govd = control_plane(&dir.path().join("shadow")).start().await;
    let enforce_govd = control_plane(&dir.path().join("enforce")).start().await;
    let shadowed = agent("order", "order-shadow")
        .upstream(up)
        .control_plane(&shadow_govd)
        .start(dir.path())
        .await;
    let enforced = agent("order", "order-enforce")
        .upstream(up)
        .control_plane(&enforce_govd)
        .start(dir.path())
        .await;
    let applied = govc(
        &shadow_govd,
        Some(TOKEN),
        &["apply", "--shadow", "--wait", "10s", &policy],
    )
    .await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert!(applied.stdout.contains("mode shadow"), "{}", applied.stdout);
    let applied = govc(
        &enforce_govd,
        Some(TOKEN),
        &["apply", "--wait", "10s", &policy],
    )
    .await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    wait_until("both agents synced", Duration::from_secs(15), async || {
        all_synced(&shadow_govd, &["order-shadow"]).await
            && all_synced(&enforce_govd, &["order-enforce"]).await
    })
    .await;

    // Bounded load: 4 workers, 600 calls in all (about 3 s), at most 20 s.
    const WORKERS: usize = 4;
    const CALLS: usize = 600;
    let sent = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let sent = sent.clone();
            let (a, b) = (shadowed.inbound, enforced.inbound);
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while sent.fetch_add(1, Ordering::SeqCst) < CALLS
                    && started.elapsed() < Duration::from_secs(20)
                {
                    answers.push(tokio::join!(
                        http_get(a, "/api/orders"),
                        http_get(b, "/api/orders")
                    ));
                    // About 200 calls a second in all: the load spans
                    // several windows.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answers
            })
        })
        .collect();
    let (mut calls, mut enforced_rejections) = (0u64, 0u64);
    for w in workers {
        for (s, e) in w.await.unwrap() {
            calls += 1;
            assert_eq!(
                (s.0, &s.1),
                (200, &None),
                "the shadow agent rejected a call"
            );
            match e {
                (200, None, _) => {}
                (429, Some(rule), _) if rule == "order/api_rate" => enforced_rejections += 1,
                other => panic!("unexpected answer of the enforced agent: {other:?}"),
            }
        }
    }
    let shadow_metrics = http_get(shadowed.admin, "/metrics").await.2;
    let enforce_metrics = http_get(enforced.admin, "/metrics").await.2;
    let would = sample(
        &shadow_metrics,
        "gov_agent_shadow_rejected_total{rule=\"order/api_rate\",reason=\"limit_calls\"}",
    );
    let rejected = sample(
        &enforce_metrics,
        "gov_agent_rule_rejected_total{rule=\"order/api_rate\",reason=\"limit_calls\"}",
    );
    eprintln!("{calls} calls: shadow would have rejected {would}, enforced rejected {rejected}");
    assert_eq!(rejected, enforced_rejections);
    assert_eq!(
        sample(
            &shadow_metrics,
            "gov_agent_rule_rejected_total{rule=\"order/api_rate\",reason=\"limit_calls\"}"
        ),
        0
    );
    assert!(
        rejected > 0,
        "{calls} calls never exceeded 20 per second: the load proves nothing"
    );
    assert!(
        would.abs_diff(rejected) <= 20,
        "shadow counted {would} would-be rejections, enforced rejected {rejected} of {calls} calls"
    );

    // govd shows the rule in shadow, for how long, and what it would have
    // rejected (once the agent's stats have arrived).
    wait_until(
        "the shadow counts in govd",
        Duration::from_secs(10),
        async || {
            let view = shadow_govd.status().await;
            view.rules.iter().any(|r| {
                r.rule == "order/api_rate"
                    && r.mode() == pb::Mode::Shadow
                    && r.shadow_since_unix_ms > 0
                    && r.stats
                        .as_ref()
                        .and_then(|s| s.shadow_rejected.as_ref())
                        .is_some_and(|x| x.limit_calls == would)
            })
        },
    )
    .await;
    let status = govc(&shadow_govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let row = status
        .stdout
        .lines()
        .find(|l| l.starts_with("order/api_rate"))
        .unwrap_or_else(|| panic!("no shadow row:\n{}", status.stdout));
    assert!(
        row.contains("SHADOW") && row.contains(&format!("{would} (limit_calls {would})")),
        "{row}"
    );
    let json = govc(&shadow_govd, Some(VIEWER_TOKEN), &["status", "-o", "json"]).await;
    let view: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let rule = &view["rules"][0];
    assert_eq!(rule["mode"], "shadow", "{rule}");
    assert!(
        rule["shadow_since_unix_ms"].as_u64().is_some_and(|t| t > 0),
        "{rule}"
    );
    // The audit says the apply was a shadow one.
    let audit = govc(&shadow_govd, Some(TOKEN), &["audit", "-o", "json"]).await;
    assert!(
        audit.stdout.contains("govc apply --shadow"),
        "{}",
        audit.stdout
    );

    // Enforced by a plain apply: no longer in shadow, nothing re-pushed that
    // loses its state (the engine keeps an unchanged rule's state).
    let applied = govc(
        &shadow_govd,
        Some(TOKEN),
        &["apply", "--wait", "10s", &policy],
    )
    .await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let view = shadow_govd.status().await;
    assert_eq!(view.rules[0].mode(), pb::Mode::Enforce);
    assert_eq!(view.rules[0].shadow_since_unix_ms, 0);

    shadowed.stop().await;
    enforced.stop().await;
    shadow_govd.stop().await;
    enforce_govd.stop().await;
}
