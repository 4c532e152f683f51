//! `govc demo`: the whole system in one process, for a first look.
//!
//! It starts a control plane (state in a temporary directory, removed at the
//! end), two demo services (`order` and `inventory`, see `demo/services.rs`)
//! with an agent in front of each, applies `examples/shop.gov`, sends a
//! bounded load through the agents (`demo/load.rs`) and opens the TUI on
//! the control plane, or with `--no-tui` prints a plain summary every few
//! seconds. The supplier backend of `order` has an outage after a few
//! seconds, so the `order/mdm` fuse trips within the first minute and can be
//! released from the TUI. Ctrl-C (or `q` in the TUI, or `--duration`) stops
//! everything in order: load, agents (drained), services, control plane,
//! temporary directory.

#[path = "../demo/load.rs"]
mod load;
#[path = "../demo/policy.rs"]
mod policy;
#[path = "../demo/services.rs"]
mod services;
#[path = "../demo/summary.rs"]
mod summary;

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gov_agent::control::ControlOptions;
use gov_agent::sidecar::{Options as SidecarOptions, Sidecar};
use gov_control_plane::{ControlPlane, Options as ControlPlaneOptions};
use gov_proto::v1 as pb;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use services::Supplier;

/// `println!` that ignores a closed stdout (the terminal went away: the demo
/// must still stop cleanly).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// The same on stderr, for warnings while stopping.
macro_rules! warn_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The fuse the supplier outage trips.
const MDM_FUSE: &str = "order/mdm";
/// When the first supplier outage begins.
const FIRST_OUTAGE: Duration = Duration::from_secs(5);
/// How long a tripped fuse shields the supplier backend before it recovers.
const RECOVERY: Duration = Duration::from_secs(3);
/// The next outage begins this long after a release.
const NEXT_OUTAGE: Duration = Duration::from_secs(120);
/// How long agents may take to drain, and the control plane to stop.
const DRAIN: Duration = Duration::from_secs(2);

/// Run a control plane, two demo services behind agents and a load, and watch it live.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a plain summary every few seconds instead of opening the TUI.
    #[arg(long)]
    pub no_tui: bool,

    /// Stop by itself after this long (`90s`, `2m`; default: run until Ctrl-C
    /// or `q`).
    #[arg(long, value_name = "DURATION", value_parser = gov_common::flag::parse_duration)]
    pub duration: Option<Duration>,

    /// Apply these policy files instead of the built-in `examples/shop.gov`
    /// (they should govern the demo services `order` and `inventory`).
    #[arg(long, value_name = "FILE")]
    pub policy: Vec<PathBuf>,

    /// Time between two summaries with --no-tui (at least 1s).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = gov_common::flag::parse_duration)]
    pub every: Duration,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum DemoError {
    #[error("the TUI needs a terminal, and standard input or output is not one")]
    #[diagnostic(
        code(gov::demo::terminal),
        help("run `govc demo --no-tui` to print a summary every few seconds instead")
    )]
    NotATerminal,
    #[error("cannot read the policy file `{path}`: {source}")]
    #[diagnostic(code(gov::demo::policy_file))]
    Policy {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot {what}: {reason}")]
    #[diagnostic(code(gov::demo::start))]
    Start { what: &'static str, reason: String },
    #[error("the control plane refused the policy: {summary}")]
    #[diagnostic(
        code(gov::demo::apply),
        help("run `govc check` on the policy files to see every diagnostic")
    )]
    Apply { summary: String },
}

fn start_error(what: &'static str) -> impl FnOnce(String) -> DemoError {
    move |reason| DemoError::Start { what, reason }
}

pub fn run(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(start_error("start the async runtime")(e.to_string())),
    };
    let result = runtime.block_on(demo(args));
    // The TUI's background watch task may still be retrying: do not wait for it.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn fail(e: DemoError) -> ExitCode {
    gov_common::errln!("{:?}", miette::Report::new(e));
    ExitCode::FAILURE
}

/// One demo service and the agent in front of it.
struct Member {
    name: &'static str,
    service: SocketAddr,
    sidecar: Sidecar,
    serving: JoinHandle<()>,
}

async fn demo(args: Args) -> Result<(), DemoError> {
    let terminal = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !args.no_tui && !terminal {
        return Err(DemoError::NotATerminal);
    }
    let sources = sources(&args.policy)?;
    let started = Instant::now();

    let dir = tempfile::Builder::new()
        .prefix("gov-demo-")
        .tempdir()
        .map_err(|e| start_error("create a temporary directory")(e.to_string()))?;
    let dir_path = dir.path().to_owned();

    // The control plane.
    let cp_stop = CancellationToken::new();
    let cp = ControlPlane::open(
        ControlPlaneOptions::new(dir_path.join("govd")),
        cp_stop.clone(),
    )
    .map_err(|e| start_error("open the control plane")(e.to_string()))?;
    let listener = bind().await?;
    let cp_addr = local_addr(&listener)?;
    let url = format!("http://{cp_addr}");
    let cp_task = tokio::spawn(gov_control_plane::serve(
        listener,
        cp.clone(),
        cp_stop.clone(),
        DRAIN,
    ));

    // The services and their agents; order calls inventory through its agent.
    let supplier = Arc::new(Supplier::new(started + FIRST_OUTAGE));
    let services_stop = CancellationToken::new();
    let agents_stop = CancellationToken::new();
    let inventory = start_member(
        "inventory",
        &url,
        &dir_path,
        None,
        &supplier,
        &services_stop,
        &agents_stop,
    )
    .await?;
    let order = start_member(
        "order",
        &url,
        &dir_path,
        Some(("inventory", inventory.sidecar.inbound_addr())),
        &supplier,
        &services_stop,
        &agents_stop,
    )
    .await?;
    let members = [order, inventory];

    say!(
        "govc demo: control plane {url} (state in {})",
        dir_path.display()
    );
    for m in &members {
        say!(
            "  {:<9} service {}  agent {}{}",
            m.name,
            m.service,
            m.sidecar.inbound_addr(),
            m.sidecar
                .outbound_addr()
                .map(|a| format!(" (outbound {a})"))
                .unwrap_or_default()
        );
    }

    // Apply once both agents are connected, so that the answer shows them.
    wait_for_agents(&cp, members.len()).await;
    let (outcome, totals) = live(&args, &cp, &url, &members, &supplier, started, sources).await;

    // Stop in order: agents (drain), services, control plane, files.
    for m in &members {
        m.sidecar.shutdown();
    }
    agents_stop.cancel();
    services_stop.cancel();
    for m in members {
        m.sidecar.stopped().await;
        let _ = m.serving.await;
    }
    cp_stop.cancel();
    match cp_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn_line!("warning: the control plane stopped with an error: {e}"),
        Err(e) => warn_line!("warning: the control plane task failed: {e}"),
    }
    let shown = dir_path.display().to_string();
    match remove(dir).await {
        Ok(()) => say!(
            "stopped after {}s: {} requests sent, {} answered 2xx, {} rejected by gov; removed {shown}",
            started.elapsed().as_secs(),
            totals.sent,
            totals.ok,
            totals.rejected
        ),
        Err(e) => warn_line!("warning: cannot remove {shown}: {e}"),
    }
    outcome
}

/// Removes the temporary directory. The control plane's background writer
/// may still finish a write just after it stopped, so a directory that is
/// not empty yet is tried again for a short while.
async fn remove(dir: tempfile::TempDir) -> std::io::Result<()> {
    let path = dir.keep();
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if tries >= 20 => return Err(e),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Applies the policy, runs the load and the outage scenario, and shows the
/// TUI or the summaries until the operator or the clock says stop; stops the
/// load before returning what it sent.
async fn live(
    args: &Args,
    cp: &ControlPlane,
    url: &str,
    members: &[Member],
    supplier: &Arc<Supplier>,
    started: Instant,
    sources: Vec<pb::SourceFile>,
) -> (Result<(), DemoError>, load::Totals) {
    let version = match apply(url, sources).await {
        Ok(v) => v,
        Err(e) => return (Err(e), load::Totals::default()),
    };
    say!("applied policy {version}");
    for a in cp.status().agents {
        say!(
            "  {}/{}: {}{}",
            a.service,
            a.instance,
            summary::sync_name(a.state()),
            if a.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", a.reason)
            }
        );
    }
    let rate: f64 = load::STREAMS.iter().map(|s| s.rate).sum();
    say!(
        "load: about {rate:.0} requests/s from consumers crm and web; the supplier backend starts failing at {}s and the `{MDM_FUSE}` fuse trips within a minute",
        FIRST_OUTAGE.as_secs()
    );

    // The load and the outage scenario.
    let load_stop = CancellationToken::new();
    let counters = Arc::new(load::Counters::default());
    let targets = members
        .iter()
        .map(|m| (m.name, m.sidecar.inbound_addr()))
        .collect();
    let load_task = tokio::spawn({
        let (counters, stop) = (counters.clone(), load_stop.clone());
        async move { load::run(&load::STREAMS, targets, counters, stop).await }
    });
    let notes = Arc::new(Mutex::new(Vec::new()));
    let scenario_task = tokio::spawn(scenario(
        cp.watch(),
        supplier.clone(),
        notes.clone(),
        load_stop.clone(),
    ));

    // Watch until the operator or the clock says stop.
    let until = async {
        match args.duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    let outcome = if args.no_tui {
        let every = args.every.max(Duration::from_secs(1));
        say!(
            "every {} a summary; Ctrl-C stops",
            crate::remote::human_ms(u64::try_from(every.as_millis()).unwrap_or(u64::MAX))
        );
        tokio::select! {
            () = summaries(cp, &counters, &notes, started, every) => Ok(()),
            () = until => Ok(()),
            () = interrupted() => Ok(()),
        }
    } else {
        let opts = gov_tui::TuiOptions {
            control_plane: url.to_owned(),
            token: None,
            tls: Default::default(),
            readonly: false,
            who: std::env::var("USER")
                .ok()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "demo".into()),
            service: String::new(),
        };
        let result = tokio::select! {
            r = gov_tui::run(opts) => r.map_err(|e| e.to_string()),
            () = until => Ok(()),
            () = interrupted() => Ok(()),
        };
        // The TUI restores the terminal when it returns; when it was stopped
        // from outside, restore it here (restoring twice is harmless).
        ratatui::restore();
        result.map_err(start_error("run the TUI"))
    };

    say!("stopping: load, agents (drain), services, control plane");
    load_stop.cancel();
    let _ = load_task.await;
    scenario_task.abort();
    (outcome, counters.totals())
}

/// The policy sources, with `scope cluster` limits made local (see `demo/policy.rs`).
fn sources(paths: &[PathBuf]) -> Result<Vec<pb::SourceFile>, DemoError> {
    let files = if paths.is_empty() {
        vec![(policy::SHOP_NAME.to_owned(), policy::SHOP.to_owned())]
    } else {
        paths
            .iter()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map(|text| (p.display().to_string(), text))
                    .map_err(|source| DemoError::Policy {
                        path: p.display().to_string(),
                        source,
                    })
            })
            .collect::<Result<_, _>>()?
    };
    let mut out = Vec::new();
    for (name, text) in files {
        let (text, changed) = policy::local_scope(&text);
        for limit in changed {
            say!(
                "note: limit `{limit}` ({name}) has `scope cluster`; the demo runs without Redis, so it applies it with `scope local` (with one agent per service a local counter counts the same)"
            );
        }
        out.push(pb::SourceFile { name, text });
    }
    Ok(out)
}

async fn bind() -> Result<TcpListener, DemoError> {
    TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|e| start_error("listen on 127.0.0.1")(e.to_string()))
}

fn local_addr(l: &TcpListener) -> Result<SocketAddr, DemoError> {
    l.local_addr()
        .map_err(|e| start_error("read a listener's address")(e.to_string()))
}

/// Starts the demo service `name` and an agent in front of it, connected to
/// the control plane at `url`. `calls`: the service it calls through the
/// agent's outbound listener.
async fn start_member(
    name: &'static str,
    url: &str,
    dir: &std::path::Path,
    calls: Option<(&str, SocketAddr)>,
    supplier: &Arc<Supplier>,
    services_stop: &CancellationToken,
    agents_stop: &CancellationToken,
) -> Result<Member, DemoError> {
    let listener = bind().await?;
    let service = local_addr(&listener)?;
    let upstream = service
        .to_string()
        .parse()
        .map_err(|e: http::uri::InvalidUri| {
            start_error("name the service address")(e.to_string())
        })?;
    let mut options = SidecarOptions::new(name, upstream);
    options.drain_timeout = DRAIN;
    options.control_plane = Some(url.to_owned());
    if let Some((other, addr)) = calls {
        options.outbound_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        let authority = addr
            .to_string()
            .parse()
            .map_err(|e: http::uri::InvalidUri| {
                start_error("name the agent address")(e.to_string())
            })?;
        options.instances = vec![(other.to_owned(), vec![authority])];
    }
    let sidecar = Sidecar::start(options)
        .await
        .map_err(|e| start_error("start an agent")(e.to_string()))?;

    let mut control = ControlOptions::new(url, name, format!("{name}-1"));
    control.address = sidecar.inbound_addr().to_string();
    control.state_dir = Some(dir.join("agents").join(name));
    control.on_applied = Some(sidecar.on_config_applied());
    control.on_saved = Some(sidecar.on_config_saved());
    control.lifecycle = Some(sidecar.lifecycle().subscribe());
    tokio::spawn(gov_agent::control::run(
        sidecar.engine().clone(),
        control,
        agents_stop.clone(),
    ));

    let outbound = sidecar.outbound_addr().map(services::Outbound::new);
    let serving = tokio::spawn(services::serve(
        name,
        listener,
        supplier.clone(),
        outbound,
        services_stop.clone(),
    ));
    Ok(Member {
        name,
        service,
        sidecar,
        serving,
    })
}

/// Waits (at most 10 s) until `n` agents have said hello.
async fn wait_for_agents(cp: &ControlPlane, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cp.status().agents.len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Applies `sources` through the control plane's gRPC API, as `govc apply`
/// does, and returns the short version.
async fn apply(url: &str, sources: Vec<pb::SourceFile>) -> Result<String, DemoError> {
    let mut client = gov_control_plane::client::connect(url, Duration::from_secs(5))
        .await
        .map_err(|e| start_error("reach the control plane")(e.to_string()))?;
    let result = client
        .apply(pb::ApplyRequest {
            sources,
            dry_run: false,
            wait_ms: 10_000,
            who: "govc demo".into(),
            shadow: false,
            allow_remove_all: false,
            ..Default::default()
        })
        .await
        .map_err(|s| DemoError::Apply {
            summary: s.message().to_owned(),
        })?
        .into_inner();
    let errors: Vec<String> = result
        .diagnostics
        .iter()
        .filter(|d| d.severity() == pb::Severity::Error)
        .map(|d| format!("{}:{}:{}: {}", d.file, d.line, d.column, d.message))
        .collect();
    if !errors.is_empty() {
        return Err(DemoError::Apply {
            summary: errors.join("; "),
        });
    }
    Ok(summary::short(&result.version).to_owned())
}

/// The outage story: once the `mdm` fuse has shielded the supplier backend
/// for a while, the backend recovers (so a release sticks); after a release
/// the next outage is scheduled.
async fn scenario(
    mut views: tokio::sync::watch::Receiver<Arc<pb::ClusterView>>,
    supplier: Arc<Supplier>,
    notes: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
) {
    let note = |s: String| notes.lock().unwrap_or_else(PoisonError::into_inner).push(s);
    let mut open_since = None::<Instant>;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let _ = views.has_changed();
        let open = views
            .borrow_and_update()
            .fuses
            .iter()
            .any(|f| f.rule == MDM_FUSE);
        let now = Instant::now();
        match (open, open_since) {
            (true, None) => {
                open_since = Some(now);
                note(format!(
                    "fuse `{MDM_FUSE}` tripped: crm's supplier calls are rejected, the backend gets room to recover"
                ));
            }
            (true, Some(since)) if now - since >= RECOVERY && supplier.in_outage(now) => {
                supplier.recover();
                note(format!(
                    "the supplier backend recovered; release `{MDM_FUSE}` (TUI: select it, r, y; or govc release)"
                ));
            }
            (false, Some(_)) => {
                open_since = None;
                supplier.schedule_outage(now + NEXT_OUTAGE);
                note(format!(
                    "fuse `{MDM_FUSE}` released; the next supplier outage begins in {}s",
                    NEXT_OUTAGE.as_secs()
                ));
            }
            _ => {}
        }
    }
}

/// Prints a summary every `every` seconds, forever.
async fn summaries(
    cp: &ControlPlane,
    counters: &load::Counters,
    notes: &Mutex<Vec<String>>,
    started: Instant,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    let mut prev = summary::Previous::default();
    loop {
        tick.tick().await;
        let view = cp.status();
        let (text, next) =
            summary::render(&view, counters.totals(), started.elapsed().as_secs(), &prev);
        prev = next;
        for n in notes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            say!("* {n}");
        }
        say!("{}", text.trim_end());
    }
}

/// Resolves on Ctrl-C (SIGINT), SIGTERM or SIGHUP (the terminal closed).
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
}
