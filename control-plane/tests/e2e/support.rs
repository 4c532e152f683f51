//! The harness the scenarios share: builders for `govd`, `gov-agent` and
//! `govc`, real hyper upstreams, calls through an agent, and a PKI.

pub use std::net::SocketAddr;
pub use std::path::{Path, PathBuf};
pub use std::process::Stdio;
pub use std::sync::Arc;
pub use std::sync::atomic::{AtomicUsize, Ordering};
pub use std::time::{Duration, Instant};

pub use gov_proto::v1 as pb;
pub use http_body_util::Full;
pub use hyper::body::Bytes;
pub use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
pub use tokio::process::{Child, Command};

use super::pki::Pki;

/// The admin token (named `e2e`), the operator's and the viewer's.
pub const TOKEN: &str = "e2e-admin-token";
pub const OPERATOR_TOKEN: &str = "e2e-operator-token";
pub const VIEWER_TOKEN: &str = "e2e-viewer-token";
/// govd's token file: one `name token role` line each.
pub const TOKEN_FILE: &str = "# the e2e tests' people\ne2e e2e-admin-token admin\noncall e2e-operator-token operator\nboard e2e-viewer-token viewer\n# and agents, one token per service\norder-agents e2e-agent-order agent order\npayment-agents e2e-agent-payment agent payment\ninv-agents e2e-agent-inv agent inv\nweb-agents e2e-agent-web agent web\nshop-agents e2e-agent-shop agent order,payment\n";
/// The `--agent-token-file` token (any service).
pub const AGENT_TOKEN: &str = "e2e-agent-token";

/// The token of `TOKEN_FILE`'s `agent` line for `service`.
pub fn service_agent_token(service: &str) -> String {
    format!("e2e-agent-{service}")
}

// === binaries ===

pub fn target_dir() -> PathBuf {
    // .../target/debug/deps/e2e-HASH -> .../target/debug
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

pub fn binary(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "`{}` is missing: build it first with `cargo build -j2 -p gov-agent -p govc` \
         (cargo test --workspace does it)",
        path.display()
    );
    path
}

pub fn govd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_govd"))
}

/// Polls `f` every 50ms until it is true or `timeout` passes.
pub async fn wait_until(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
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
pub async fn log_field(log: &Path, marker: &str, key: &str) -> SocketAddr {
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

pub struct ControlPlaneBuilder {
    pub state_dir: PathBuf,
    /// `--store URL` instead of `--state-dir` (logs still go beside `state_dir`).
    pub store: Option<String>,
    pub token: bool,
    pub agent_token: bool,
    pub metrics: bool,
    pub tls: Option<Pki>,
    pub args: Vec<String>,
}

pub fn control_plane(state_dir: &Path) -> ControlPlaneBuilder {
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

pub struct Govd {
    pub child: Child,
    pub addr: SocketAddr,
    /// With [`ControlPlaneBuilder::metrics`].
    pub metrics: Option<SocketAddr>,
    pub log: PathBuf,
    /// With TLS: the CA that signed govd's certificate.
    pub ca: Option<PathBuf>,
}

impl ControlPlaneBuilder {
    /// Agents must present `AGENT_TOKEN`.
    pub fn agent_token(mut self) -> Self {
        self.agent_token = true;
        self
    }

    /// A metrics listener (`--metrics-listen 127.0.0.1:0`).
    pub fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// More flags.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// TLS with `pki`'s server certificate, and mutual TLS for agents with
    /// its CA.
    pub fn tls(mut self, pki: &Pki) -> Self {
        self.tls = Some(pki.clone());
        self
    }

    /// Starts `govd` on `127.0.0.1:0` (or on `port`, for a restart).
    pub async fn start_on(self, port: u16) -> Govd {
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

    pub async fn start(self) -> Govd {
        self.start_on(0).await
    }
}

impl Govd {
    pub fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub async fn client(
        &self,
    ) -> pb::control_plane_client::ControlPlaneClient<tonic::transport::Channel> {
        let tls = gov_common::tls::ClientTls::read(&gov_common::tls::ClientTlsFiles {
            ca: self.ca.clone(),
            ..Default::default()
        })
        .unwrap();
        gov_control_plane::client::connect_tls(&self.url(), &tls, Duration::from_secs(5))
            .await
            .unwrap()
    }

    pub async fn status(&self) -> pb::ClusterView {
        self.client()
            .await
            .status(as_viewer(pb::StatusRequest::default()))
            .await
            .unwrap()
            .into_inner()
    }

    /// Waits (10 s at most) until it knows `n` agents.
    pub async fn wait_for_agents(&self, n: usize) {
        wait_until(
            "the agents connected",
            Duration::from_secs(10),
            async || self.status().await.agents.len() == n,
        )
        .await;
    }

    /// SIGKILL: no flush, no goodbye (the harshest restart).
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM and wait (bounded) for a clean exit.
    pub async fn stop(self) {
        self.stop_within(Duration::from_secs(10)).await;
    }

    /// SIGTERM and wait at most `bound` for a clean exit (a large state takes
    /// a debug build longer to write).
    pub async fn stop_within(mut self, bound: Duration) {
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
pub fn as_viewer<T>(message: T) -> tonic::Request<T> {
    as_token(VIEWER_TOKEN, message)
}

/// `message` with `token`.
pub fn as_token<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    gov_control_plane::auth::authorize(&mut request, token).unwrap();
    request
}

/// Sends `sig` with kill(2) (no `kill` binary needed).
pub fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), sig).unwrap();
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

pub fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

// === gov-agent ===

pub struct AgentBuilder {
    pub service: String,
    pub instance: String,
    pub upstream: SocketAddr,
    pub control_plane: String,
    pub state_dir: Option<PathBuf>,
    pub token: AgentToken,
    pub outbound: bool,
    pub args: Vec<std::ffi::OsString>,
    /// `GOV_LOG` (`info` unless told).
    pub log_filter: String,
}

pub fn agent(service: &str, instance: &str) -> AgentBuilder {
    AgentBuilder {
        service: service.into(),
        instance: instance.into(),
        upstream: SocketAddr::from(([127, 0, 0, 1], 1)),
        control_plane: String::new(),
        state_dir: None,
        token: AgentToken::Service,
        outbound: false,
        args: Vec::new(),
        log_filter: "info".into(),
    }
}

/// What an agent presents to govd.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum AgentToken {
    /// Its service's token (`TOKEN_FILE`'s `agent` line).
    Service,
    /// The `--agent-token-file` token ([`ControlPlaneBuilder::agent_token`]).
    Shared,
    None,
}

pub struct Agent {
    pub child: Child,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    /// With [`AgentBuilder::outbound`].
    pub outbound: Option<SocketAddr>,
    pub log: PathBuf,
}

impl AgentBuilder {
    pub fn upstream(mut self, addr: SocketAddr) -> Self {
        self.upstream = addr;
        self
    }
    /// TLS to govd with `pki`'s CA and the certificate `cert` (a name from
    /// [`Pki::agent`]).
    pub fn tls(mut self, pki: &Pki, cert: Option<&(PathBuf, PathBuf)>) -> Self {
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
    pub fn control_plane(self, govd: &Govd) -> Self {
        self.control_plane_url(govd.url())
    }
    pub fn control_plane_url(mut self, url: String) -> Self {
        self.control_plane = url;
        self
    }
    /// The `--agent-token-file` token instead of its service's.
    pub fn token(mut self) -> Self {
        self.token = AgentToken::Shared;
        self
    }
    /// No token at all.
    pub fn no_token(mut self) -> Self {
        self.token = AgentToken::None;
        self
    }
    pub fn state_dir(mut self, dir: &Path) -> Self {
        self.state_dir = Some(dir.to_owned());
        self
    }
    /// Also an outbound listener (no `--instances`: govd says where calls go).
    /// Its logs filtered by `filter` (`GOV_LOG`), not `info`.
    pub fn log_filter(mut self, filter: &str) -> Self {
        filter.clone_into(&mut self.log_filter);
        self
    }

    pub fn outbound(mut self) -> Self {
        self.outbound = true;
        self
    }
    pub async fn start(self, logs: &Path) -> Agent {
        let log = logs.join(format!("agent-{}-{}.log", self.instance, rand_suffix()));
        let mut cmd = Command::new(binary("gov-agent"));
        cmd.args(["--service", &self.service, "--instance", &self.instance])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .arg("--upstream")
            .arg(self.upstream.to_string())
            .arg("--control-plane")
            .arg(&self.control_plane)
            .args(["--drain-timeout", "1s"])
            .env("GOV_LOG", &self.log_filter)
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
    pub async fn configs_applied(&self) -> u64 {
        let (_, _, body) = http_get(self.admin, "/metrics").await;
        body.lines()
            .find(|l| l.starts_with("gov_agent_config_reloads_total{result=\"applied\"}"))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(0)
    }

    pub async fn stop(mut self) {
        signal(&self.child, rustix::process::Signal::TERM);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    /// SIGKILL (`kill -9`): no shutdown step runs.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

// === the upstream: a real hyper server ===

/// An upstream whose every path answers 500, counting the calls that reach it.
pub async fn failing_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
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
pub async fn upstream() -> SocketAddr {
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
pub async fn named_upstream(name: &'static str) -> SocketAddr {
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
pub async fn gated_upstream(
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
pub async fn call(outbound: SocketAddr, service: &str) -> (u16, String) {
    call_with(outbound, service, "/x", "").await
}

/// One GET of `path` through an agent's outbound listener to `service`,
/// with `headers` (whole `name: value\r\n` lines): (status, body); `(0, "")`
/// when no answer came within 10 s.
pub async fn call_with(
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
pub async fn apply_inv_and_web(govd: &Govd, dir: &Path, inv: &str) {
    let text = format!("service inv {{\n{inv}}}\nservice web {{\n  capacity workers 10\n}}\n");
    let policy = write(dir, "p.gov", &text);
    let applied = govc(govd, Some(TOKEN), &["apply", &policy]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
}

/// An instance `inv-NAME` of `inv` whose upstream answers `NAME`.
pub async fn inv_instance(govd: &Govd, dir: &Path, name: &'static str) -> Agent {
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
pub async fn reached(caller: SocketAddr, want: usize) -> Vec<String> {
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
pub fn load_through(caller: SocketAddr) -> tokio::task::JoinHandle<Vec<(u16, String)>> {
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
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, Option<String>, String) {
    http_get_with(addr, path, "").await
}

/// [`http_get`] as `consumer` (the `x-gov-consumer` header).
pub async fn http_get_as(
    addr: SocketAddr,
    path: &str,
    consumer: &str,
) -> (u16, Option<String>, String) {
    http_get_with(addr, path, &format!("x-gov-consumer: {consumer}\r\n")).await
}

/// [`http_get`] with `headers` (whole `name: value\r\n` lines).
pub async fn http_get_with(
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
pub async fn slow_burst(agent: SocketAddr, n: usize) -> (usize, usize) {
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

pub struct Govc {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub async fn govc(govd: &Govd, token: Option<&str>, args: &[&str]) -> Govc {
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

pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

pub fn agent_state(view: &pb::ClusterView, instance: &str) -> pb::AgentView {
    view.agents
        .iter()
        .find(|a| a.instance == instance)
        .cloned()
        .unwrap_or_else(|| panic!("no agent {instance} in {view:?}"))
}

pub async fn all_synced(govd: &Govd, instances: &[&str]) -> bool {
    let view = govd.status().await;
    instances.iter().all(|i| {
        view.agents
            .iter()
            .any(|a| a.instance == *i && a.state() == pb::SyncState::Synced)
    })
}

/// govc's stderr with miette's wrapping undone: words joined by one space.
pub fn flat(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| *w != "│")
        .collect::<Vec<_>>()
        .join(" ")
}

/// A counter sample of `/metrics` text (0 when absent).
pub fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The state directory made read-only for as long as it lives: by
/// permissions, or (for root, whom permissions do not stop) by the
/// immutable attribute, or, where neither is available, by making govd's
/// temp files of the parts an apply and a release of `order/errors` write
/// first (`policy.json`, its release) impossible to create. Restored on drop.
pub struct ReadOnly {
    dir: PathBuf,
    immutable: bool,
    blockers: Vec<PathBuf>,
}

impl ReadOnly {
    pub fn new(dir: &Path, govd: &Govd) -> Self {
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
                gov_control_plane::latch::LatchKind::Fuse,
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
