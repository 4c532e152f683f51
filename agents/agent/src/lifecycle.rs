//! The instance lifecycle: readiness-gated registration, slow-start ramp and ordered
//! shutdown (DESIGN problems 5 "Warmup" and 6 "Shutdown order").
//!
//! A [`Lifecycle`] runs the `warmup` steps of the service's `TargetConfig` once, when
//! the first config is in force, and its `shutdown` steps when the agent is asked to
//! stop (SIGTERM/SIGINT or the control plane's drain command):
//!
//! - `ready when http GET "/p" is 200 every D after D timeout D`: wait `after`, then
//!   probe the local service every `every` (each probe bounded by `timeout`) until it
//!   answers the status. Phase STARTING.
//! - `register`: `/ready` turns 200 (it says 503 while warmup holds it). Phase WARMING
//!   when a ramp follows, READY otherwise. Without a `register` step the instance
//!   registers right after the first readiness probe succeeds (or at once when there
//!   is none).
//! - `ramp D from P`: the weight rises linearly from P to 100% over D; it is
//!   reported to the control plane (`Lifecycle.weight_milli_percent`, passed on to
//!   callers in `Endpoints`). Steps run in order: a step after a ramp waits for it.
//! - `start|stop NAME via http POST "/p"`: an HTTP call to the local service (any
//!   2xx is success); `via signal SIGUSR1`: kill(2) with SIGUSR1 and the PID given
//!   by `--service-pid`. A failed action (or one with no answer within
//!   [`ACTION_TIMEOUT`]) is logged as an error and the lifecycle goes on:
//!   stopping an agent must never hang on a broken hook.
//! - `deregister`: `/ready` turns 503, phase DRAINING (the control plane drops the
//!   instance from `Endpoints`); requests keep being served.
//! - `wait D`: keep serving while callers' caches expire.
//! - `drain D`: stop accepting, finish in-flight and queued requests within D.
//!   Without a `drain` step the agent drains with its `--drain-timeout` after the
//!   last step.
//!
//! The state ([`State`]: phase and weight) is published on a `tokio::sync::watch`
//! channel ([`Lifecycle::subscribe`]), which the control-plane client forwards.
//! Only `tokio::time` is read, so the runner is tested under paused time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gov_proto::v1 as proto;
use http::uri::Authority;
use http_body_util::Empty;
use proto::shutdown_step::Step as ShutdownStep;
use proto::warmup_step::Step as WarmupStep;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::health::Health;

/// How long a `start`/`stop` action may take before it counts as failed: a hung
/// hook must not hold up a shutdown forever.
pub const ACTION_TIMEOUT: Duration = Duration::from_secs(30);

use steps::signal_named;
pub use steps::{FULL_WEIGHT, InvalidStep, check as check_steps};

mod steps;

/// What the lifecycle reports: phase and slow-start weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Where the instance is in its life.
    pub phase: proto::Phase,
    /// Slow-start weight, 100% = 100000.
    pub weight_milli_percent: u32,
}

impl State {
    /// The wire message.
    pub fn to_proto(self) -> proto::Lifecycle {
        proto::Lifecycle {
            phase: self.phase.into(),
            weight_milli_percent: self.weight_milli_percent,
        }
    }
}

/// A boxed future, for [`LocalService`].
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// How the lifecycle talks to the local service: HTTP calls and signals.
pub trait LocalService: Send + Sync + 'static {
    /// `METHOD PATH` on the local service; the response status.
    fn call(&self, method: &str, path: &str) -> BoxFuture<Result<u16, String>>;
    /// Sends signal `name` (`SIGUSR1`) to the service process.
    fn signal(&self, name: &str) -> BoxFuture<Result<(), String>>;
}

/// The local service over HTTP/1.1 (one connection per call) and kill(2).
#[derive(Debug, Clone)]
pub struct HttpService {
    /// `host:port` of the local service.
    pub upstream: Authority,
    /// The service's process id (`--service-pid`), for `via signal` steps.
    pub pid: Option<u32>,
}

impl LocalService for HttpService {
    fn call(&self, method: &str, path: &str) -> BoxFuture<Result<u16, String>> {
        let upstream = self.upstream.clone();
        let (method, path) = (method.to_owned(), path.to_owned());
        Box::pin(async move { http_call(&upstream, &method, &path).await })
    }

    fn signal(&self, name: &str) -> BoxFuture<Result<(), String>> {
        let pid = self.pid;
        let name = name.to_owned();
        Box::pin(async move {
            let Some(pid) = pid else {
                return Err(format!(
                    "cannot send `{name}`: the agent does not know the service's process id (set --service-pid)"
                ));
            };
            let signal = signal_named(&name).ok_or_else(|| {
                format!(
                    "cannot send `{name}`: not a signal name (`SIGHUP`, `SIGUSR1`, `SIGTERM`...)"
                )
            })?;
            let target = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
                .ok_or_else(|| format!("cannot send `{name}`: `{pid}` is not a process id"))?;
            rustix::process::kill_process(target, signal)
                .map_err(|e| format!("cannot send `{name}` to process {pid}: {e}"))
        })
    }
}

async fn http_call(upstream: &Authority, method: &str, path: &str) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect(upstream.as_str())
        .await
        .map_err(|e| format!("cannot connect to `{upstream}`: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, upstream.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok(response.status().as_u16())
}

/// The drain deadline the proxy listeners use when they stop; the `drain D` step sets it.
#[derive(Debug, Clone)]
pub struct DrainDeadline(Arc<AtomicU64>);

impl DrainDeadline {
    /// A deadline of `d`.
    pub fn new(d: Duration) -> Self {
        Self(Arc::new(AtomicU64::new(millis(d))))
    }

    /// Changes it (before the drain begins).
    pub fn set(&self, d: Duration) {
        self.0.store(millis(d), Ordering::Release);
    }

    /// The current deadline.
    pub fn get(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Acquire))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a [`Lifecycle`] acts on.
pub struct Parts {
    /// `/ready`.
    pub health: Arc<Health>,
    /// Cancelling it makes the proxy listeners stop accepting and drain.
    pub stop: CancellationToken,
    /// Cancelled when the proxy listeners have drained.
    pub drained: CancellationToken,
    /// The deadline the listeners drain with.
    pub drain_deadline: DrainDeadline,
    /// The local service.
    pub service: Arc<dyn LocalService>,
}

#[derive(Debug, Clone, Default)]
struct Plan {
    warmup: Vec<WarmupStep>,
    shutdown: Vec<ShutdownStep>,
}

/// The lifecycle runner of one instance. Cheap to share (`Arc`).
pub struct Lifecycle {
    parts: Parts,
    state: watch::Sender<State>,
    plan: watch::Sender<Option<Plan>>,
    shutting_down: CancellationToken,
    shutdown_begun: AtomicBool,
    finished: CancellationToken,
    /// Set when the agent talks to govd (`wait for gov` can be answered).
    has_control_plane: AtomicBool,
    /// Cancelled when govd says every agent dropped this instance.
    deregistered: CancellationToken,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl Lifecycle {
    /// A lifecycle in phase STARTING, waiting for its first plan ([`Self::set_plan`]).
    pub fn new(parts: Parts) -> Arc<Self> {
        let (state, _) = watch::channel(State {
            phase: proto::Phase::Starting,
            weight_milli_percent: 0,
        });
        let (plan, _) = watch::channel(None);
        Arc::new(Self {
            parts,
            state,
            plan,
            shutting_down: CancellationToken::new(),
            shutdown_begun: AtomicBool::new(false),
            finished: CancellationToken::new(),
            has_control_plane: AtomicBool::new(false),
            deregistered: CancellationToken::new(),
        })
    }

    /// The current state and its changes.
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    /// Keeps `engine`'s slow-start weight ([`gov_engine::Engine::set_warmup_weight`],
    /// which limits with `scale with warmup` follow) at the instance's: its
    /// ramp's weight while WARMING, full in every other phase (before the
    /// instance is ready it takes no calls; once ramped, or without a ramp,
    /// it takes its full share). Ends with the lifecycle.
    pub fn follow_weight(&self, engine: gov_engine::Engine) -> impl Future<Output = ()> + use<> {
        let mut state = self.state.subscribe();
        async move {
            loop {
                let s = *state.borrow_and_update();
                engine.set_warmup_weight(match s.phase {
                    proto::Phase::Warming => s.weight_milli_percent,
                    _ => gov_engine::FULL_WEIGHT,
                });
                if state.changed().await.is_err() {
                    return;
                }
            }
        }
    }

    /// The current state.
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Takes the warmup and shutdown steps of `target` (each config in force calls
    /// it). Call it before marking the config loaded: when the first plan has warmup
    /// steps, `/ready` is held at 503 until the warmup registers the instance.
    ///
    /// The agent checks a config's steps ([`check_steps`]) before it takes the
    /// config; steps that do not pass are not taken here either (the plan in
    /// force stays), so that no step runs without its values.
    pub fn set_plan(&self, target: &proto::TargetConfig) {
        if let Err(error) = check_steps(target) {
            tracing::error!(%error, "the config's steps are refused; the lifecycle keeps its plan");
            return;
        }
        let plan = Plan {
            warmup: target
                .warmup
                .iter()
                .flat_map(|w| w.steps.iter().filter_map(|s| s.step.clone()))
                .collect(),
            shutdown: target
                .shutdown
                .iter()
                .flat_map(|s| s.steps.iter().filter_map(|s| s.step.clone()))
                .collect(),
        };
        let first = self.plan.borrow().is_none();
        if first && !plan.warmup.is_empty() {
            self.parts.health.hold();
        }
        self.plan.send_replace(Some(plan));
    }

    /// Whether the config in force has shutdown steps.
    pub fn has_shutdown_steps(&self) -> bool {
        self.plan
            .borrow()
            .as_ref()
            .is_some_and(|p| !p.shutdown.is_empty())
    }

    fn publish(&self, phase: proto::Phase, weight_milli_percent: u32) {
        let next = State {
            phase,
            weight_milli_percent,
        };
        self.state.send_if_modified(|s| {
            let changed = *s != next;
            *s = next;
            changed
        });
    }

    /// Waits for the first plan, then runs its warmup steps (once). Returns early
    /// when the shutdown (or the plain stop) begins.
    pub async fn run_warmup(self: Arc<Self>) {
        let mut plans = self.plan.subscribe();
        let plan = tokio::select! {
            () = self.shutting_down.cancelled() => return,
            () = self.parts.stop.cancelled() => return,
            plan = plans.wait_for(Option::is_some) => match plan {
                Ok(p) => p.clone().unwrap_or_default(),
                Err(_) => return,
            },
        };
        tokio::select! {
            () = self.shutting_down.cancelled() => {}
            () = self.parts.stop.cancelled() => {}
            () = self.warmup(&plan.warmup) => {}
        }
    }

    async fn warmup(&self, steps: &[WarmupStep]) {
        let explicit_register = steps.iter().any(|s| matches!(s, WarmupStep::Register(_)));
        let has_probe = steps.iter().any(|s| matches!(s, WarmupStep::Ready(_)));
        let mut registered = false;
        if !explicit_register && !has_probe {
            self.register(steps);
            registered = true;
        }
        for (i, step) in steps.iter().enumerate() {
            match step {
                WarmupStep::Ready(probe) => {
                    self.probe(probe).await;
                    if !explicit_register && !registered {
                        self.register(&steps[i + 1..]);
                        registered = true;
                    }
                }
                WarmupStep::Register(_) => {
                    self.register(&steps[i + 1..]);
                    registered = true;
                }
                WarmupStep::Ramp(ramp) => self.ramp(ramp).await,
                WarmupStep::Start(invoke) => self.invoke("start", invoke).await,
            }
        }
        if !registered {
            self.register(&[]);
        }
        self.publish(proto::Phase::Ready, FULL_WEIGHT);
        tracing::info!("warmup done: ready at full weight");
    }

    /// `/ready` turns 200; WARMING at the first ramp's weight when one follows.
    fn register(&self, rest: &[WarmupStep]) {
        self.parts.health.set_registered();
        let ramp = rest.iter().find_map(|s| match s {
            WarmupStep::Ramp(r) => Some(r.from_milli_percent.min(FULL_WEIGHT)),
            _ => None,
        });
        match ramp {
            Some(from) => self.publish(proto::Phase::Warming, from),
            None => self.publish(proto::Phase::Ready, FULL_WEIGHT),
        }
        tracing::info!("registered: /ready says 200");
    }

    async fn probe(&self, probe: &proto::ReadyProbe) {
        // Every value is there and usable: `set_plan` took only checked steps.
        let Some(call) = &probe.probe else { return };
        let (method, path) = (call.method.as_str(), call.path.as_str());
        let expected = probe.status;
        let every = Duration::from_millis(probe.every_ms);
        let timeout = Duration::from_millis(probe.timeout_ms);
        tokio::time::sleep(Duration::from_millis(probe.after_ms)).await;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut attempt = 0_u64;
        loop {
            tick.tick().await;
            attempt += 1;
            match tokio::time::timeout(timeout, self.parts.service.call(method, path)).await {
                Ok(Ok(status)) if u32::from(status) == expected => {
                    tracing::info!(%method, %path, status, attempt, "readiness probe passed");
                    return;
                }
                Ok(Ok(status)) => {
                    tracing::debug!(%method, %path, status, attempt, "not ready yet")
                }
                Ok(Err(error)) => tracing::debug!(%method, %path, %error, attempt, "not ready yet"),
                Err(_) => tracing::debug!(%method, %path, ?timeout, attempt, "probe timed out"),
            }
        }
    }

    async fn ramp(&self, ramp: &proto::Ramp) {
        let from = ramp.from_milli_percent;
        let over = Duration::from_millis(ramp.over_ms);
        let start = Instant::now();
        // About 20 updates over the ramp, at most one a second, at least every 50ms.
        let step = (over / 20).clamp(Duration::from_millis(50), Duration::from_secs(1));
        self.publish(proto::Phase::Warming, from);
        tracing::info!(?over, from_milli_percent = from, "slow-start ramp");
        loop {
            let elapsed = start.elapsed();
            if elapsed >= over {
                break;
            }
            self.publish(proto::Phase::Warming, ramp_weight(from, over, elapsed));
            tokio::time::sleep(step.min(over - elapsed)).await;
        }
        self.publish(proto::Phase::Warming, FULL_WEIGHT);
    }

    async fn invoke(&self, verb: &str, invoke: &proto::Invoke) {
        let what = invoke.what.as_str();
        let result = match tokio::time::timeout(ACTION_TIMEOUT, self.action(invoke)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {ACTION_TIMEOUT:?}")),
        };
        match result {
            Ok(()) => tracing::info!(verb, what, "lifecycle action done"),
            Err(error) => {
                tracing::error!(verb, what, %error, "lifecycle action failed; going on")
            }
        }
    }

    async fn action(&self, invoke: &proto::Invoke) -> Result<(), String> {
        match invoke.action.as_ref().and_then(|a| a.kind.as_ref()) {
            Some(proto::action::Kind::Http(call)) => {
                let method = call.method.as_str();
                match self.parts.service.call(method, &call.path).await {
                    Ok(status) if (200..300).contains(&status) => Ok(()),
                    Ok(status) => Err(format!("`{method} {}` answered {status}", call.path)),
                    Err(error) => Err(error),
                }
            }
            Some(proto::action::Kind::Signal(name)) => self.parts.service.signal(name).await,
            None => Err("the step has no action".to_owned()),
        }
    }

    /// Begins the shutdown (idempotent): the shutdown steps of the config in force,
    /// or the plain drain when it has none. Returns at once; see [`Self::finished`].
    /// The agent talks to govd: a `wait for gov` step waits for its word.
    pub fn use_control_plane(&self) {
        self.has_control_plane.store(true, Ordering::Release);
    }

    /// govd says every connected agent has an endpoint set without this
    /// instance: a `wait for gov` step ends.
    pub fn confirm_deregistered(&self) {
        self.deregistered.cancel();
    }

    pub fn begin_shutdown(self: &Arc<Self>) {
        if self.shutdown_begun.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shutting_down.cancel();
        let this = self.clone();
        tokio::spawn(async move { this.shutdown().await });
    }

    /// Waits until a begun shutdown has run every step (returns at once when none
    /// was begun).
    pub async fn finished(&self) {
        if self.shutdown_begun.load(Ordering::Acquire) {
            self.finished.cancelled().await;
        }
    }

    async fn shutdown(&self) {
        let steps = self
            .plan
            .borrow()
            .as_ref()
            .map(|p| p.shutdown.clone())
            .unwrap_or_default();
        tracing::info!(steps = steps.len(), "shutdown begins");
        let mut drained = false;
        let mut deregistered = false;
        for step in &steps {
            match step {
                ShutdownStep::Deregister(_) => {
                    self.deregister();
                    deregistered = true;
                }
                ShutdownStep::WaitForGov(w) => {
                    if !deregistered {
                        self.deregister();
                        deregistered = true;
                    }
                    self.wait_for_gov(Duration::from_millis(w.timeout_ms)).await;
                }
                ShutdownStep::Wait(wait) => {
                    let d = Duration::from_millis(wait.duration_ms);
                    tracing::info!(?d, registry = %wait.registry, "waiting while callers' caches expire");
                    tokio::time::sleep(d).await;
                }
                ShutdownStep::Stop(invoke) => self.invoke("stop", invoke).await,
                ShutdownStep::DrainMs(ms) => {
                    self.drain(Some(Duration::from_millis(*ms))).await;
                    drained = true;
                }
            }
        }
        if !drained {
            self.drain(None).await;
        }
        self.publish(proto::Phase::Stopped, 0);
        self.finished.cancel();
    }

    fn deregister(&self) {
        self.parts.health.set_deregistered();
        self.publish(proto::Phase::Draining, 0);
        tracing::info!("deregistered: /ready says 503, still serving");
    }

    /// Waits until govd says every agent dropped this instance, at most
    /// `timeout`. Without a control plane there is nobody to wait for.
    async fn wait_for_gov(&self, timeout: Duration) {
        if !self.has_control_plane.load(Ordering::Acquire) {
            tracing::warn!("`wait for gov` without a control plane: nothing to wait for");
            return;
        }
        tracing::info!(
            ?timeout,
            "waiting until every caller has dropped this instance"
        );
        tokio::select! {
            () = self.deregistered.cancelled() => {
                tracing::info!("every caller has dropped this instance");
            }
            () = tokio::time::sleep(timeout) => {
                tracing::warn!(?timeout, "not every caller acknowledged the removal in time; going on");
            }
        }
    }

    async fn drain(&self, deadline: Option<Duration>) {
        if let Some(d) = deadline {
            self.parts.drain_deadline.set(d);
        }
        self.publish(proto::Phase::Draining, 0);
        tracing::info!(deadline = ?self.parts.drain_deadline.get(), "draining");
        self.parts.stop.cancel();
        self.parts.drained.cancelled().await;
    }
}

/// The weight `elapsed` into a ramp from `from` to 100% over `over`.
pub fn ramp_weight(from: u32, over: Duration, elapsed: Duration) -> u32 {
    if elapsed >= over || over.is_zero() {
        return FULL_WEIGHT;
    }
    let from = u128::from(from.min(FULL_WEIGHT));
    let span = u128::from(FULL_WEIGHT) - from;
    let w = from + span * elapsed.as_micros() / over.as_micros().max(1);
    u32::try_from(w).unwrap_or(FULL_WEIGHT)
}

#[cfg(test)]
mod tests;
