//! A bounded chaos run (issue 26): two govd replicas on three etcd members,
//! a real agent connected to both, and a stream of applies through `govc`
//! while replicas are SIGKILLed and restarted or SIGSTOPped for a while and
//! an etcd member dies. Its promises, checked at the end:
//!
//! - every apply that exited 0 took effect and is audited `apply` once;
//! - every `apply-intended` has exactly one outcome (`apply` or
//!   `apply-refused`), so an apply that exited non-zero is never recorded as
//!   applied without its intent's outcome saying so;
//! - the agent never enforced an older policy than one it had enforced.
//!
//! The seed is fixed (the same actions each run; their timing is the
//! machine's); `GOV_CHAOS_SECS` sets the length (default 45 s).

use std::collections::BTreeMap;

use rand::{Rng as _, SeedableRng as _};

use super::replicas::{Etcd, apply_on, policy};
use super::*;

/// One apply as `govc` saw it.
#[derive(Debug)]
struct Applied {
    max: u32,
    code: i32,
    /// `Applied version X.` (12 characters) when it exited 0.
    version: Option<String>,
}

/// A replica of `store` (`replicas::replica`, with a short intent grace).
fn replica_at(store: &str, dir: &Path, name: &str) -> ControlPlaneBuilder {
    let mut b = control_plane(&dir.join(name));
    b.store = Some(store.to_owned());
    b.args(&[
        "--replica",
        name,
        "--leader-lease",
        "2s",
        "--audit-intent-grace",
        "2s",
    ])
}

/// The agent's bulkhead size in its config in force (policy(n) sets n).
async fn enforced(admin: SocketAddr) -> Option<u32> {
    let (status, _, body) = http_get(admin, "/config").await;
    if status != 200 {
        return None;
    }
    // The test client reads the chunked body raw: the JSON is between the
    // first `{` and the last `}`.
    let json = &body[body.find('{')?..=body.rfind('}')?];
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    fn find(v: &serde_json::Value) -> Option<u64> {
        match v {
            serde_json::Value::Object(map) => map
                .iter()
                .find(|(k, _)| *k == "max_concurrent" || *k == "maxConcurrent")
                .and_then(|(_, v)| v.as_u64())
                .or_else(|| map.values().find_map(find)),
            serde_json::Value::Array(items) => items.iter().find_map(find),
            _ => None,
        }
    }
    find(&value).and_then(|n| u32::try_from(n).ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kills_and_pauses_never_break_what_an_apply_promised() {
    let secs: u64 = std::env::var("GOV_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    let mut etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = etcd.url("gov");
    let start = |name: &'static str, port: u16| replica_at(&store, dir.path(), name).start_on(port);
    let mut govds = [start("a", 0).await, start("b", 0).await];
    let ports: Vec<u16> = govds.iter().map(|g| g.addr.port()).collect();
    let list = format!("{},{}", govds[0].url(), govds[1].url());
    apply_on(&govds[0], &policy(1)).await.unwrap();
    let up = upstream().await;
    let agent = agent("order", "order-1")
        .upstream(up)
        .control_plane_url(list.clone())
        .start(dir.path())
        .await;

    // What the agent enforces, sampled all along.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let watching = {
        let seen = seen.clone();
        let admin = agent.admin;
        tokio::spawn(async move {
            loop {
                if let Some(n) = enforced(admin).await {
                    let mut seen = seen.lock().unwrap();
                    if seen.last() != Some(&n) {
                        seen.push(n);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let mut applied = Vec::new();
    let mut stopped: Option<(usize, Instant)> = None;
    let mut etcd_member_killed = false;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut max = 1;
    while Instant::now() < deadline {
        // A paused replica resumes after 1-4 s.
        if let Some((i, until)) = stopped
            && Instant::now() >= until
        {
            signal(&govds[i].child, rustix::process::Signal::CONT);
            stopped = None;
        }
        match rng.random_range(0..10) {
            0..6 => {
                max += 1;
                let file = write(dir.path(), &format!("p{max}.gov"), &policy(max));
                let out = govc(
                    &govds[0],
                    Some(TOKEN),
                    &["apply", &file, "--control-plane", &list],
                )
                .await;
                let version = out
                    .stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("Applied version "))
                    .map(|v| v.trim_end_matches('.').to_owned());
                applied.push(Applied {
                    max,
                    code: out.code,
                    version,
                });
            }
            6 | 7 if stopped.is_none() => {
                // SIGKILL a replica, then start it again on its port.
                let i = rng.random_range(0..2);
                let name = ["a", "b"][i];
                govds[i].child.kill().await.unwrap();
                govds[i] = start(name, ports[i]).await;
            }
            8 if stopped.is_none() => {
                let i = rng.random_range(0..2);
                signal(&govds[i].child, rustix::process::Signal::STOP);
                stopped = Some((
                    i,
                    Instant::now() + Duration::from_millis(rng.random_range(1000..4000)),
                ));
            }
            9 if !etcd_member_killed => {
                etcd.kill(rng.random_range(0..3)).await;
                etcd_member_killed = true;
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    if let Some((i, _)) = stopped {
        signal(&govds[i].child, rustix::process::Signal::CONT);
    }
    // Settle: the intents' grace (2 s) passes and a leader answers them.
    tokio::time::sleep(Duration::from_secs(6)).await;
    watching.abort();

    let audit = govc(
        &govds[0],
        Some(VIEWER_TOKEN),
        &["audit", "-o", "json", "--control-plane", &list],
    )
    .await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let all: serde_json::Value = serde_json::from_str(&audit.stdout).unwrap();
    let records = all
        .get("records")
        .and_then(|r| r.as_array().cloned())
        .or_else(|| all.as_array().cloned())
        .unwrap_or_default();
    let field =
        |r: &serde_json::Value, k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("").to_owned();
    // Per intent id: its intent and outcomes.
    let mut intents: BTreeMap<String, (u32, Vec<String>)> = BTreeMap::new();
    let mut outcomes_of_version: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &records {
        let (action, intent, version) =
            (field(r, "action"), field(r, "intent"), field(r, "version"));
        if action == "apply-intended" {
            intents.entry(intent).or_default().0 += 1;
        } else if action == "apply" || action == "apply-refused" {
            if !intent.is_empty() {
                intents.entry(intent).or_default().1.push(action.clone());
            }
            outcomes_of_version.entry(version).or_default().push(action);
        }
    }
    let summary = format!(
        "{} applies ({} exited 0); agent saw {:?}",
        applied.len(),
        applied.iter().filter(|a| a.code == 0).count(),
        seen.lock().unwrap()
    );
    for (id, (count, outcomes)) in &intents {
        if *count > 0 {
            assert_eq!(
                outcomes.len(),
                1,
                "intent {id} has outcomes {outcomes:?}; {summary}"
            );
        }
    }
    let applied_outcomes = |short: &str| {
        outcomes_of_version
            .iter()
            .filter(|(v, _)| v.starts_with(short))
            .flat_map(|(_, o)| o.iter().filter(|a| *a == "apply"))
            .count()
    };
    // An apply that exited non-zero prints no version, so it cannot be
    // matched to records here; the intents' outcomes above cover it.
    for a in applied.iter().filter(|a| a.code == 0) {
        // `No changes` has no version line and no record.
        if let Some(short) = &a.version {
            assert_eq!(
                applied_outcomes(short),
                1,
                "apply {} exited 0: {a:?}; {summary}",
                a.max
            );
        }
    }
    let seen = seen.lock().unwrap().clone();
    if seen.is_empty() {
        let (status, _, body) = http_get(agent.admin, "/config").await;
        panic!("the agent's /config ({status}) gave no bulkhead size: {body}");
    }
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "the agent went back to an older policy: {seen:?}; {summary}"
    );
    assert!(applied.iter().any(|a| a.code == 0), "{summary}");
    eprintln!("chaos: {summary}");
    drop(agent);
}
