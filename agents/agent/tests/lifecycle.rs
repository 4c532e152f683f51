//! The lifecycle through a real sidecar (in process) in front of a real upstream
//! (hyper, 127.0.0.1:0) that records every call: warmup gates `/ready` on the
//! readiness probe and starts consumers only after registering; shutdown
//! deregisters, keeps serving through the wait, stops consumers, then drains.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gov_agent::lifecycle::{FULL_WEIGHT, State};
use gov_agent::sidecar::{Options, Sidecar};
use gov_proto::v1 as proto;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proto::shutdown_step::Step as Down;
use proto::warmup_step::Step as Up;
use tokio::time::Instant;

/// An upstream that records `METHOD PATH` of every call with its time. `/health`
/// answers 503 for the first `not_ready` calls, `/slow` takes 300ms,
/// `POST /consumers/stop` waits while [`Upstream::hold_stop`] holds it, the rest
/// answer 200 at once.
struct Upstream {
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<(Instant, String)>>>,
    hold: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Upstream {
    async fn start(not_ready: u32) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let left = Arc::new(AtomicU32::new(not_ready));
        let hold = Arc::new(tokio::sync::watch::channel(false).0);
        let recorded = calls.clone();
        let held = hold.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (calls, left, held) = (recorded.clone(), left.clone(), held.clone());
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let (calls, left, held) = (calls.clone(), left.clone(), held.clone());
                    async move {
                        let path = req.uri().path().to_owned();
                        calls
                            .lock()
                            .unwrap()
                            .push((Instant::now(), format!("{} {path}", req.method())));
                        let status = match path.as_str() {
                            "/health" => {
                                let before = left
                                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                                        n.checked_sub(1)
                                    })
                                    .is_ok();
                                if before { 503 } else { 200 }
                            }
                            "/slow" => {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                200
                            }
                            "/consumers/stop" => {
                                let mut hold = held.subscribe();
                                let _ = hold.wait_for(|held| !*held).await;
                                200
                            }
                            _ => 200,
                        };
                        let mut response = http::Response::new(Full::new(Bytes::from("ok")));
                        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, calls, hold }
    }

    /// Holds `POST /consumers/stop` (the shutdown step before the drain) in flight
    /// until called with `false`.
    fn hold_stop(&self, hold: bool) {
        self.hold.send_replace(hold);
    }

    fn calls(&self) -> Vec<(Instant, String)> {
        self.calls.lock().unwrap().clone()
    }

    fn names(&self) -> Vec<String> {
        self.calls().into_iter().map(|(_, c)| c).collect()
    }

    fn time_of(&self, call: &str) -> Option<Instant> {
        self.calls()
            .into_iter()
            .find(|(_, c)| c == call)
            .map(|(t, _)| t)
    }
}

fn http_action(method: &str, path: &str) -> Option<proto::Action> {
    Some(proto::Action {
        kind: Some(proto::action::Kind::Http(proto::HttpCall {
            method: method.into(),
            path: path.into(),
        })),
    })
}

fn config(dir: &tempfile::TempDir, warmup: Vec<Up>, shutdown: Vec<Down>) -> std::path::PathBuf {
    let target = proto::TargetConfig {
        version: "v1".into(),
        warmup: Some(proto::Warmup {
            steps: warmup
                .into_iter()
                .map(|s| proto::WarmupStep {
                    source: None,
                    step: Some(s),
                })
                .collect(),
            source: None,
        }),
        shutdown: Some(proto::Shutdown {
            steps: shutdown
                .into_iter()
                .map(|s| proto::ShutdownStep {
                    source: None,
                    step: Some(s),
                })
                .collect(),
            source: None,
        }),
        ..gov_proto::compiled::target("order")
    };
    let path = dir.path().join("order.json");
    std::fs::write(&path, serde_json::to_vec(&target).unwrap()).unwrap();
    path
}

async fn start(upstream: &Upstream, config: std::path::PathBuf) -> Sidecar {
    let mut options = Options::new("order", upstream.addr.to_string().parse().unwrap());
    options.admin_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    options.config = Some(config);
    options.drain_timeout = Duration::from_secs(5);
    Sidecar::start(options).await.unwrap()
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn get(client: &HttpClient, addr: SocketAddr, path: &str) -> Result<u16, String> {
    let uri: http::Uri = format!("http://{addr}{path}").parse().unwrap();
    let response = client.get(uri).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(status)
}

async fn metrics(client: &HttpClient, sidecar: &Sidecar) -> String {
    let uri: http::Uri = format!("http://{}/metrics", sidecar.admin_addr().unwrap())
        .parse()
        .unwrap();
    let body = client.get(uri).await.unwrap().into_body().collect().await;
    String::from_utf8(body.unwrap().to_bytes().to_vec()).unwrap()
}

async fn ready(client: &HttpClient, sidecar: &Sidecar) -> u16 {
    get(client, sidecar.admin_addr().unwrap(), "/ready")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_gates_ready_on_the_probe_ramps_and_starts_consumers_after_registering() {
    let upstream = Upstream::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        &dir,
        vec![
            Up::Ready(proto::ReadyProbe {
                probe: Some(proto::HttpCall {
                    method: "GET".into(),
                    path: "/health".into(),
                }),
                status: 200,
                every_ms: 50,
                after_ms: 50,
                timeout_ms: 500,
            }),
            Up::Register(true),
            Up::Ramp(proto::Ramp {
                over_ms: 400,
                from_milli_percent: 10_000,
            }),
            Up::Start(proto::Invoke {
                what: "consumers".into(),
                action: http_action("POST", "/consumers/start"),
            }),
        ],
        vec![],
    );
    let sidecar = start(&upstream, path).await;
    let mut states = sidecar.lifecycle().subscribe();
    let client = client();

    // Not routable before the probe passed.
    assert_eq!(ready(&client, &sidecar).await, 503);
    let m = metrics(&client, &sidecar).await;
    assert!(
        m.contains("gov_agent_lifecycle_phase{phase=\"STARTING\"} 1"),
        "{m}"
    );
    assert!(m.contains("gov_agent_instance_weight_ratio 0\n"), "{m}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while ready(&client, &sidecar).await != 200 {
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Registered only after the fourth probe (three 503s, then 200), consumers
    // not started yet (the ramp runs first).
    let seen = upstream.names();
    assert_eq!(seen.iter().filter(|c| *c == "GET /health").count(), 4);
    assert!(!seen.contains(&"POST /consumers/start".to_owned()));

    // The weight rises to 100% and the phase ends READY.
    let mut weights = Vec::new();
    let done = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let s: State = *states.borrow_and_update();
            weights.push((s.phase, s.weight_milli_percent));
            if s.phase == proto::Phase::Ready {
                return;
            }
            states.changed().await.unwrap();
        }
    })
    .await;
    assert!(done.is_ok(), "never READY: {weights:?}");
    let ramp: Vec<u32> = weights
        .iter()
        .filter(|(p, _)| *p == proto::Phase::Warming)
        .map(|(_, w)| *w)
        .collect();
    assert!(ramp.len() >= 3, "{weights:?}");
    assert!(ramp.windows(2).all(|w| w[0] <= w[1]), "{weights:?}");
    assert!(ramp[0] < 50_000, "{weights:?}");
    assert_eq!(
        sidecar.lifecycle().state().weight_milli_percent,
        FULL_WEIGHT
    );
    let m = metrics(&client, &sidecar).await;
    assert!(
        m.contains("gov_agent_lifecycle_phase{phase=\"READY\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("gov_agent_lifecycle_phase{phase=\"STARTING\"} 0"),
        "{m}"
    );
    assert!(m.contains("gov_agent_instance_weight_ratio 1\n"), "{m}");

    // Consumers were started, once, after the last probe.
    let names = upstream.names();
    assert_eq!(
        names.last().map(String::as_str),
        Some("POST /consumers/start")
    );
    assert_eq!(
        names
            .iter()
            .filter(|c| *c == "POST /consumers/start")
            .count(),
        1
    );
    sidecar.shutdown();
    sidecar.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deregisters_keeps_serving_through_the_wait_stops_consumers_then_drains() {
    let upstream = Upstream::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        &dir,
        vec![],
        vec![
            Down::Deregister(true),
            Down::Wait(proto::Wait {
                duration_ms: 600,
                registry: String::new(),
            }),
            Down::Stop(proto::Invoke {
                what: "consumers".into(),
                action: http_action("POST", "/consumers/stop"),
            }),
            Down::DrainMs(3_000),
        ],
    );
    let sidecar = start(&upstream, path).await;
    let client = client();
    let inbound = sidecar.inbound_addr();
    assert_eq!(ready(&client, &sidecar).await, 200);
    assert_eq!(get(&client, inbound, "/orders").await, Ok(200));
    assert_eq!(sidecar.lifecycle().state().phase, proto::Phase::Ready);

    // The stop hook (the step after the wait) is held, so that the test sees the
    // moment the wait ends and the one the drain begins.
    upstream.hold_stop(true);
    let began = Instant::now();
    sidecar.terminate();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready(&client, &sidecar).await != 503 {
        assert!(Instant::now() < deadline, "never deregistered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(sidecar.lifecycle().state().phase, proto::Phase::Draining);

    // Through the whole wait, its last 100ms included, until the stop hook is
    // called: every request is served, on fresh connections too (bounded in count
    // and time).
    let (mut served, mut failed) = (0_u32, Vec::new());
    while upstream.time_of("POST /consumers/stop").is_none() {
        assert!(
            served < 100_000 && began.elapsed() < Duration::from_secs(30),
            "the stop hook was never called"
        );
        let c = if served % 10 == 0 {
            self::client()
        } else {
            client.clone()
        };
        match get(&c, inbound, "/orders").await {
            Ok(200) => served += 1,
            other => failed.push(other),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(failed.is_empty(), "failures during the wait: {failed:?}");
    let stop_at = upstream.time_of("POST /consumers/stop").unwrap();
    assert!(
        stop_at - began >= Duration::from_millis(600),
        "the wait ended after {:?}",
        stop_at - began
    );
    // The last request the upstream saw before the stop call came within the
    // wait's last 100ms (the loop sends one every few ms).
    let last = upstream
        .calls()
        .into_iter()
        .filter(|(t, c)| c == "GET /orders" && *t < stop_at)
        .map(|(t, _)| t)
        .max()
        .unwrap();
    assert!(
        stop_at - last < Duration::from_millis(100),
        "no request in the wait's last 100ms (last {:?} before its end)",
        stop_at - last
    );
    // The wait is over and consumers are stopping, but the drain has not begun:
    // still served, kept alive and fresh.
    assert_eq!(get(&client, inbound, "/orders").await, Ok(200));
    assert_eq!(get(&self::client(), inbound, "/orders").await, Ok(200));

    // A slow request in flight when the drain begins completes.
    let c = client.clone();
    let slow = tokio::spawn(async move { get(&c, inbound, "/slow").await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream.time_of("GET /slow").is_none() {
        assert!(Instant::now() < deadline, "the slow request never arrived");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    upstream.hold_stop(false);
    tokio::time::timeout(Duration::from_secs(10), sidecar.stopped())
        .await
        .expect("stopped within 10 s of the drain's start (drain 3 s)");
    assert_eq!(
        slow.await.unwrap(),
        Ok(200),
        "the request in flight when the drain began was answered"
    );
    // Consumers were stopped once.
    let names = upstream.names();
    assert_eq!(
        names
            .iter()
            .filter(|c| *c == "POST /consumers/stop")
            .count(),
        1
    );
    // New connections are refused once drained.
    let refused = tokio::net::TcpStream::connect(inbound).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// The `gov-agent` binary: SIGTERM runs the config's shutdown steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_runs_the_shutdown_steps_in_the_binary() {
    use std::io::BufRead as _;

    let upstream = Upstream::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        &dir,
        vec![],
        vec![
            Down::Deregister(true),
            Down::Wait(proto::Wait {
                duration_ms: 700,
                registry: String::new(),
            }),
            Down::Stop(proto::Invoke {
                what: "consumers".into(),
                action: http_action("POST", "/consumers/stop"),
            }),
            Down::DrainMs(2_000),
        ],
    );
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_gov-agent"))
        .args(["--service", "order", "--upstream"])
        .arg(upstream.addr.to_string())
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(&path)
        .env("GOV_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Killed and reaped on drop: a failing assertion leaks no process.
    let mut child = KillOnDrop(child);
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let started = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("gov-agent started") => break line,
            Ok(_) => {}
            Err(e) => panic!("no `gov-agent started` line within 30 s: {e}"),
        }
    };
    let addr = |key: &str| -> SocketAddr {
        let at = started.find(&format!("{key}=")).unwrap() + key.len() + 1;
        started[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (inbound, admin) = (addr("inbound"), addr("admin"));
    let client = client();
    assert_eq!(get(&client, admin, "/ready").await, Ok(200));

    upstream.hold_stop(true);
    let began = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(child.0.id()).unwrap()).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&client, admin, "/ready").await != Ok(503) {
        assert!(Instant::now() < deadline, "never deregistered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Still serving, on fresh connections, until the wait ends and the stop hook
    // (held) is called.
    let mut served = 0;
    while upstream.time_of("POST /consumers/stop").is_none() {
        assert!(
            served < 10_000 && began.elapsed() < Duration::from_secs(30),
            "the stop hook was never called"
        );
        assert_eq!(get(&self::client(), inbound, "/orders").await, Ok(200));
        served += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stop_at = upstream.time_of("POST /consumers/stop").unwrap();
    assert!(stop_at - began >= Duration::from_millis(700));
    assert_eq!(get(&self::client(), inbound, "/orders").await, Ok(200));
    upstream.hold_stop(false);

    // Bounded: an agent that never exits fails the test instead of hanging it.
    let status = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
    .expect("gov-agent exited within 30 s of its shutdown");
    assert!(status.success(), "{status}");
}

/// A child process killed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `POST /terminate` (what the service container's preStop hook calls in
/// `deploy/kubernetes`) runs the shutdown steps as SIGTERM does: deregistered at
/// once, still serving through the wait, then drained and stopped. From a web
/// page it is refused like `/shutdown`, and it takes no GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_terminate_runs_the_shutdown_steps() {
    let upstream = Upstream::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        &dir,
        vec![],
        vec![
            Down::Deregister(true),
            Down::Wait(proto::Wait {
                duration_ms: 300,
                registry: String::new(),
            }),
            Down::DrainMs(1_000),
        ],
    );
    let sidecar = start(&upstream, path).await;
    let admin = sidecar.admin_addr().unwrap();
    let post = |path: &str, origin: bool| {
        let mut req = http::Request::post(format!("http://{admin}{path}")).header("gov-admin", "x");
        if origin {
            req = req.header("origin", "http://elsewhere.example");
        }
        let req = req.body(Empty::<Bytes>::new()).unwrap();
        async move { client().request(req).await.unwrap().status().as_u16() }
    };
    let client = client();
    assert_eq!(get(&client, admin, "/terminate").await, Ok(405));
    assert_eq!(post("/terminate", true).await, 403);
    assert_eq!(ready(&client, &sidecar).await, 200);

    assert_eq!(post("/terminate", false).await, 202);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(ready(&client, &sidecar).await, 503);
    assert_eq!(sidecar.lifecycle().state().phase, proto::Phase::Draining);
    assert_eq!(
        get(&self::client(), sidecar.inbound_addr(), "/orders").await,
        Ok(200)
    );
    tokio::time::timeout(Duration::from_secs(10), sidecar.stopped())
        .await
        .expect("the agent stops after its shutdown steps");
}

/// A web page on the agent's host cannot stop or terminate it (issue 12,
/// item 7): a form post, a `text/plain` fetch, a POST without the
/// `gov-admin` header a page cannot add, one with a page's `origin` or
/// `sec-fetch-*`, and one that names a DNS-rebound host are all refused, and
/// the agent keeps serving. A tool's POST (the header, an IP or `localhost`
/// as the host) stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_pages_cannot_stop_or_terminate_the_agent() {
    let upstream = Upstream::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(&dir, vec![], vec![Down::DrainMs(1_000)]);
    let sidecar = start(&upstream, path).await;
    let admin = sidecar.admin_addr().unwrap();
    let port = admin.port();
    let full = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let send = |path: &str, headers: Vec<(&str, String)>, body: &'static str| {
        let mut req = http::Request::post(format!("http://{admin}{path}"));
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let req = req
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let full = full.clone();
        async move {
            let response = full.request(req).await.unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let form = (
        "content-type",
        "application/x-www-form-urlencoded".to_owned(),
    );
    let plain = ("content-type", "text/plain".to_owned());
    let tool = ("gov-admin", "terminate".to_owned());
    let rebound = ("host", format!("attacker.example:{port}"));
    type Headers<'a> = Vec<(&'a str, String)>;
    let hostile: Vec<(&str, Headers<'_>, &str)> = vec![
        ("a form post", vec![form.clone()], "x=1"),
        ("a text/plain fetch", vec![plain.clone()], "{}"),
        ("a bare POST", vec![], ""),
        (
            "a form post with an origin",
            vec![form, ("origin", "http://attacker.example".into())],
            "x=1",
        ),
        (
            "a same-origin fetch",
            vec![tool.clone(), ("sec-fetch-site", "same-origin".into())],
            "",
        ),
        (
            "a DNS-rebound page",
            vec![tool.clone(), rebound.clone(), plain],
            "{}",
        ),
        (
            "a DNS-rebound page, no port",
            vec![tool.clone(), ("host", "attacker.example".into())],
            "",
        ),
        (
            "a host that does not parse",
            vec![tool.clone(), ("host", "a b".into())],
            "",
        ),
    ];
    let client = client();
    for path in ["/terminate", "/shutdown"] {
        for (what, headers, body) in &hostile {
            let (status, text) = send(path, headers.clone(), body).await;
            assert_eq!(status, 403, "{what} to {path}: {text}");
            assert!(text.contains("gov-admin: "), "{what} to {path}: {text}");
            assert_eq!(ready(&client, &sidecar).await, 200, "{what} to {path}");
        }
    }
    assert_ne!(sidecar.lifecycle().state().phase, proto::Phase::Draining);
    // A tool on the host: the header, `localhost` as the host.
    let localhost = ("host", format!("localhost:{port}"));
    let (status, text) = send("/shutdown", vec![tool, localhost], "").await;
    assert_eq!(status, 202, "{text}");
    tokio::time::timeout(Duration::from_secs(10), sidecar.stopped())
        .await
        .expect("the agent stops after a tool's POST /shutdown");
}

/// The preStop hook of `deploy/kubernetes/stock.yaml`, run as written (with
/// this agent's admin port): it starts the shutdown steps and returns once
/// the agent has stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_pre_stop_hook_runs_the_shutdown_steps() {
    let manifest = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes/stock.yaml"
    );
    let manifest = std::fs::read_to_string(manifest).unwrap();
    // As Kubernetes reads it: the Deployment's app container's preStop
    // command, `sh -c HOOK`, whose HOOK must be a string (an unquoted `: `
    // makes it a mapping, which the API server refuses).
    let hook = serde_yaml::Deserializer::from_str(&manifest)
        .map(|doc| <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap())
        .find(|doc| doc["kind"] == "Deployment")
        .and_then(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
                ["command"][2]
                .as_str()
                .map(str::to_owned)
        })
        .expect("stock.yaml's app has a preStop command `sh -c HOOK`, HOOK a string");
    assert!(hook.contains("/terminate"), "{hook}");
    let hook = hook.as_str();
    let upstream = Upstream::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        &dir,
        vec![],
        vec![Down::Deregister(true), Down::DrainMs(1_000)],
    );
    let sidecar = start(&upstream, path).await;
    let admin = sidecar.admin_addr().unwrap();
    assert!(hook.contains("127.0.0.1:7069"), "{hook}");
    let hook = hook.replace("127.0.0.1:7069", &admin.to_string());
    let child = std::process::Command::new("sh")
        .args(["-c", &hook])
        .spawn()
        .expect("sh runs");
    let mut child = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the preStop hook did not return within 30s: {hook}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{hook}: {status} (.ci/run installs wget)");
    tokio::time::timeout(Duration::from_secs(10), sidecar.stopped())
        .await
        .expect("the agent stopped");
}

/// The agent fills in no step value: a probe without its timeout, status or
/// period, a ramp without its length, a stop without its action, each keeps
/// the sidecar from starting with an error that names the step, and the
/// same config with the values starts.
#[tokio::test]
async fn a_step_without_a_value_the_compiler_writes_is_refused_naming_the_step() {
    let upstream = Upstream::start(0).await;
    let probe = |status, every_ms, timeout_ms| {
        Up::Ready(proto::ReadyProbe {
            probe: Some(proto::HttpCall {
                method: "GET".into(),
                path: "/health".into(),
            }),
            status,
            every_ms,
            after_ms: 0,
            timeout_ms,
        })
    };
    let refused: [(Vec<Up>, Vec<Down>, &str); 6] = [
        (vec![probe(200, 50, 0)], vec![], "`timeout_ms` is missing"),
        (vec![probe(0, 50, 50)], vec![], "`status` is missing"),
        (vec![probe(200, 0, 50)], vec![], "`every_ms` is missing"),
        (
            vec![Up::Ready(proto::ReadyProbe {
                probe: Some(proto::HttpCall {
                    method: String::new(),
                    path: "/health".into(),
                }),
                status: 200,
                every_ms: 50,
                after_ms: 0,
                timeout_ms: 50,
            })],
            vec![],
            "`probe.method` is missing",
        ),
        (
            vec![Up::Ramp(proto::Ramp {
                over_ms: 0,
                from_milli_percent: 0,
            })],
            vec![],
            "`over_ms` is missing",
        ),
        (
            vec![],
            vec![Down::Stop(proto::Invoke {
                what: "consumers".into(),
                action: None,
            })],
            "`action` is missing",
        ),
    ];
    for (warmup, shutdown, problem) in refused {
        let dir = tempfile::tempdir().unwrap();
        let path = config(&dir, warmup, shutdown);
        let mut options = Options::new("order", upstream.addr.to_string().parse().unwrap());
        options.config = Some(path);
        let error = match Sidecar::start(options).await {
            Ok(_) => panic!("a config whose step lacks a value starts ({problem})"),
            Err(error) => error.to_string(),
        };
        assert!(
            error.contains(problem) && error.contains(" step `"),
            "{error:?} should name the step and say {problem:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let sidecar = start(&upstream, config(&dir, vec![probe(200, 50, 50)], vec![])).await;
    sidecar.shutdown();
    sidecar.stopped().await;
}
