//! Bytes govd writes to its store per apply, per trip and per release, with
//! the state in parts (a file or key each, `store/parts.rs`) against the
//! single `state.json` / `PREFIX/state` value of the earlier layout, which
//! every write rewrote whole (its encoder is kept to read it:
//! `store::legacy::encode`, the bytes it wrote per write).
//!
//! Since each service's compiled config is a part of its own
//! (`store/targets.rs`), an apply that changes one service writes that
//! service's config, not every service's; since the policy part names the
//! services' list and the apply that wrote the configs, not each config,
//! the bytes of such an apply do not depend on the number of services.
//!
//! For each number of services: a compiled policy of that many services
//! (a match, a bulkhead, a fuse and a limit each) in force, with HISTORY
//! versions applied before it (two source files each: the services, shared
//! by every version, and one small file that differs); then one apply
//! (the small file changes), one trip (a limit's latch), one release. The
//! directory's figure is what `DirStore` wrote (file names and contents);
//! etcd's is what `EtcdStore` sent (keys and values), three members on
//! loopback started here (`etcd` on PATH, or `GOV_TEST_ETCD`).
//!
//! ```text
//! cargo bench -j2 -p gov-control-plane --bench store_bytes -- [HISTORY]
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gov_control_plane::etcd::{EtcdConfig, EtcdStore};
use gov_control_plane::latch::{Latch, LatchKind, Released};
use gov_control_plane::store::{
    AppliedPolicy, DirStore, Fence, HistoryEntry, Persisted, Source, Store as _, legacy,
};
use tokio_util::sync::CancellationToken;

fn services(n: usize) -> String {
    (1..n)
        .map(|i| {
            format!(
                "service bench_{i} {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent 10\n  }}\n  fuse f on all {{\n    trip when error_ratio > 50% over 10s min_calls 20\n    recover manual\n  }}\n  limit l on all {{\n    calls 100 per 1s\n  }}\n}}\n"
            )
        })
        .collect()
}

fn changing(version: usize) -> String {
    format!(
        "service bench_0 {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent {}\n  }}\n}}\n",
        2 + version
    )
}

fn sources(n: usize, version: usize) -> Vec<Source> {
    vec![
        Source {
            name: "services.gov".into(),
            text: services(n),
        },
        Source {
            name: "changing.gov".into(),
            text: changing(version),
        },
    ]
}

fn policy(n: usize, version: usize, at: u64) -> AppliedPolicy {
    let sources = sources(n, version);
    let files: Vec<gov_compiler::SourceFile> = sources
        .iter()
        .map(|s| gov_compiler::SourceFile::new(&s.name, &s.text))
        .collect();
    let compiled = gov_compiler::compile(&files).unwrap_or_else(|_| panic!("the policy compiles"));
    AppliedPolicy {
        version: compiled.bundle.version.clone(),
        who: "bench".into(),
        at_unix_ms: at,
        sources,
        bundle: compiled.bundle,
        shadow_since: Default::default(),
    }
}

fn entry(p: &AppliedPolicy) -> HistoryEntry {
    HistoryEntry {
        version: p.version.clone(),
        who: p.who.clone(),
        at_unix_ms: p.at_unix_ms,
        services: vec!["bench_0".into()],
        sources: p.sources.clone(),
        source_refs: Vec::new(),
    }
}

/// The policy of `n` services in force after `history` versions; then the
/// state after one more apply, a trip, and a release.
fn states(n: usize, history: usize) -> [Persisted; 4] {
    let mut start = Persisted::default();
    let shared = sources(n, 0)[0].clone();
    for v in 0..history.saturating_sub(1) {
        // Earlier versions: their sources (their bundles are not kept).
        start.history.push(HistoryEntry {
            version: format!("{v:016x}"),
            who: "bench".into(),
            at_unix_ms: 1_000 + v as u64,
            services: vec!["bench_0".into()],
            sources: vec![
                shared.clone(),
                Source {
                    name: "changing.gov".into(),
                    text: changing(v),
                },
            ],
            source_refs: Vec::new(),
        });
    }
    let current = policy(n, history, 1_000 + history as u64);
    start.history.push(entry(&current));
    start.applied = Some(current);
    let mut applied = start.clone();
    let next = policy(n, history + 1, 1_000_000);
    applied.history.push(entry(&next));
    applied.history.remove(0);
    applied.applied = Some(next);
    let mut tripped = applied.clone();
    tripped.latches.push(Latch {
        kind: LatchKind::Limit,
        rule: "bench_1/l".into(),
        key: String::new(),
        since_unix_ms: 1_000_001,
        reason: "calls 100 per 1s".into(),
        half_open: false,
        deadline_unix_ms: None,
        instances: ["bench-1-a".to_owned()].into(),
        not_enforced: Default::default(),
        reported_by: [("bench-1-a".to_owned(), "token `bench`".to_owned())].into(),
    });
    let mut released = applied.clone();
    released.releases.push(Released {
        kind: LatchKind::Limit,
        rule: "bench_1/l".into(),
        key: String::new(),
        at_unix_ms: 1_000_002,
    });
    [start, applied, tripped, released]
}

fn etcd_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("GOV_TEST_ETCD") {
        return path.into();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
        .expect("the `etcd` server binary on PATH (or GOV_TEST_ETCD)")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Three etcd members on loopback; their client ports.
async fn etcd(dir: &std::path::Path) -> (Vec<tokio::process::Child>, Vec<u16>) {
    let clients: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let cluster = (0..3)
        .map(|i| format!("m{i}=http://127.0.0.1:{}", peers[i]))
        .collect::<Vec<_>>()
        .join(",");
    let members = (0..3)
        .map(|i| {
            tokio::process::Command::new(etcd_bin())
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.join(format!("m{i}")))
                .arg("--listen-client-urls")
                .arg(format!("http://127.0.0.1:{}", clients[i]))
                .arg("--advertise-client-urls")
                .arg(format!("http://127.0.0.1:{}", clients[i]))
                .arg("--listen-peer-urls")
                .arg(format!("http://127.0.0.1:{}", peers[i]))
                .arg("--initial-advertise-peer-urls")
                .arg(format!("http://127.0.0.1:{}", peers[i]))
                .args(["--initial-cluster", &cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--max-request-bytes", "33554432"])
                .args(["--logger", "zap", "--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    (members, clients)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let history: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000);
    let dir = tempfile::tempdir().unwrap();
    let (_members, clients) = etcd(dir.path()).await;
    let hosts: Vec<String> = clients.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let shutdown = CancellationToken::new();
    println!("history: {history} versions; bytes per write (after / before = the whole state)");
    println!(
        "| services | store | apply | trip | release | state written whole (before, per write) |"
    );
    for n in [10, 200, 1_000] {
        let states = states(n, history);
        let whole: Vec<u64> = states
            .iter()
            .map(|s| legacy::encode(s).unwrap().len() as u64)
            .collect();
        let store = DirStore::open(dir.path().join(format!("state-{n}"))).unwrap();
        let mut dir_bytes = [0; 3];
        let mut last = 0;
        for (i, state) in states.iter().enumerate() {
            store.save(state).unwrap();
            let total = store.bytes_written();
            if i > 0 {
                dir_bytes[i - 1] = total - last;
            }
            last = total;
        }
        let url = format!("etcd://{}/bench{n}", hosts.join(","));
        let config = EtcdConfig::parse(&url, "bench", Duration::from_secs(2)).unwrap();
        let mut etcd = None;
        for _ in 0..100 {
            match EtcdStore::connect(config.clone(), shutdown.clone()).await {
                Ok(s) => {
                    etcd = Some(s);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        let etcd = etcd.expect("etcd answers");
        let mut revision = etcd.load().await.unwrap().revision;
        let mut etcd_bytes = [0; 3];
        let mut last = 0;
        for (i, state) in states.iter().enumerate() {
            revision = etcd.save(state, revision, Fence::Any).await.unwrap();
            let total = etcd.bytes_written();
            if i > 0 {
                etcd_bytes[i - 1] = total - last;
            }
            last = total;
        }
        let key = format!("bench{n}/state").len() as u64;
        for (store, bytes, extra) in [("directory", dir_bytes, 0), ("etcd", etcd_bytes, key)] {
            println!(
                "| {n} | {store} | {} / {} ({:.4}) | {} / {} ({:.4}) | {} / {} ({:.4}) | {} |",
                bytes[0],
                whole[1] + extra,
                bytes[0] as f64 / (whole[1] + extra) as f64,
                bytes[1],
                whole[2] + extra,
                bytes[1] as f64 / (whole[2] + extra) as f64,
                bytes[2],
                whole[3] + extra,
                bytes[2] as f64 / (whole[3] + extra) as f64,
                whole[0] + extra,
            );
        }
    }
    shutdown.cancel();
}
