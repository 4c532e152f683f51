//! Apply fan-out: the time from `Apply` to every one of N agents having
//! ACKed, on loopback, and `govd`'s resident memory with N agents connected.
//!
//! The control plane is the real `govd` binary (a separate process, so its
//! RSS is its own); the N agents are the real control-plane client
//! (`gov_agent::control::run`) each with its own engine, in this process.
//! Every apply changes the one service all agents belong to, so each apply
//! pushes N configs and waits for N ACKs (`ApplyRequest.wait_ms`); the time
//! measured is the whole `Apply` call as `govc apply` sees it: compile, plan,
//! store (fsync), push, N ACKs, answer.
//!
//! ```text
//! cargo bench -j2 -p gov-control-plane --bench apply_fanout -- [AGENTS] [APPLIES]
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::time::{Duration, Instant};

use gov_agent::control::{ControlOptions, run};
use gov_engine::Engine;
use gov_proto::v1 as pb;
use tokio_util::sync::CancellationToken;

fn policy(max_concurrent: usize) -> String {
    format!(
        "service bench {{\n  match slow = path prefix \"/slow\"\n  bulkhead slow_calls on slow {{\n    max_concurrent {max_concurrent}\n  }}\n}}\n"
    )
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let agents = args.first().copied().unwrap_or(100);
    let applies = args.get(1).copied().unwrap_or(30);

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("govd.log");
    let mut govd = tokio::process::Command::new(env!("CARGO_BIN_EXE_govd"))
        .args(["--listen", "127.0.0.1:0", "--insecure", "--state-dir"])
        .arg(dir.path().join("state"))
        .env("GOV_LOG", "warn,govd=info,gov_control_plane::server=debug")
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = govd.id().unwrap();
    let addr = {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(a) = text.lines().find_map(|l| l.split("listen=").nth(1)) {
                break a.split_whitespace().next().unwrap().to_owned();
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "govd did not start:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let url = format!("http://{addr}");
    let rss_idle = rss_kib(pid);

    let shutdown = CancellationToken::new();
    for i in 0..agents {
        let mut options = ControlOptions::new(url.clone(), "bench", format!("bench-{i}"));
        options.address = format!("127.0.0.1:{}", 10_000 + i);
        tokio::spawn(run(Engine::empty("bench"), options, shutdown.clone()));
    }
    let mut client = gov_control_plane::client::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let start = Instant::now();
    loop {
        let view = client
            .status(pb::StatusRequest::default())
            .await
            .unwrap()
            .into_inner();
        let connected = view
            .agents
            .iter()
            .filter(|a| a.state() != pb::SyncState::Disconnected)
            .count();
        if connected == agents {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {connected} of {agents} agents connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // One warm-up apply (first compile, first file creation), then the measured ones.
    let mut times = Vec::with_capacity(applies);
    for i in 0..=applies {
        let request = pb::ApplyRequest {
            sources: vec![pb::SourceFile {
                name: "bench.gov".into(),
                text: policy(i + 1),
            }],
            dry_run: false,
            wait_ms: 10_000,
            who: "bench".into(),
            shadow: false,
            allow_remove_all: false,
            ..Default::default()
        };
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
            "apply {i}: only {synced} of {agents} agents ACKed: {:?}",
            result.outcomes
        );
        if i > 0 {
            times.push(elapsed);
        }
    }
    let rss_loaded = rss_kib(pid);
    times.sort();
    let median = percentile(&times, 0.5);
    let p99 = percentile(&times, 0.99);
    println!("agents: {agents}, applies: {applies}");
    println!(
        "apply -> all ACKed: median {:.2} ms, p99 {:.2} ms, min {:.2} ms, max {:.2} ms",
        median.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
    println!(
        "govd RSS: {rss_idle} KiB idle, {rss_loaded} KiB with {agents} agents connected after {applies} applies"
    );
    // Where the time goes, from govd's own log (median of each phase).
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for phase in ["compile_plan_ms", "store_ms", "push_ms", "acks_ms"] {
        let mut v: Vec<f64> = text
            .lines()
            .filter(|l| l.contains("apply timing"))
            .filter_map(|l| {
                l.split(&format!("{phase}="))
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        v.sort_by(f64::total_cmp);
        if let Some(m) = v.get(v.len() / 2) {
            println!("  govd {phase}: median {m:.2}");
        }
    }
    shutdown.cancel();
    govd.kill().await.unwrap();
}
