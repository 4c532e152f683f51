//! Control-plane scale: N simulated agents against one real `govd`.
//!
//! `govd` is the real binary in its own process (its RSS and CPU are its
//! own). The agents are N real gRPC `Connect` streams from this one process,
//! each doing what an agent's control client does on the wire and nothing
//! else (no engine): `Hello`, then `Ack` for every `Config` (with its nonce),
//! `EndpointsAck` for every `Endpoints`, and `Stats` (one rule) every second,
//! the agents' phases spread over the second. By default each agent has its
//! own HTTP/2 connection, as real agents do; `STREAMS_PER_CONNECTION` > 1
//! shares connections to go past the file-descriptor limit.
//!
//! Measured: the time until all N are connected; govd's CPU while the N
//! agents only send stats (10 s); `Apply` to all-ACKed (`ApplyRequest.wait_ms`,
//! the whole call as `govc apply` sees it: compile, plan, store with fsync,
//! N pushes, N ACKs) for `APPLIES` applies, p50/p99; govd's RSS before and
//! with the N agents, and its CPU per apply.
//!
//! ```text
//! cargo bench -j2 -p gov-control-plane --bench agents_sim -- [AGENTS] [APPLIES] [STREAMS_PER_CONNECTION]
//! ```
//!
//! `GOV_BENCH_GOVD=PATH` runs another `govd` binary (a copy of an earlier
//! build) against the same simulator, for before/after comparisons in one
//! session. `GOV_BENCH_ETCD=etcd://HOST:PORT,...` keeps govd's state in
//! that etcd (`--store`, a prefix of its own per run) instead of a state
//! directory, and prints the bytes etcd's members received from clients per
//! apply (their `/metrics`: the state, audit records, the agents' registry).
//! `GOV_BENCH_APPLY_GAP_MS=N` (at most 10,000) waits N ms after each apply
//! before the next, counted in that apply's etcd bytes and govd CPU (not
//! its time): past govd's 250 ms debounce of agent-registry writes, each
//! apply's registry write is its own, not shared with the applies around
//! it. Without a gap, applies shorter than the debounce share one registry
//! write, so CPU per apply is comparable across agent counts only with a
//! gap (1,000 ms).
//!
//! After the applies it prints the size of one `Status` answer (every
//! agent's row, and the summary `govc status` asks for) and of the `Watch`
//! views a TUI receives. `GOV_BENCH_HOLD=SECONDS` (at most 3600) then
//! keeps govd and the agents up and prints govd's URL, to point `govc
//! status` and `govc tui` at it.
//!
//! `GOV_BENCH_PAUSE_STATS=1` has the agents send no stats from one second
//! before the first apply until after the last: govd's CPU per apply is
//! then the applies' own, measured, instead of the stats-only rate taken
//! out of it (an estimate, less exact as applies take longer).
//!
//! `GOV_BENCH_STORM=1` adds a reconnect storm after the applies: govd is
//! killed (SIGKILL) and started again on the same address and state
//! directory; every agent reconnects as the real agent does (its
//! `Backoff`: the first attempt spread over a second, then exponential
//! with jitter); measured: the time from the kill until half and all of
//! the agents are SYNCED, govd's CPU meanwhile and the streams it refused.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    reason = "a benchmark fails loudly and prints floats"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gov_proto::v1 as pb;
use gov_proto::v1::agent_message::Msg;
use gov_proto::v1::control_message::Msg as ControlMsg;
use gov_proto::v1::control_plane_client::ControlPlaneClient;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

fn policy(max_concurrent: usize) -> String {
    format!(
        "service bench {{\n  match slow = path prefix \"/slow\"\n  bulkhead slow_calls on slow {{\n    max_concurrent {max_concurrent}\n  }}\n}}\n"
    )
}

/// What the simulated agents did, summed.
#[derive(Default)]
struct Counts {
    configs: AtomicU64,
    stats: AtomicU64,
    /// Streams govd accepted, and refused (or did not answer in 5 s).
    sessions: AtomicU64,
    refused: AtomicU64,
    /// Set while the applies are measured with `GOV_BENCH_PAUSE_STATS=1`:
    /// the agents skip their stats ticks.
    stats_paused: AtomicBool,
}

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// One simulated agent: its streams until `stop`, reconnecting as the
/// agent does (`gov_agent::control::Backoff`: the first reconnect after a
/// lost stream spread over a second, then exponential with jitter).
async fn agent(
    channel: Channel,
    i: usize,
    agents: usize,
    counts: Arc<Counts>,
    stop: CancellationToken,
) {
    let mut backoff = gov_agent::control::Backoff::default();
    let mut version = String::new();
    let mut admitted = 0u64;
    while !stop.is_cancelled() {
        let connected = session(
            channel.clone(),
            i,
            agents,
            &counts,
            &stop,
            &mut version,
            &mut admitted,
        )
        .await;
        if connected {
            backoff.reset();
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// One stream: whether govd accepted it.
async fn session(
    channel: Channel,
    i: usize,
    agents: usize,
    counts: &Counts,
    stop: &CancellationToken,
    version: &mut String,
    admitted: &mut u64,
) -> bool {
    let mut client = ControlPlaneClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel::<pb::AgentMessage>(16);
    let send = |msg: Msg| pb::AgentMessage { msg: Some(msg) };
    tx.try_send(send(Msg::Hello(pb::Hello {
        service: "bench".into(),
        instance: format!("sim-{i}"),
        address: format!("10.{}.{}.{}:8080", i >> 16, (i >> 8) & 255, i & 255),
        last_version: version.clone(),
        ..Default::default()
    })))
    .unwrap();
    let connect = client.connect(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut inbound = match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(_)) | Err(_) => {
            counts.refused.fetch_add(1, Relaxed);
            return false;
        }
    };
    counts.sessions.fetch_add(1, Relaxed);
    // Spread the agents' stats over the second, as agents started at
    // different times would.
    let phase = Duration::from_millis((i * 1000 / agents.max(1)) as u64);
    let mut stats =
        tokio::time::interval_at(tokio::time::Instant::now() + phase, Duration::from_secs(1));
    stats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reply = tokio::select! {
            () = stop.cancelled() => break,
            msg = inbound.message() => match msg {
                Ok(Some(pb::ControlMessage { msg: Some(ControlMsg::Config(c)) })) => {
                    counts.configs.fetch_add(1, Relaxed);
                    *version = c.target.map(|t| t.version).unwrap_or_default();
                    Msg::Ack(pb::Ack { version: version.clone(), nonce: c.nonce, ..Default::default() })
                }
                Ok(Some(pb::ControlMessage { msg: Some(ControlMsg::Endpoints(e)) })) => {
                    Msg::EndpointsAck(pb::EndpointsAck { service: e.service, version: e.version, want_full: false })
                }
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => break,
            },
            _ = stats.tick() => {
                if counts.stats_paused.load(Relaxed) {
                    continue;
                }
                *admitted += 100;
                counts.stats.fetch_add(1, Relaxed);
                Msg::Stats(pb::Stats {
                    at_unix_ms: unix_ms(),
                    version: version.clone(),
                    rules: vec![pb::RuleStats {
                        rule: "bench/slow_calls".into(),
                        kind: pb::RuleKind::Bulkhead as i32,
                        admitted: *admitted,
                        latency_buckets: vec![*admitted, 0, 0, 0, 0, 0, 0, 0],
                        capacity: 10,
                        ..Default::default()
                    }],
                })
            }
        };
        if tx.send(send(reply)).await.is_err() {
            break;
        }
    }
    true
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// User + system CPU time of `pid` (`/proc/PID/stat` fields 14 and 15, in
/// clock ticks of 10 ms: `getconf CLK_TCK` is 100 on Linux).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces: fields start after its `)`.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().unwrap())
        .collect();
    Duration::from_millis((fields[0] + fields[1]) * 10)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn connected(client: &mut ControlPlaneClient<Channel>) -> usize {
    let view = client
        .status(pb::StatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    view.agents
        .iter()
        .filter(|a| a.state() != pb::SyncState::Disconnected)
        .count()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let agents = args.first().copied().unwrap_or(1000);
    let applies = args.get(1).copied().unwrap_or(20);
    let per_connection = args.get(2).copied().unwrap_or(1).max(1);

    let dir = tempfile::tempdir().unwrap();
    let govd_bin =
        std::env::var("GOV_BENCH_GOVD").unwrap_or_else(|_| env!("CARGO_BIN_EXE_govd").to_owned());
    let storm = std::env::var("GOV_BENCH_STORM").is_ok_and(|v| v == "1");
    let hold = std::env::var("GOV_BENCH_HOLD")
        .ok()
        .map(|v| v.parse::<u64>().expect("GOV_BENCH_HOLD: seconds").min(3600));
    let etcd = std::env::var("GOV_BENCH_ETCD").ok();
    let gap = std::env::var("GOV_BENCH_APPLY_GAP_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(Duration::ZERO, |ms| Duration::from_millis(ms.min(10_000)));
    let store: [std::ffi::OsString; 2] = match &etcd {
        // A prefix of its own per run: no state of an earlier run.
        Some(etcd) => [
            "--store".into(),
            format!("{etcd}/bench-sim-{}", std::process::id()).into(),
        ],
        None => ["--state-dir".into(), dir.path().join("state").into()],
    };
    let (mut govd, pid, addr) =
        spawn_govd(&govd_bin, dir.path(), &store, "127.0.0.1:0", agents).await;
    let url = format!("http://{addr}");
    let mut client = gov_control_plane::client::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let rss_idle = rss_kib(pid);

    // Connect: one HTTP/2 connection per `per_connection` agents.
    let counts = Arc::new(Counts::default());
    let stop = CancellationToken::new();
    let endpoint = Endpoint::from_shared(url.clone())
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let cpu_before_connect = cpu(pid);
    let start = Instant::now();
    let mut channel = None;
    for i in 0..agents {
        if i % per_connection == 0 {
            channel = Some(endpoint.connect().await.unwrap());
        }
        tokio::spawn(agent(
            channel.clone().unwrap(),
            i,
            agents,
            counts.clone(),
            stop.clone(),
        ));
    }
    loop {
        let n = connected(&mut client).await;
        if n == agents {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "only {n} of {agents} agents connected"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let connect_time = start.elapsed();
    let connect_cpu = cpu(pid) - cpu_before_connect;
    let rss_connected = rss_kib(pid);

    // Steady state: only stats, 10 s.
    let (cpu0, stats0, t0) = (cpu(pid), counts.stats.load(Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (steady_cpu, steady_wall) = (cpu(pid) - cpu0, t0.elapsed());
    let stats_sent = counts.stats.load(Relaxed) - stats0;

    let pause_stats = std::env::var("GOV_BENCH_PAUSE_STATS").is_ok_and(|v| v == "1");
    if pause_stats {
        counts.stats_paused.store(true, Relaxed);
        // The stats already sent are read before the first apply.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // One warm-up apply (first compile, first file creation), then the measured ones.
    let mut times = Vec::with_capacity(applies);
    let mut apply_cpu = Duration::ZERO;
    // Wall time of the applies with their gaps, over which `apply_cpu` is taken.
    let mut applying = Duration::ZERO;
    let mut etcd_bytes = 0;
    for i in 0..=applies {
        let request = pb::ApplyRequest {
            sources: vec![pb::SourceFile {
                name: "bench.gov".into(),
                text: policy(i + 1),
            }],
            dry_run: false,
            wait_ms: 60_000,
            who: "bench".into(),
            shadow: false,
            allow_remove_all: false,
            ..Default::default()
        };
        let c = cpu(pid);
        let received = etcd_received(etcd.as_deref());
        let t = Instant::now();
        let result = client.apply(request).await.unwrap().into_inner();
        let elapsed = t.elapsed();
        assert!(result.applied);
        let synced = result
            .outcomes
            .iter()
            .filter(|o| o.state() == pb::SyncState::Synced)
            .count();
        assert_eq!(
            synced, agents,
            "apply {i}: only {synced} of {agents} agents ACKed"
        );
        if i > 0 {
            times.push(elapsed);
            // The gap's CPU is the apply's too: the agents' registry write
            // its ACKs made, debounced, lands there (without a gap it lands
            // in a later apply, shared by every apply in its window).
            tokio::time::sleep(gap).await;
            apply_cpu += cpu(pid) - c;
            applying += t.elapsed();
            etcd_bytes += etcd_received(etcd.as_deref()) - received;
        }
    }
    counts.stats_paused.store(false, Relaxed);
    let rss_loaded = rss_kib(pid);
    times.sort();
    let per_agent = |kib: u64| (kib.saturating_sub(rss_idle)) as f64 / agents as f64;

    println!(
        "govd: {govd_bin}; store: {}; agents: {agents} ({per_connection} per HTTP/2 connection), applies: {applies}",
        store[1].to_string_lossy()
    );
    println!(
        "connect: all {agents} connected in {:.2} s, govd CPU {:.2} s",
        connect_time.as_secs_f64(),
        connect_cpu.as_secs_f64()
    );
    println!(
        "steady (stats only): {stats_sent} stats in {:.1} s, govd CPU {:.1}% of one core",
        steady_wall.as_secs_f64(),
        100.0 * steady_cpu.as_secs_f64() / steady_wall.as_secs_f64()
    );
    println!(
        "apply -> all ACKed: p50 {:.1} ms, p99 {:.1} ms, min {:.1} ms, max {:.1} ms; govd CPU {:.1} ms per apply",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        ms(times[0]),
        ms(times[times.len() - 1]),
        ms(apply_cpu) / applies as f64
    );
    if etcd.is_some() {
        println!(
            "etcd: {} bytes received from clients per apply (until all ACKed, then {} ms)",
            etcd_bytes / applies.max(1) as u64,
            gap.as_millis()
        );
    }
    if pause_stats {
        println!(
            "govd CPU per apply, the agents' stats paused ({:.1} ms of apply and gap each): {:.1} ms",
            ms(applying) / applies as f64,
            ms(apply_cpu) / applies as f64
        );
    } else {
        // The agents' stats keep arriving during an apply, and an apply lasts
        // longer with more agents: their share at the stats-only rate, taken
        // out, leaves what the applies themselves cost.
        let stats_share = steady_cpu.as_secs_f64() / steady_wall.as_secs_f64();
        println!(
            "govd CPU per apply without the stats received meanwhile ({:.1}% of a core over {:.1} ms of apply and gap each): {:.1} ms",
            100.0 * stats_share,
            ms(applying) / applies as f64,
            (ms(apply_cpu) - stats_share * ms(applying)) / applies as f64
        );
    }
    println!(
        "govd RSS: {rss_idle} KiB idle, {rss_connected} KiB connected ({:.1} KiB per agent), {rss_loaded} KiB after the applies ({:.1} KiB per agent)",
        per_agent(rss_connected),
        per_agent(rss_loaded)
    );
    println!(
        "agents received {} configs; {} streams accepted for {agents} agents, {} refused or unanswered",
        counts.configs.load(Relaxed),
        counts.sessions.load(Relaxed),
        counts.refused.load(Relaxed)
    );
    view_sizes(&mut client, agents).await;
    if let Some(secs) = hold {
        // For `govc status` and `govc tui` pointed at this govd by hand.
        println!("holding: govd at {url} with {agents} agents for {secs} s");
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    if storm {
        // A reconnect storm: govd killed (SIGKILL, no drain) and started
        // again on the same address and state directory; every agent lost
        // its stream at once and reconnects with the agent's backoff.
        let refused0 = counts.refused.load(Relaxed);
        govd.kill().await.unwrap();
        let killed = Instant::now();
        let (restarted, pid, _) = spawn_govd(&govd_bin, dir.path(), &store, &addr, agents).await;
        govd = restarted;
        let mut client = loop {
            if let Ok(c) = gov_control_plane::client::connect(&url, Duration::from_secs(5)).await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut half = None;
        let synced_in = loop {
            let synced = synced(&mut client).await.unwrap_or(0);
            if half.is_none() && synced * 2 >= agents {
                half = Some(killed.elapsed());
            }
            if synced == agents {
                break killed.elapsed();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(300),
                "storm: only {synced} of {agents} agents SYNCED after 300 s"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        println!(
            "storm: govd killed and restarted; half the agents SYNCED in {:.2} s, all {agents} in {:.2} s; govd CPU {:.2} s; {} streams refused or unanswered meanwhile; govd RSS {} KiB",
            half.unwrap_or_default().as_secs_f64(),
            synced_in.as_secs_f64(),
            cpu(pid).as_secs_f64(),
            counts.refused.load(Relaxed) - refused0,
            rss_kib(pid)
        );
    }
    stop.cancel();
    govd.kill().await.unwrap();
}

/// What one `Status` answer and one `Watch` view weigh at `agents` agents
/// (issue 35): every agent's row (what a client that asks nothing gets),
/// and the summary `govc status` asks for (the agents not SYNCED, at most
/// 50, and the counts per service and state).
async fn view_sizes(client: &mut ControlPlaneClient<Channel>, agents: usize) {
    use prost::Message as _;
    let requests = [
        ("every agent", pb::AgentRows::All, 0),
        (
            "summary (not SYNCED, at most 50)",
            pb::AgentRows::NotSynced,
            50,
        ),
    ];
    for (what, rows, max) in requests {
        let request = pb::StatusRequest {
            service: String::new(),
            agent_rows: rows as i32,
            max_agents: max,
        };
        let t = Instant::now();
        let view = client.status(request).await.unwrap().into_inner();
        let took = t.elapsed();
        println!(
            "status, {what}: {} bytes, {} agent rows, {} counts, in {:.1} ms ({agents} agents)",
            view.encoded_len(),
            view.agents.len(),
            view.agent_counts.len(),
            ms(took)
        );
    }
    let request = pb::WatchRequest::default();
    let mut watch = client.watch(request).await.unwrap().into_inner();
    let t = Instant::now();
    let first = watch.message().await.unwrap().unwrap();
    let took = t.elapsed();
    // The next view, published on the agents' next stats (about once a second).
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await;
    let next = next.ok().and_then(Result::ok).flatten();
    println!(
        "watch, every agent: first view {} bytes in {:.1} ms, next {} bytes",
        first.encoded_len(),
        ms(took),
        next.map_or(0, |v| v.encoded_len())
    );
}

/// Agents SYNCED, as `govc status` sees them; `None` while govd does not answer.
async fn synced(client: &mut ControlPlaneClient<Channel>) -> Option<usize> {
    let view = client
        .status(pb::StatusRequest::default())
        .await
        .ok()?
        .into_inner();
    Some(
        view.agents
            .iter()
            .filter(|a| a.state() == pb::SyncState::Synced)
            .count(),
    )
}

/// Bytes the members of `etcd` (`etcd://HOST:PORT,...`) received from
/// clients so far, from their `/metrics`; 0 without it.
fn etcd_received(etcd: Option<&str>) -> u64 {
    use std::io::{Read as _, Write as _};
    let Some(url) = etcd else { return 0 };
    let hosts = url.trim_start_matches("etcd://").split('/').next().unwrap();
    hosts
        .split(',')
        .map(|host| {
            let mut stream = std::net::TcpStream::connect(host).unwrap();
            let request = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
            stream.write_all(request.as_bytes()).unwrap();
            let mut text = String::new();
            stream.read_to_string(&mut text).unwrap();
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix("etcd_network_client_grpc_received_bytes_total "))
                .expect("etcd's /metrics count the bytes received from clients");
            value.trim().parse::<f64>().unwrap() as u64
        })
        .sum()
}

/// `govd` on `listen` with its log in `dir` and its state where `store`
/// says (`--state-dir DIR` or `--store URL`), room for `agents`: its
/// process, pid and address.
async fn spawn_govd(
    bin: &str,
    dir: &std::path::Path,
    store: &[std::ffi::OsString],
    listen: &str,
    agents: usize,
) -> (tokio::process::Child, u32, String) {
    let log = dir.join("govd.log");
    let govd = tokio::process::Command::new(bin)
        .args(["--insecure", "--listen", listen])
        .args(store)
        // Room for every simulated agent (the default cap is 1,024).
        .arg("--max-connections")
        .arg((agents + 16).to_string())
        // Every simulated agent is one service's instance on one address:
        // above the per-address and per-service caps of issue 28.
        .arg("--max-connections-per-client")
        .arg((agents + 16).to_string())
        .arg("--max-agents-per-service")
        .arg((agents + 16).to_string())
        .env("GOV_LOG", "warn,govd=info")
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = govd.id().unwrap();
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(a) = text.lines().find_map(|l| l.split("listen=").nth(1)) {
            let addr = a.split_whitespace().next().unwrap().to_owned();
            return (govd, pid, addr);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "govd did not start:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
