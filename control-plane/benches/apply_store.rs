//! Apply latency with the state in etcd versus in the state directory: two
//! real `govd` processes, one `--state-dir`, one `--store etcd://...` (the
//! etcd named by `GOV_BENCH_ETCD`, see BENCHMARKS.md), each with the same
//! number of real agent control clients; applies alternate between the two
//! (interleaved, so a busy box weighs on both alike), each changing the one
//! service every agent runs and waiting for every ACK.
//!
//! Two figures per store: the client's wall time of `Apply` (compile, plan,
//! audit, store, push, every ACK, answer) and govd's own `elapsed_ms` for
//! the apply up to stored and pushed (its log), which isolates the store.
//!
//! ```text
//! GOV_BENCH_ETCD=etcd://127.0.0.1:2379 cargo bench -j2 -p gov-control-plane --bench apply_store -- [AGENTS] [APPLIES]
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::path::Path;
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Govd {
    child: tokio::process::Child,
    url: String,
    log: std::path::PathBuf,
    client: pb::control_plane_client::ControlPlaneClient<tonic::transport::Channel>,
}

async fn govd(
    dir: &Path,
    name: &str,
    store: &[&str],
    agents: usize,
    stop: &CancellationToken,
) -> Govd {
    let log = dir.join(format!("{name}.log"));
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_govd"))
        .args(["--listen", "127.0.0.1:0", "--insecure"])
        .args(store)
        .env("GOV_LOG", "warn,govd=info,gov_control_plane=info")
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let addr = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(a) = text.lines().find_map(|l| l.split("listen=").nth(1)) {
            break a.split_whitespace().next().unwrap().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "govd did not start:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let url = format!("http://{addr}");
    for i in 0..agents {
        let mut options = ControlOptions::new(url.clone(), "bench", format!("{name}-{i}"));
        options.address = format!("127.0.0.1:{}", 10_000 + i);
        tokio::spawn(run(Engine::empty("bench"), options, stop.clone()));
    }
    let client = gov_control_plane::client::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    Govd {
        child,
        url,
        log,
        client,
    }
}

/// govd's `elapsed_ms` of each stored-and-pushed apply, in order.
fn govd_elapsed(log: &Path) -> Vec<f64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("apply stored and pushed"))
        .filter_map(|l| {
            l.split("elapsed_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let etcd = std::env::var("GOV_BENCH_ETCD")
        .expect("GOV_BENCH_ETCD=etcd://HOST:PORT,... names the etcd to bench (see BENCHMARKS.md)");
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let agents = args.first().copied().unwrap_or(10);
    let applies = args.get(1).copied().unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let state = dir.path().join("state").display().to_string();
    // A prefix of its own per run: no state of an earlier run.
    let prefix = format!("{etcd}/bench-{}", std::process::id());
    let mut stores = [
        (
            "dir",
            govd(dir.path(), "dir", &["--state-dir", &state], agents, &stop).await,
        ),
        (
            "etcd",
            govd(dir.path(), "etcd", &["--store", &prefix], agents, &stop).await,
        ),
    ];
    // Every agent connected (its first config needs a first apply: the warm-up).
    let mut wall: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..=applies {
        for (s, (name, g)) in stores.iter_mut().enumerate() {
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
            if i == 0 {
                // Warm-up: wait until every agent is there, then apply once.
                let start = Instant::now();
                loop {
                    let view = g
                        .client
                        .status(pb::StatusRequest::default())
                        .await
                        .unwrap()
                        .into_inner();
                    if view.agents.len() == agents {
                        break;
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(30),
                        "{name}: agents missing"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let t = Instant::now();
            let result = g.client.apply(request).await.unwrap().into_inner();
            let elapsed = t.elapsed().as_secs_f64() * 1e3;
            assert!(result.applied, "{name}: {result:?}");
            let synced = result
                .outcomes
                .iter()
                .filter(|o| o.state() == pb::SyncState::Synced)
                .count();
            assert_eq!(synced, agents, "{name} apply {i}: {:?}", result.outcomes);
            if i > 0 {
                wall[s].push(elapsed);
            }
        }
    }
    println!("agents per govd: {agents}, applies per store: {applies} (interleaved)");
    for (s, (name, g)) in stores.iter_mut().enumerate() {
        let mut own = govd_elapsed(&g.log);
        own.remove(0);
        own.sort_by(f64::total_cmp);
        wall[s].sort_by(f64::total_cmp);
        println!(
            "{name:>4} ({}): apply -> all ACKed p50 {:.1} ms, p99 {:.1} ms; govd to stored and pushed p50 {:.1} ms, p99 {:.1} ms",
            g.url,
            percentile(&wall[s], 0.5),
            percentile(&wall[s], 0.99),
            percentile(&own, 0.5),
            percentile(&own, 0.99),
        );
    }
    stop.cancel();
    for (_, g) in &mut stores {
        g.child.kill().await.unwrap();
    }
}
