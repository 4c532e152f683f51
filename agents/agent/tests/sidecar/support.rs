//! Loopback fixtures for the sidecar tests: a real upstream HTTP server, the agent in
//! process or as the built binary, and a pooled HTTP client. Builders read like the
//! scenario: `upstream().fast("/fast", ms(1)).slow("/slow", ms(100)).start()`,
//! `agent().config(yaml).upstream(&up).start()`.

#![allow(dead_code, reason = "each test uses a different part of the fixtures")]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gov_agent::sidecar::{Balance, Options, Sidecar, UpstreamProtocol};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// === upstream ===

#[derive(Clone)]
enum Behaviour {
    /// 200 with the path as body after a delay.
    Delay(Duration),
    /// 200 with the path as body after a delay that runs to its end whatever
    /// the agent does with the request, as a servlet's worker thread does: a
    /// reset or a closed connection does not stop the work.
    Work(Duration),
    /// 200 with the request body as body.
    Echo,
    /// 200 at once, before the request body is read; the body is then read
    /// to its end and discarded, as nginx does with a body it does not want,
    /// so the connection is not reset under the data still coming.
    Early,
    /// 200 with this many bytes.
    Sized(usize),
    /// 500 while the upstream's `failing` flag is set, else 200.
    Flaky,
    /// 200 after the upstream's delay now ([`Upstream::set_delay`]).
    Tunable,
    /// The request body back, then a `grpc-status: 0` trailer (as gRPC answers).
    Trailers,
    /// 200 with the request's `gov-would-reject-by` values as body (`|`
    /// between two headers), `-` when it has none.
    WouldRejectBy,
    /// 200 with the path as body once the upstream's gate is open (held in flight
    /// until the test says so, however busy the machine).
    Gated,
}

/// Builds a real upstream server on 127.0.0.1:0.
pub fn upstream() -> UpstreamBuilder {
    UpstreamBuilder::default()
}

#[derive(Default)]
pub struct UpstreamBuilder {
    routes: HashMap<String, Behaviour>,
    delay: Duration,
}

impl UpstreamBuilder {
    /// `path` answers 200 after `delay`.
    pub fn fast(mut self, path: &str, delay: Duration) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Delay(delay));
        self
    }

    /// `path` answers 200 after `delay` (a slow IO endpoint).
    /// `path` answers after `delay` of work the agent cannot cancel
    /// (counted in flight until it is done).
    pub fn working(mut self, path: &str, delay: Duration) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Work(delay));
        self
    }

    pub fn slow(self, path: &str, delay: Duration) -> Self {
        self.fast(path, delay)
    }

    /// `path` echoes the request body.
    pub fn echo(mut self, path: &str) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Echo);
        self
    }

    /// `path` answers 200 before it reads the request body, then reads
    /// (discards) the rest ([`Behaviour::Early`]). `fast(path, ms(0))` answers
    /// as early but closes the connection with the body unread, which makes
    /// the kernel reset it.
    pub fn early(mut self, path: &str) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Early);
        self
    }

    /// `path` answers with `bytes` bytes.
    pub fn sized(mut self, path: &str, bytes: usize) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Sized(bytes));
        self
    }

    /// `path` echoes the body and ends with a `grpc-status: 0` trailer.
    pub fn trailers(mut self, path: &str) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Trailers);
        self
    }

    /// `path` answers with the `gov-would-reject-by` headers it received.
    pub fn would_reject_by(mut self, path: &str) -> Self {
        self.routes
            .insert(path.to_owned(), Behaviour::WouldRejectBy);
        self
    }

    /// `path` stays in flight until [`Upstream::open_gate`], then answers 200.
    pub fn gated(mut self, path: &str) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Gated);
        self
    }

    /// `path` answers 200 after `delay`, changed by [`Upstream::set_delay`].
    pub fn tunable(mut self, path: &str, delay: Duration) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Tunable);
        self.delay = delay;
        self
    }

    /// `path` answers 500 while [`Upstream::set_failing`] is on.
    pub fn flaky(mut self, path: &str) -> Self {
        self.routes.insert(path.to_owned(), Behaviour::Flaky);
        self
    }

    pub async fn start(self) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState {
            routes: self.routes,
            in_flight: Default::default(),
            received: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            gate: tokio::sync::watch::channel(false).0,
            delay_us: AtomicU64::new(u64::try_from(self.delay.as_micros()).unwrap()),
        });
        let task_state = state.clone();
        let conns = Arc::new(std::sync::Mutex::new(tokio::task::JoinSet::new()));
        let task_conns = conns.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let state = task_state.clone();
                // Connections live in a set that `kill` shuts down.
                let mut conns = task_conns.lock().unwrap();
                while conns.try_join_next().is_some() {}
                conns.spawn(async move {
                    let service = service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(state.answer(req).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                drop(conns);
            }
        });
        Upstream {
            addr,
            state,
            task,
            conns,
        }
    }
}

struct UpstreamState {
    routes: HashMap<String, Behaviour>,
    /// Per path: (in flight now, the most ever in flight at once).
    in_flight: std::sync::Mutex<HashMap<String, (u64, u64)>>,
    received: AtomicU64,
    completed: AtomicU64,
    failing: AtomicBool,
    /// Opens the `gated` routes.
    gate: tokio::sync::watch::Sender<bool>,
    /// The `tunable` routes' delay.
    delay_us: AtomicU64,
}

impl UpstreamState {
    async fn answer(self: Arc<Self>, req: Request<Incoming>) -> Response<UpstreamBody> {
        self.received.fetch_add(1, Ordering::SeqCst);
        let version = format!("{:?}", req.version());
        let behaviour = self.routes.get(req.uri().path()).cloned();
        let response = match behaviour {
            None => status(StatusCode::NOT_FOUND, "no such route\n"),
            Some(Behaviour::Delay(delay)) => {
                let path = req.uri().path().to_owned();
                self.enter(&path, 1);
                tokio::time::sleep(delay).await;
                self.enter(&path, -1);
                status(StatusCode::OK, path)
            }
            Some(Behaviour::Tunable) => {
                let path = req.uri().path().to_owned();
                self.enter(&path, 1);
                let delay = Duration::from_micros(self.delay_us.load(Ordering::SeqCst));
                tokio::time::sleep(delay).await;
                self.enter(&path, -1);
                status(StatusCode::OK, path)
            }
            Some(Behaviour::Work(delay)) => {
                let path = req.uri().path().to_owned();
                self.enter(&path, 1);
                let state = self.clone();
                let work = tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    state.enter(&path, -1);
                    path
                });
                match work.await {
                    Ok(path) => status(StatusCode::OK, path),
                    Err(_) => status(StatusCode::INTERNAL_SERVER_ERROR, "work failed\n"),
                }
            }
            Some(Behaviour::Gated) => {
                let path = req.uri().path().to_owned();
                self.enter(&path, 1);
                let mut gate = self.gate.subscribe();
                let _ = gate.wait_for(|open| *open).await;
                self.enter(&path, -1);
                status(StatusCode::OK, path)
            }
            Some(Behaviour::Echo) => {
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                match body {
                    Ok(body) => Response::new(Full::new(body)),
                    Err(_) => status(StatusCode::BAD_REQUEST, "body failed\n"),
                }
            }
            Some(Behaviour::Early) => {
                let path = req.uri().path().to_owned();
                let mut body = req.into_body();
                tokio::spawn(async move { while body.frame().await.is_some_and(|f| f.is_ok()) {} });
                status(StatusCode::OK, path)
            }
            Some(Behaviour::WouldRejectBy) => {
                let seen: Vec<&str> = req
                    .headers()
                    .get_all(gov_engine::WOULD_REJECT_BY)
                    .iter()
                    .map(|v| v.to_str().unwrap_or("<not text>"))
                    .collect();
                let body = if seen.is_empty() {
                    "-".to_owned()
                } else {
                    seen.join("|")
                };
                status(StatusCode::OK, body)
            }
            Some(Behaviour::Sized(n)) => Response::new(Full::new(Bytes::from(vec![b'x'; n]))),
            Some(Behaviour::Flaky) => {
                if self.failing.load(Ordering::SeqCst) {
                    status(StatusCode::INTERNAL_SERVER_ERROR, "failing\n")
                } else {
                    status(StatusCode::OK, "ok\n")
                }
            }
            Some(Behaviour::Trailers) => {
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let frames = [
                    Ok::<_, Infallible>(hyper::body::Frame::data(body.unwrap_or_default())),
                    Ok(hyper::body::Frame::trailers(trailers)),
                ];
                let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
                let mut response = Response::new(body.boxed_unsync());
                response.headers_mut().insert(
                    "x-upstream-version",
                    http::HeaderValue::from_str(&version).unwrap(),
                );
                self.completed.fetch_add(1, Ordering::SeqCst);
                return response;
            }
        };
        let mut response = response.map(|b| b.boxed_unsync());
        response.headers_mut().insert(
            "x-upstream-version",
            http::HeaderValue::from_str(&version).unwrap(),
        );
        response
            .headers_mut()
            .insert("x-upstream", http::HeaderValue::from_static("1"));
        self.completed.fetch_add(1, Ordering::SeqCst);
        response
    }
}

impl UpstreamState {
    fn enter(&self, path: &str, delta: i64) {
        let mut map = self.in_flight.lock().unwrap();
        let entry = map.entry(path.to_owned()).or_default();
        entry.0 = entry.0.checked_add_signed(delta).unwrap();
        entry.1 = entry.1.max(entry.0);
    }
}

type UpstreamBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

fn status(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = code;
    response
}

/// A running upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
    task: tokio::task::JoinHandle<()>,
    /// Its connections' tasks.
    conns: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
}

impl Upstream {
    /// A stand-in for an upstream that is not a fixture (a raw socket, or nothing), so
    /// that the agent builder can point at it. Its counters stay at zero.
    pub fn at(addr: SocketAddr) -> Self {
        Self {
            addr,
            state: Arc::new(UpstreamState {
                routes: HashMap::new(),
                in_flight: Default::default(),
                received: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                failing: AtomicBool::new(false),
                gate: tokio::sync::watch::channel(false).0,
                delay_us: AtomicU64::new(0),
            }),
            task: tokio::spawn(async {}),
            conns: Default::default(),
        }
    }

    /// Kills the upstream as a crashed process goes: its port is closed and every
    /// connection to it too, by the time this returns.
    pub async fn kill(mut self) {
        self.task.abort();
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
        let mut conns = std::mem::take(&mut *self.conns.lock().unwrap());
        conns.shutdown().await;
    }

    /// Requests that reached the upstream.
    pub fn received(&self) -> u64 {
        self.state.received.load(Ordering::SeqCst)
    }

    /// Requests the upstream answered.
    pub fn completed(&self) -> u64 {
        self.state.completed.load(Ordering::SeqCst)
    }

    /// The most requests to `path` (a `fast`/`slow` route) ever in flight at once.
    pub fn peak_in_flight(&self, path: &str) -> u64 {
        self.state
            .in_flight
            .lock()
            .unwrap()
            .get(path)
            .map_or(0, |e| e.1)
    }

    /// Requests to `path` (a `fast`/`slow`/`gated` route) in flight now.
    pub fn in_flight(&self, path: &str) -> u64 {
        self.state
            .in_flight
            .lock()
            .unwrap()
            .get(path)
            .map_or(0, |e| e.0)
    }

    /// Lets every `gated` request, held and future, answer.
    pub fn open_gate(&self) {
        self.state.gate.send_replace(true);
    }

    /// The delay of the `tunable` routes from now on.
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap();
        self.state.delay_us.store(us, Ordering::SeqCst);
    }

    /// Makes the `flaky` routes answer 500 (or 200 again).
    pub fn set_failing(&self, failing: bool) {
        self.state.failing.store(failing, Ordering::SeqCst);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === agent ===

/// Builds a gov-agent running in this process.
pub fn agent() -> AgentBuilder {
    AgentBuilder {
        config: None,
        upstream: None,
        outbound: false,
        instances: Vec::new(),
        drain: ms(5000),
        protocol: UpstreamProtocol::Http1,
        header_read_timeout: None,
        max_connections: None,
        max_connections_per_client: None,
        client_timeout: None,
        balance: Balance::default(),
        state_dir: None,
        decision_log: None,
        max_keys_per_rule: None,
        mtls: None,
        certificate_later: false,
        ingress: None,
        instance_addrs: Vec::new(),
    }
}

pub struct AgentBuilder {
    config: Option<String>,
    upstream: Option<SocketAddr>,
    outbound: bool,
    instances: Vec<(String, Vec<SocketAddr>)>,
    drain: Duration,
    protocol: UpstreamProtocol,
    header_read_timeout: Option<Duration>,
    max_connections: Option<usize>,
    max_connections_per_client: Option<usize>,
    client_timeout: Option<Duration>,
    balance: Balance,
    state_dir: Option<PathBuf>,
    decision_log: Option<gov_agent::decision_log::LogOptions>,
    max_keys_per_rule: Option<u32>,
    /// Mutual TLS between agents, and the certificate and key files.
    mtls: Option<(Arc<gov_agent::sidecar::PeerTls>, PathBuf, PathBuf)>,
    /// Start without waiting for the certificate files to be read.
    certificate_later: bool,
    /// `--inbound-tls-cert` and its key.
    ingress: Option<(PathBuf, PathBuf)>,
    /// Outbound instances by address (another agent's listener).
    instance_addrs: Vec<(String, Vec<SocketAddr>)>,
}

impl AgentBuilder {
    /// How the outbound listener balances (default: the agent's).
    pub fn balance(mut self, balance: Balance) -> Self {
        self.balance = balance;
        self
    }

    /// Log each call's decisions (`--decision-log`).
    pub fn decision_log(mut self, log: gov_agent::decision_log::LogOptions) -> Self {
        self.decision_log = Some(log);
        self
    }

    /// Where the agent keeps its latches (`--state-dir`).
    pub fn state_dir(mut self, dir: &Path) -> Self {
        self.state_dir = Some(dir.to_owned());
        self
    }

    /// How long clients may take to send a request head (default: the agent's).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = Some(timeout);
        self
    }

    /// How long a client may stall a body or stop reading.
    pub fn client_timeout(mut self, timeout: Duration) -> Self {
        self.client_timeout = Some(timeout);
        self
    }

    /// Most open client connections per proxy listener.
    pub fn max_keys_per_rule(mut self, max: u32) -> Self {
        self.max_keys_per_rule = Some(max);
        self
    }

    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = Some(max);
        self
    }

    /// Most open connections of one client address on the inbound listener.
    pub fn max_connections_per_client(mut self, max: usize) -> Self {
        self.max_connections_per_client = Some(max);
        self
    }

    /// The protocol the agent speaks to upstreams.
    pub fn upstream_protocol(mut self, protocol: UpstreamProtocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// The `TargetConfig` YAML (with the compiler's values filled in, see
    /// [`compiled`]), written to a file the agent watches.
    pub fn config(mut self, yaml: &str) -> Self {
        self.config = Some(compiled(yaml));
        self
    }

    pub fn upstream(mut self, upstream: &Upstream) -> Self {
        self.upstream = Some(upstream.addr);
        self
    }

    /// Mutual TLS between agents by `mtls`, with the certificate (and key)
    /// in these PEM files.
    pub fn mtls(mut self, mtls: gov_agent::sidecar::PeerTls, cert: &Path, key: &Path) -> Self {
        self.mtls = Some((Arc::new(mtls), cert.to_owned(), key.to_owned()));
        self
    }

    /// The certificate the inbound listener presents to clients that name
    /// a server (`--inbound-tls-cert`, `--inbound-tls-key`).
    pub fn ingress(mut self, cert: &Path, key: &Path) -> Self {
        self.ingress = Some((cert.to_owned(), key.to_owned()));
        self
    }

    /// Start before the certificate files exist (they are read every 2 s).
    pub fn certificate_later(mut self) -> Self {
        self.certificate_later = true;
        self
    }

    /// Also listen for outbound calls, to `service` at these addresses
    /// (other agents' inbound listeners).
    pub fn instance_addrs(mut self, service: &str, addrs: &[SocketAddr]) -> Self {
        self.outbound = true;
        self.instance_addrs
            .push((service.to_owned(), addrs.to_vec()));
        self
    }

    /// Also listen for outbound calls, to these instances of `service`.
    pub fn instances(mut self, service: &str, instances: &[&Upstream]) -> Self {
        self.outbound = true;
        self.instances.push((
            service.to_owned(),
            instances.iter().map(|u| u.addr).collect(),
        ));
        self
    }

    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    pub async fn start(self) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("target.yaml");
        let upstream = self
            .upstream
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9)));
        let mut options = Options::new("shop", upstream.to_string().parse().unwrap());
        options.admin_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        options.drain_timeout = self.drain;
        options.upstream_protocol = self.protocol;
        options.balance = self.balance;
        if let Some(timeout) = self.header_read_timeout {
            options.header_read_timeout = Some(timeout);
        }
        if let Some(max) = self.max_connections {
            options.max_connections = max;
        }
        if let Some(max) = self.max_connections_per_client {
            options.max_connections_per_client = max;
        }
        if let Some(timeout) = self.client_timeout {
            options.client_timeout = Some(timeout);
        }
        if let Some(max) = self.max_keys_per_rule {
            options.max_keys_per_rule = max;
        }
        options.state_dir = self.state_dir.clone();
        options.decision_log = self.decision_log.clone();
        if let Some(yaml) = &self.config {
            std::fs::write(&config_path, yaml).unwrap();
            options.config = Some(config_path.clone());
        }
        if let Some((mtls, _, _)) = &self.mtls {
            options.mtls = mtls.clone();
        }
        if self.outbound {
            options.outbound_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
            options.instances = self
                .instances
                .iter()
                .chain(&self.instance_addrs)
                .map(|(name, addrs)| {
                    let addrs = addrs
                        .iter()
                        .map(|a| a.to_string().parse().unwrap())
                        .collect();
                    (name.clone(), addrs)
                })
                .collect();
        }
        let sidecar = Sidecar::start(options).await.unwrap();
        if let Some((_, cert, key)) = &self.mtls {
            let credentials = gov_agent::identity::watch_files(
                cert.clone(),
                key.clone(),
                gov_agent::identity::FILE_POLL,
                None,
                sidecar.stopping(),
            );
            if !self.certificate_later {
                credentials.wait(&sidecar.stopping()).await.unwrap();
            }
            sidecar.use_credentials(credentials);
        }
        if let Some((cert, key)) = &self.ingress {
            let credentials = gov_agent::identity::watch_files(
                cert.clone(),
                key.clone(),
                gov_agent::identity::FILE_POLL,
                None,
                sidecar.stopping(),
            );
            credentials.wait(&sidecar.stopping()).await.unwrap();
            sidecar.use_ingress_credentials(credentials);
        }
        Agent {
            sidecar,
            config_path,
            _dir: dir,
        }
    }
}

/// A gov-agent running in this process.
pub struct Agent {
    pub sidecar: Sidecar,
    pub config_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Agent {
    /// A URL on the inbound listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.sidecar.inbound_addr())
    }

    /// A URL on the outbound listener.
    pub fn outbound_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.sidecar.outbound_addr().unwrap())
    }

    /// A URL on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.sidecar.admin_addr().unwrap())
    }

    /// Replaces the config file the way editors do: write a temporary file, rename it
    /// over the old one.
    pub fn write_config(&self, yaml: &str) {
        write_atomically(&self.config_path, &compiled(yaml));
    }
}

pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// === client ===

/// A pooled HTTP/1.1 client.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A complete response.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub fn http() -> Http {
    Http {
        client: Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build_http(),
    }
}

impl Http {
    pub async fn get(&self, url: &str) -> Result<Reply, String> {
        self.send(Request::get(url).body(Full::default()).unwrap())
            .await
    }

    pub async fn post(&self, url: &str, body: impl Into<Bytes>) -> Result<Reply, String> {
        self.send(Request::post(url).body(Full::new(body.into())).unwrap())
            .await
    }

    /// GET with extra headers.
    pub async fn get_with(&self, url: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
        let mut req = Request::get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req.body(Full::default()).unwrap()).await
    }

    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<Reply, String> {
        let response = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("body: {e:?}"))?
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

// === measuring ===

/// Sends `total` GETs of `url` from `concurrency` tasks; returns each status with its
/// latency (or the error). Bounded in count, and each request in time.
pub async fn load(
    client: &Http,
    url: &str,
    concurrency: usize,
    total: usize,
) -> Vec<Result<(StatusCode, Duration), String>> {
    let per_task = total.div_ceil(concurrency);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let url = url.to_owned();
        tasks.spawn(async move {
            let mut out = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let start = Instant::now();
                let result = tokio::time::timeout(Duration::from_secs(10), client.get(&url)).await;
                out.push(match result {
                    Ok(Ok(reply)) => Ok((reply.status, start.elapsed())),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err("timed out after 10s".to_owned()),
                });
            }
            out
        });
    }
    let mut all = Vec::with_capacity(total);
    while let Some(done) = tasks.join_next().await {
        all.extend(done.unwrap());
    }
    all
}

/// The `p`-quantile (0..=1) of `samples` (nearest rank).
pub fn quantile(samples: &[Duration], p: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples");
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

// === the built binary ===

/// Builds a `gov-agent` process (the binary cargo built for these tests).
pub fn binary() -> BinaryBuilder {
    BinaryBuilder {
        upstream: None,
        drain: ms(5000),
        config: None,
        state_dir: None,
        log_beside_config: false,
        close_stderr: false,
        workers: 1,
    }
}

pub struct BinaryBuilder {
    workers: usize,
    upstream: Option<SocketAddr>,
    drain: Duration,
    config: Option<String>,
    state_dir: Option<PathBuf>,
    log_beside_config: bool,
    close_stderr: bool,
}

impl BinaryBuilder {
    /// `--worker-threads`: above 1, each connection is served on one of that
    /// many threads, each with its own runtime.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Where the agent keeps its latches (`--state-dir`).
    pub fn state_dir(mut self, dir: &Path) -> Self {
        self.state_dir = Some(dir.to_owned());
        self
    }

    pub fn upstream(mut self, upstream: &Upstream) -> Self {
        self.upstream = Some(upstream.addr);
        self
    }

    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    pub fn config(mut self, yaml: &str) -> Self {
        self.config = Some(compiled(yaml));
        self
    }

    /// Closes the read end of stderr once the agent has started, as `| head` does.
    pub fn close_stderr_after_start(mut self) -> Self {
        self.close_stderr = true;
        self
    }

    /// Stderr to `agent.log` in the config file's directory (as a service manager
    /// writing logs next to the config would), instead of a pipe to the test.
    pub fn log_beside_config(mut self) -> Self {
        self.log_beside_config = true;
        self
    }

    /// Starts the process and waits (bounded) for its "started" log line, which says
    /// the ports it bound.
    pub fn spawn(self) -> Process {
        use std::io::BufRead;
        use std::process::{Command, Stdio};

        let dir = tempfile::tempdir().unwrap();
        let upstream = self.upstream.expect("an upstream");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gov-agent"));
        cmd.args(["--service", "shop", "--listen", "127.0.0.1:0"])
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(["--upstream", &upstream.to_string()])
            .args(["--drain-timeout", &format!("{}ms", self.drain.as_millis())])
            .args(["--worker-threads", &self.workers.to_string()])
            .env("GOV_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log_file = dir.path().join("agent.log");
        if self.log_beside_config {
            cmd.stderr(std::fs::File::create(&log_file).unwrap());
        } else {
            cmd.stderr(Stdio::piped());
        }
        if let Some(yaml) = &self.config {
            let path = dir.path().join("target.yaml");
            std::fs::write(&path, yaml).unwrap();
            cmd.arg("--config").arg(path);
        }
        if let Some(dir) = &self.state_dir {
            cmd.arg("--state-dir").arg(dir);
        }
        let mut child = cmd.spawn().unwrap();
        let log = if self.log_beside_config {
            Log::File(log_file)
        } else {
            let stderr = child.stderr.take().unwrap();
            let log = Arc::new(std::sync::Mutex::new(String::new()));
            let log_writer = log.clone();
            let close = self.close_stderr;
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let started = line.contains("gov-agent started");
                    log_writer.lock().unwrap().push_str(&line);
                    log_writer.lock().unwrap().push('\n');
                    if close && started {
                        // Returning drops the pipe's read end.
                        break;
                    }
                }
            });
            Log::Pipe(log)
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let started = loop {
            if let Some(line) = log.read().lines().find(|l| l.contains("gov-agent started")) {
                break line.to_owned();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("gov-agent did not start; log:\n{}", log.read());
            }
            std::thread::sleep(ms(10));
        };
        let field = |name: &str| -> SocketAddr {
            let start = started.find(&format!("{name}=")).unwrap() + name.len() + 1;
            let rest = &started[start..];
            let end = rest.find(' ').unwrap_or(rest.len());
            rest[..end].parse().unwrap()
        };
        Process {
            inbound: field("inbound"),
            admin: field("admin"),
            child,
            log,
            dir,
        }
    }
}

/// Where a [`Process`]'s stderr goes.
enum Log {
    /// Read by a thread into this buffer.
    Pipe(Arc<std::sync::Mutex<String>>),
    /// A file.
    File(PathBuf),
}

impl Log {
    fn read(&self) -> String {
        match self {
            Log::Pipe(log) => log.lock().unwrap().clone(),
            Log::File(path) => std::fs::read_to_string(path).unwrap_or_default(),
        }
    }
}

/// A running `gov-agent` process; killed on drop if still running.
pub struct Process {
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    child: std::process::Child,
    log: Log,
    dir: tempfile::TempDir,
}

impl Process {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.inbound)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
    }

    /// Sends SIGKILL and reaps the process: no shutdown step runs.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the exit code; `None` if it did not exit in time.
    pub fn wait(mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(ms(10));
        }
        eprintln!("gov-agent log:\n{}", self.log.read());
        None
    }

    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        self.log.read()
    }

    /// Its resident set size in KiB (`VmRSS`), while it runs.
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The `--config` file (with [`BinaryBuilder::config`]).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("target.yaml")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A hand-written `TargetConfig` YAML as `govc compile` would write it: what
/// it leaves out gets the compiler's values ([`gov_proto::compiled::fill`]).
/// Text that is no config is passed on as it is, for tests of bad files.
pub fn compiled(yaml: &str) -> String {
    match serde_yaml::from_str::<gov_proto::v1::TargetConfig>(yaml) {
        Ok(mut target) => {
            gov_proto::compiled::fill(&mut target);
            serde_yaml::to_string(&target).unwrap()
        }
        Err(_) => yaml.to_owned(),
    }
}
