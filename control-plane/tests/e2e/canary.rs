//! Canary applies against a real govd, real agents and real upstreams
//! (issue 34): a canary rolled back on its own under load with no failed
//! call outside it, one promoted when its window ends, and one aborted by
//! an operator after a govd restart.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use super::*;

const OLD: &str = r#"service order {
  match all = path prefix "/"
  bulkhead all_calls on all {
    max_concurrent 200
  }
}
"#;

/// OLD with a bulkhead that changes nothing for the load below.
fn good() -> String {
    OLD.replacen("max_concurrent 200", "max_concurrent 100", 1)
}

/// OLD with a limit that rejects most of the load below.
fn bad() -> String {
    OLD.replacen(
        "}\n}\n",
        "}\n\n  limit tight on all {\n    calls 2 per 1s\n  }\n}\n",
        1,
    )
}

/// `n` order agents (`order-1` ...), each in front of its own upstream,
/// connected to `govd`.
async fn order_agents(govd: &Govd, dir: &Path, n: usize) -> Vec<Agent> {
    let mut agents = Vec::new();
    for i in 1..=n {
        let up = upstream().await;
        agents.push(
            agent("order", &format!("order-{i}"))
                .upstream(up)
                .control_plane(govd)
                .start(dir)
                .await,
        );
    }
    agents
}

async fn audit(govd: &Govd) -> Vec<serde_json::Value> {
    let audit = govc(govd, Some(VIEWER_TOKEN), &["audit", "-o", "json"]).await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    serde_json::from_str(&audit.stdout).unwrap()
}

fn actions(records: &[serde_json::Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["action"].as_str().unwrap().to_owned())
        .collect()
}

/// GETs through every agent in turn until `stop` (at most 4,000 calls and
/// 60s): each agent's statuses.
fn load(
    agents: Vec<(String, SocketAddr)>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<String, Vec<u16>>> {
    tokio::spawn(async move {
        let mut seen: BTreeMap<String, Vec<u16>> = BTreeMap::new();
        let started = Instant::now();
        for n in 0..4_000 {
            if stop.load(Ordering::Relaxed) || started.elapsed() > Duration::from_secs(60) {
                break;
            }
            let (name, addr) = &agents[n % agents.len()];
            let (status, _, _) = http_get(*addr, "/").await;
            seen.entry(name.clone()).or_default().push(status);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seen
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_rejects_is_rolled_back_on_its_own_and_the_others_fail_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let agents = order_agents(&govd, dir.path(), 4).await;
    let old = write(dir.path(), "old.gov", OLD);
    let applied = govc(&govd, Some(TOKEN), &["apply", &old]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let names = ["order-1", "order-2", "order-3", "order-4"];
    wait_until("every agent synced", Duration::from_secs(10), async || {
        all_synced(&govd, &names).await
    })
    .await;
    let before = govd.status().await.version;

    let stop = Arc::new(AtomicBool::new(false));
    let traffic = load(
        names
            .iter()
            .zip(&agents)
            .map(|(n, a)| ((*n).to_owned(), a.inbound))
            .collect(),
        stop.clone(),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A limit of 2 calls a second under this load: the canary instance
    // rejects most calls, the others none, so it is rolled back long
    // before its minute is over.
    let bad = write(dir.path(), "bad.gov", &bad());
    let started = Instant::now();
    let canary = govc(
        &govd,
        Some(TOKEN),
        &[
            "apply",
            &bad,
            "--canary",
            "25%",
            "--for",
            "60s",
            "--max-reject-ratio",
            "5%",
            "--min-calls",
            "10",
        ],
    )
    .await;
    assert_eq!(canary.code, 0, "{}{}", canary.stdout, canary.stderr);
    assert!(
        canary.stdout.contains("Canary of version") && canary.stdout.contains("order/order-1"),
        "{}",
        canary.stdout
    );
    let view = govd.status().await;
    let running = view.canary.expect("the canary runs");
    assert_eq!(running.instances, ["order/order-1"]);
    assert_eq!(
        view.version, before,
        "the version in force is still the old one"
    );
    wait_until(
        "the canary rolled back",
        Duration::from_secs(30),
        async || govd.status().await.canary.is_none(),
    )
    .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(45),
        "rolled back within the window: {took:?}"
    );
    wait_until(
        "order-1 back on the old version",
        Duration::from_secs(10),
        async || {
            let view = govd.status().await;
            let a = agent_state(&view, "order-1");
            a.state() == pb::SyncState::Synced
                && a.last_good_version == agent_state(&view, "order-2").last_good_version
        },
    )
    .await;
    // The rolled-back instance serves again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = traffic.await.unwrap();
    for name in &names[1..] {
        let statuses = &seen[*name];
        assert!(statuses.len() > 20, "{name}: {statuses:?}");
        assert!(
            statuses.iter().all(|&s| s == 200),
            "{name} is outside the canary and must fail nothing: {statuses:?}"
        );
    }
    let canary_statuses = &seen["order-1"];
    assert!(
        canary_statuses.contains(&429),
        "the canary enforced the new limit: {canary_statuses:?}"
    );
    assert_eq!(
        canary_statuses.last(),
        Some(&200),
        "and serves again once rolled back"
    );
    assert_eq!(govd.status().await.version, before);
    let records = audit(&govd).await;
    let acts = actions(&records);
    assert!(
        acts.ends_with(&[
            "canary-start-intended".to_owned(),
            "canary-start".to_owned(),
            "canary-rollback-intended".to_owned(),
            "canary-rollback".to_owned()
        ]),
        "{acts:?}"
    );
    let rollback = records.last().unwrap();
    assert_eq!(rollback["who"], "govd (canary)");
    assert!(
        rollback["detail"]
            .as_str()
            .unwrap()
            .contains("`order/tight`: the canary rejected"),
        "{rollback}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_canary_is_promoted_and_an_aborted_one_survives_a_govd_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let agents = order_agents(&govd, dir.path(), 2).await;
    let names = ["order-1", "order-2"];
    let old = write(dir.path(), "old.gov", OLD);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &old]).await.code, 0);
    wait_until("every agent synced", Duration::from_secs(10), async || {
        all_synced(&govd, &names).await
    })
    .await;

    // A short window, bounded load: promoted at the end, everywhere.
    let good = write(dir.path(), "good.gov", &good());
    let canary = govc(
        &govd,
        Some(TOKEN),
        &["apply", &good, "--canary", "50%", "--for", "3s"],
    )
    .await;
    assert_eq!(canary.code, 0, "{}{}", canary.stdout, canary.stderr);
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(status.stdout.contains("CANARY"), "{}", status.stdout);
    for i in 0..20 {
        let agent = &agents[i % 2];
        assert_eq!(http_get(agent.inbound, "/").await.0, 200);
    }
    wait_until(
        "the canary was promoted",
        Duration::from_secs(20),
        async || govd.status().await.canary.is_none(),
    )
    .await;
    let version = govd.status().await.version;
    wait_until(
        "both agents on the promoted version",
        Duration::from_secs(10),
        async || all_synced(&govd, &names).await,
    )
    .await;
    let acts = actions(&audit(&govd).await);
    assert!(
        acts.ends_with(&[
            "canary-promote-intended".to_owned(),
            "canary-promote".to_owned()
        ]),
        "{acts:?}"
    );

    // A long one, which a restart of govd keeps, and an operator aborts.
    let canary = govc(
        &govd,
        Some(TOKEN),
        &["apply", &old, "--canary", "10%", "--for", "10m"],
    )
    .await;
    assert_eq!(canary.code, 0, "{}{}", canary.stdout, canary.stderr);
    // Another apply waits for the canary's end (this one changes the
    // version in force: `good` would be no change).
    let other = write(dir.path(), "bad.gov", &bad());
    let refused = govc(&govd, Some(TOKEN), &["apply", &other]).await;
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        flat(&refused.stderr).contains("a canary of version"),
        "{}",
        refused.stderr
    );
    govd.stop().await;
    let govd = control_plane(&state).start_on(port).await;
    let running = govd.status().await.canary.expect("kept across the restart");
    assert_eq!(running.instances, ["order/order-1"]);
    wait_until(
        "the agents reconnected",
        Duration::from_secs(20),
        async || all_synced(&govd, &names).await,
    )
    .await;
    let view = govd.status().await;
    assert_ne!(
        agent_state(&view, "order-1").last_good_version,
        agent_state(&view, "order-2").last_good_version,
        "the canary instance enforces the version on trial, the other the one in force"
    );
    let viewer = govc(&govd, Some(VIEWER_TOKEN), &["canary", "abort"]).await;
    assert_ne!(viewer.code, 0, "a viewer may not end a canary");
    let aborted = govc(
        &govd,
        Some(OPERATOR_TOKEN),
        &["canary", "abort", "--reason", "looks wrong"],
    )
    .await;
    assert_eq!(aborted.code, 0, "{}", aborted.stderr);
    assert!(aborted.stdout.contains("aborted"), "{}", aborted.stdout);
    assert!(govd.status().await.canary.is_none());
    assert_eq!(
        govd.status().await.version,
        version,
        "the version in force stays"
    );
    wait_until(
        "order-1 back on the version in force",
        Duration::from_secs(10),
        async || {
            let view = govd.status().await;
            all_synced(&govd, &names).await
                && agent_state(&view, "order-1").last_good_version
                    == agent_state(&view, "order-2").last_good_version
        },
    )
    .await;
    let again = govc(&govd, Some(OPERATOR_TOKEN), &["canary", "abort"]).await;
    assert_eq!(again.code, 1);
    assert!(
        flat(&again.stderr).contains("no canary is running"),
        "{}",
        again.stderr
    );
    let records = audit(&govd).await;
    let last = records.last().unwrap();
    assert_eq!(last["action"], "canary-abort");
    assert_eq!(last["who"], "oncall");
    assert_eq!(last["detail"], "looks wrong");
}
