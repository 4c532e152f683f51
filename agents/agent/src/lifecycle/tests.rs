//! The runner's state machine under paused time, against a recording fake service.

use std::sync::Mutex;

use super::*;

/// Answers `/ready` with 503 for the first `not_ready` probes, then 200; any other
/// path with 200. Records every call with its time since the test began.
struct Fake {
    start: Instant,
    not_ready: Mutex<u32>,
    calls: Mutex<Vec<(Duration, String)>>,
}

impl Fake {
    fn new(not_ready: u32) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            not_ready: Mutex::new(not_ready),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn calls(&self) -> Vec<(Duration, String)> {
        self.calls.lock().unwrap().clone()
    }
}

impl LocalService for Fake {
    fn call(&self, method: &str, path: &str) -> BoxFuture<Result<u16, String>> {
        self.calls
            .lock()
            .unwrap()
            .push((self.start.elapsed(), format!("{method} {path}")));
        let status = if path == "/ready" {
            let mut left = self.not_ready.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                503
            } else {
                200
            }
        } else {
            200
        };
        Box::pin(async move { Ok(status) })
    }

    fn signal(&self, name: &str) -> BoxFuture<Result<(), String>> {
        self.calls
            .lock()
            .unwrap()
            .push((self.start.elapsed(), format!("signal {name}")));
        Box::pin(async { Ok(()) })
    }
}

struct Rig {
    lifecycle: Arc<Lifecycle>,
    health: Arc<Health>,
    stop: CancellationToken,
    drained: CancellationToken,
    deadline: DrainDeadline,
}

fn rig(service: Arc<Fake>) -> Rig {
    let health = Arc::new(Health::default());
    let (stop, drained) = (CancellationToken::new(), CancellationToken::new());
    let deadline = DrainDeadline::new(Duration::from_secs(5));
    let lifecycle = Lifecycle::new(Parts {
        health: health.clone(),
        stop: stop.clone(),
        drained: drained.clone(),
        drain_deadline: deadline.clone(),
        service,
    });
    Rig {
        lifecycle,
        health,
        stop,
        drained,
        deadline,
    }
}

fn http(method: &str, path: &str) -> Option<proto::Action> {
    Some(proto::Action {
        kind: Some(proto::action::Kind::Http(proto::HttpCall {
            method: method.into(),
            path: path.into(),
        })),
    })
}

fn target(warmup: Vec<WarmupStep>, shutdown: Vec<ShutdownStep>) -> proto::TargetConfig {
    proto::TargetConfig {
        service: "order".into(),
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
        ..Default::default()
    }
}

fn ready_probe() -> WarmupStep {
    WarmupStep::Ready(proto::ReadyProbe {
        probe: Some(proto::HttpCall {
            method: "GET".into(),
            path: "/ready".into(),
        }),
        status: 200,
        every_ms: 10_000,
        after_ms: 15_000,
        timeout_ms: 1_000,
    })
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test(start_paused = true)]
async fn warmup_probes_until_ready_then_registers_ramps_and_starts_consumers() {
    let fake = Fake::new(2);
    let r = rig(fake.clone());
    r.health.set_config_loaded();
    r.lifecycle.set_plan(&target(
        vec![
            ready_probe(),
            WarmupStep::Register(true),
            WarmupStep::Ramp(proto::Ramp {
                over_ms: 60_000,
                from_milli_percent: 10_000,
            }),
            WarmupStep::Start(proto::Invoke {
                what: "consumers".into(),
                action: http("POST", "/admin/consumers/start"),
            }),
        ],
        vec![],
    ));
    assert_eq!(
        r.health.not_ready_reason(),
        Some("warming up (not registered yet)")
    );
    let mut states = r.lifecycle.subscribe();
    tokio::spawn(r.lifecycle.clone().run_warmup());

    // Probes at 15s (503), 25s (503), 35s (200): registered at 35s at 10%.
    tokio::time::sleep(secs(34)).await;
    assert_eq!(r.lifecycle.state().phase, proto::Phase::Starting);
    assert!(r.health.not_ready_reason().is_some());
    tokio::time::sleep(secs(2)).await;
    assert_eq!(r.health.not_ready_reason(), None);
    let s = r.lifecycle.state();
    assert_eq!(s.phase, proto::Phase::Warming);
    assert!((10_000..20_000).contains(&s.weight_milli_percent), "{s:?}");

    // Halfway through the ramp (35s + 30s): about 55%.
    tokio::time::sleep(secs(29)).await;
    let s = r.lifecycle.state();
    assert_eq!(s.phase, proto::Phase::Warming);
    assert!((50_000..=58_000).contains(&s.weight_milli_percent), "{s:?}");
    assert!(!fake.calls().iter().any(|(_, c)| c.contains("consumers")));

    // After the ramp: consumers started, READY at 100%.
    tokio::time::sleep(secs(32)).await;
    assert_eq!(
        r.lifecycle.state(),
        State {
            phase: proto::Phase::Ready,
            weight_milli_percent: FULL_WEIGHT
        }
    );
    let calls = fake.calls();
    let names: Vec<&str> = calls.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(
        names,
        [
            "GET /ready",
            "GET /ready",
            "GET /ready",
            "POST /admin/consumers/start"
        ]
    );
    let at: Vec<u64> = calls.iter().map(|(t, _)| t.as_secs()).collect();
    assert_eq!(at, [15, 25, 35, 95]);
    // The weight was seen rising.
    let mut last = 0;
    let mut seen = 0;
    while states.has_changed().unwrap_or(false) {
        let w = states.borrow_and_update().weight_milli_percent;
        assert!(w >= last);
        last = w;
        seen += 1;
    }
    assert!(seen >= 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_register_step_registration_follows_readiness_and_precedes_start() {
    let fake = Fake::new(1);
    let r = rig(fake.clone());
    r.health.set_config_loaded();
    r.lifecycle.set_plan(&target(
        vec![
            ready_probe(),
            WarmupStep::Start(proto::Invoke {
                what: "consumers".into(),
                action: http("POST", "/start"),
            }),
        ],
        vec![],
    ));
    tokio::spawn(r.lifecycle.clone().run_warmup());
    tokio::time::sleep(secs(20)).await;
    assert!(r.health.not_ready_reason().is_some());
    tokio::time::sleep(secs(6)).await;
    assert_eq!(r.health.not_ready_reason(), None);
    assert_eq!(
        r.lifecycle.state(),
        State {
            phase: proto::Phase::Ready,
            weight_milli_percent: FULL_WEIGHT
        }
    );
    let names: Vec<String> = fake.calls().into_iter().map(|(_, c)| c).collect();
    assert_eq!(names, ["GET /ready", "GET /ready", "POST /start"]);
}

#[tokio::test(start_paused = true)]
async fn without_warmup_the_instance_is_ready_at_once() {
    let r = rig(Fake::new(0));
    r.health.set_config_loaded();
    r.lifecycle.set_plan(&proto::TargetConfig::default());
    assert_eq!(r.health.not_ready_reason(), None);
    tokio::spawn(r.lifecycle.clone().run_warmup());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(r.lifecycle.state().phase, proto::Phase::Ready);
}

#[tokio::test(start_paused = true)]
async fn shutdown_deregisters_waits_stops_then_drains_with_the_step_deadline() {
    let fake = Fake::new(0);
    let r = rig(fake.clone());
    r.health.set_config_loaded();
    r.lifecycle.set_plan(&target(
        vec![],
        vec![
            ShutdownStep::Deregister(true),
            ShutdownStep::Wait(proto::Wait {
                duration_ms: 95_000,
                registry: "eureka".into(),
            }),
            ShutdownStep::Stop(proto::Invoke {
                what: "consumers".into(),
                action: http("POST", "/admin/consumers/stop"),
            }),
            ShutdownStep::Stop(proto::Invoke {
                what: "worker".into(),
                action: Some(proto::Action {
                    kind: Some(proto::action::Kind::Signal("SIGUSR1".into())),
                }),
            }),
            ShutdownStep::DrainMs(30_000),
        ],
    ));
    tokio::spawn(r.lifecycle.clone().run_warmup());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(r.lifecycle.has_shutdown_steps());

    r.lifecycle.begin_shutdown();
    r.lifecycle.begin_shutdown(); // idempotent
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(r.health.not_ready_reason(), Some("deregistered"));
    assert_eq!(r.lifecycle.state().phase, proto::Phase::Draining);
    assert!(!r.stop.is_cancelled(), "still serving during the wait");

    tokio::time::sleep(secs(94)).await;
    assert!(fake.calls().is_empty());
    assert!(!r.stop.is_cancelled());

    tokio::time::sleep(secs(2)).await;
    let names: Vec<String> = fake.calls().into_iter().map(|(_, c)| c).collect();
    assert_eq!(names, ["POST /admin/consumers/stop", "signal SIGUSR1"]);
    assert!(r.stop.is_cancelled(), "drain began after the stops");
    assert_eq!(r.deadline.get(), secs(30));

    // Not finished until the listeners have drained.
    let finished = {
        let l = r.lifecycle.clone();
        tokio::spawn(async move { l.finished().await })
    };
    tokio::time::sleep(secs(1)).await;
    assert!(!finished.is_finished());
    r.drained.cancel();
    finished.await.unwrap();
    assert_eq!(r.lifecycle.state().phase, proto::Phase::Stopped);
}

#[tokio::test(start_paused = true)]
async fn without_shutdown_steps_the_plain_drain_keeps_the_default_deadline() {
    let r = rig(Fake::new(0));
    r.lifecycle.set_plan(&proto::TargetConfig::default());
    r.lifecycle.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(r.stop.is_cancelled());
    assert_eq!(r.deadline.get(), secs(5));
    r.drained.cancel();
    r.lifecycle.finished().await;
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_during_warmup_stops_the_warmup() {
    let fake = Fake::new(u32::MAX);
    let r = rig(fake.clone());
    r.lifecycle.set_plan(&target(
        vec![ready_probe()],
        vec![ShutdownStep::DrainMs(1000)],
    ));
    let warmup = tokio::spawn(r.lifecycle.clone().run_warmup());
    tokio::time::sleep(secs(30)).await;
    r.lifecycle.begin_shutdown();
    warmup.await.unwrap();
    r.drained.cancel();
    r.lifecycle.finished().await;
    assert_eq!(r.lifecycle.state().phase, proto::Phase::Stopped);
    assert_eq!(r.deadline.get(), secs(1));
}

#[test]
fn ramp_weight_is_linear_and_capped() {
    let over = secs(60);
    assert_eq!(ramp_weight(10_000, over, Duration::ZERO), 10_000);
    assert_eq!(ramp_weight(10_000, over, secs(30)), 55_000);
    assert_eq!(ramp_weight(0, over, secs(15)), 25_000);
    assert_eq!(ramp_weight(10_000, over, secs(60)), FULL_WEIGHT);
    assert_eq!(ramp_weight(10_000, over, secs(600)), FULL_WEIGHT);
    assert_eq!(ramp_weight(200_000, over, secs(1)), FULL_WEIGHT);
}

/// A service whose hooks never answer.
struct Hung;

impl LocalService for Hung {
    fn call(&self, _: &str, _: &str) -> BoxFuture<Result<u16, String>> {
        Box::pin(std::future::pending())
    }

    fn signal(&self, _: &str) -> BoxFuture<Result<(), String>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_stop_hook_does_not_hold_up_the_drain_forever() {
    let health = Arc::new(Health::default());
    let (stop, drained) = (CancellationToken::new(), CancellationToken::new());
    let lifecycle = Lifecycle::new(Parts {
        health,
        stop: stop.clone(),
        drained: drained.clone(),
        drain_deadline: DrainDeadline::new(secs(5)),
        service: Arc::new(Hung),
    });
    lifecycle.set_plan(&target(
        vec![],
        vec![
            ShutdownStep::Stop(proto::Invoke {
                what: "consumers".into(),
                action: http("POST", "/stop"),
            }),
            ShutdownStep::DrainMs(1_000),
        ],
    ));
    lifecycle.begin_shutdown();
    tokio::time::sleep(ACTION_TIMEOUT - secs(1)).await;
    assert!(!stop.is_cancelled());
    tokio::time::sleep(secs(2)).await;
    assert!(stop.is_cancelled());
    drained.cancel();
    lifecycle.finished().await;
}

/// `via signal` reaches a real process through kill(2), with no `kill` binary;
/// a bad name or a missing pid is an error that says so, never a panic.
#[tokio::test]
async fn a_signal_step_signals_the_service_process() {
    use std::os::unix::process::ExitStatusExt as _;
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let service = HttpService {
        upstream: "127.0.0.1:1".parse().unwrap(),
        pid: Some(child.id()),
    };
    assert!(
        service
            .signal("NOSUCH")
            .await
            .unwrap_err()
            .contains("not a signal name")
    );
    service
        .signal("SIGUSR2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(rustix::process::Signal::USR2.as_raw()),
        "{status}"
    );

    let no_pid = HttpService {
        pid: None,
        ..service.clone()
    };
    assert!(
        no_pid
            .signal("SIGHUP")
            .await
            .unwrap_err()
            .contains("--service-pid")
    );
    let bad_pid = HttpService {
        pid: Some(u32::MAX),
        ..service
    };
    assert!(
        bad_pid
            .signal("SIGHUP")
            .await
            .unwrap_err()
            .contains("not a process id")
    );
}
