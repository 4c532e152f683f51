//! govd's state across restarts and disk faults: applied policies, agents'
//! last good configs, and writes a read-only state directory refuses.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_restarts_of_govd_and_of_agents_while_govd_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let up = upstream().await;
    let a_dir = dir.path().join("agent-a");
    let a = agent("order", "order-a")
        .upstream(up)
        .control_plane(&govd)
        .state_dir(&a_dir)
        .start(dir.path())
        .await;
    let b = agent("order", "order-b")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until(
        "two agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 2,
    )
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(
        govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1])
            .await
            .code,
        0
    );
    let version = govd.status().await.version;

    // Latch the fuse and engage the limit on agent b.
    for _ in 0..3 {
        assert_eq!(http_get(b.inbound, "/fail").await.0, 500);
    }
    let tripped = http_get(b.inbound, "/fail").await;
    assert_eq!(
        (tripped.0, tripped.1.as_deref()),
        (503, Some("order/errors"))
    );
    for _ in 0..3 {
        assert_eq!(http_get(b.inbound, "/burst").await.0, 200);
    }
    assert_eq!(http_get(b.inbound, "/burst").await.0, 429);
    wait_until(
        "fuse and limit recorded",
        Duration::from_secs(10),
        async || {
            let v = govd.status().await;
            v.fuses.len() == 1 && v.limits.len() == 1
        },
    )
    .await;
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(
        status.stdout.contains("order/errors  OPEN"),
        "{}",
        status.stdout
    );
    // A filter naming no known service is an error, not an empty table.
    let unknown = govc(&govd, Some(VIEWER_TOKEN), &["status", "-s", "nosuch"]).await;
    assert_eq!(unknown.code, 1, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("govd knows no service `nosuch`"),
        "{}",
        unknown.stderr
    );
    let known = govc(&govd, Some(VIEWER_TOKEN), &["status", "-s", "order"]).await;
    assert_eq!(known.code, 0, "{}", known.stderr);
    assert!(
        status.stdout.contains("manual (govc release fuse)"),
        "{}",
        status.stdout
    );
    // govd shows a trip as soon as it holds it, and writes it (audit, then
    // its latch's file) right after: a crash in between loses nothing the agents
    // enforce (they report the latch again), but the limit's release would
    // count from the report after the restart. This test is about what was
    // written, so it kills govd only once both trips are on disk.
    wait_until("both trips written", Duration::from_secs(10), async || {
        gov_control_plane::store::DirStore::open(&state)
            .and_then(|s| s.load())
            .is_ok_and(|p| p.latches.len() == 2)
    })
    .await;
    let before = govd.status().await;
    let remaining_before = before.limits[0].remaining_ms;
    assert!(
        remaining_before > 7_100_000 && remaining_before <= 7_200_000,
        "{remaining_before}"
    );

    // govd dies hard; the agents keep enforcing.
    govd.kill().await;
    assert_eq!(slow_burst(a.inbound, 6).await, (2, 4));
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);

    // Agent a restarts while govd is down: it enforces its last good config from disk.
    a.stop().await;
    let a = agent("order", "order-a")
        .upstream(up)
        .control_plane_url(format!("http://127.0.0.1:{port}"))
        .state_dir(&a_dir)
        .start(dir.path())
        .await;
    wait_until(
        "agent a loaded its config from disk",
        Duration::from_secs(10),
        async || read(&a.log).contains("enforcing the last good config from disk"),
    )
    .await;
    assert_eq!(slow_burst(a.inbound, 6).await, (2, 4));

    // govd comes back on the same port: agents reconnect, state is as before.
    let govd = control_plane(&state).start_on(port).await;
    wait_until(
        "both agents reconnected and synced",
        Duration::from_secs(40),
        async || all_synced(&govd, &["order-a", "order-b"]).await,
    )
    .await;
    let after = govd.status().await;
    assert_eq!(after.version, version);
    assert_eq!(after.fuses.len(), 1, "{after:?}");
    assert_eq!(after.fuses[0].since_unix_ms, before.fuses[0].since_unix_ms);
    assert_eq!(after.limits.len(), 1, "{after:?}");
    let remaining_after = after.limits[0].remaining_ms;
    assert!(
        remaining_after < remaining_before && remaining_after > 7_000_000,
        "{remaining_before} -> {remaining_after}"
    );
    // One apply (its intent and its outcome), and the trip of the fuse and
    // of the limit (each once, across the restart).
    let audit = read(&state.join("audit.jsonl"));
    let count = |action: &str| {
        audit
            .lines()
            .filter(|l| l.contains(&format!("\"action\":\"{action}\"")))
            .count()
    };
    assert_eq!(
        (count("apply-intended"), count("apply"), count("trip")),
        (1, 1, 2),
        "{audit}"
    );
    assert_eq!(audit.lines().count(), 4, "{audit}");

    // Release: refused without the token, then traffic flows again on every agent.
    let refused = govc(&govd, None, &["release", "fuse", "order/errors"]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);
    let released = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(
        released
            .stdout
            .contains("released fuse `order/errors` on 2 agent(s)"),
        "{}",
        released.stdout
    );
    wait_until(
        "the fuse admits again",
        Duration::from_secs(5),
        async || http_get(b.inbound, "/fail").await.0 == 500,
    )
    .await;
    let released = govc(&govd, Some(TOKEN), &["release", "limit", "order/bursty"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    // The latch is gone (the calls-per-minute window itself still counts): the
    // agents' next stats (every second) would put it back if it were still engaged.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = govd.status().await;
    assert!(view.fuses.is_empty() && view.limits.is_empty(), "{view:?}");
    let audit = read(&state.join("audit.jsonl"));
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"action\":\"release\""))
            .count(),
        2,
        "{audit}"
    );
    // And each release's intent.
    assert_eq!(audit.lines().count(), 8, "{audit}");
    assert!(audit.contains("\"rule\":\"order/errors\""), "{audit}");

    a.stop().await;
    b.stop().await;
    govd.stop().await;
}

/// An agent restarted with a last good config written by an older release (one
/// repeated field per rule kind, before `rules`) does not crash: it says the file
/// cannot be read, starts without it, and enforces what govd sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_good_config_of_an_older_release_is_reported_and_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    let a_dir = dir.path().join("agent-a");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::write(
        a_dir.join("last-good-config.json"),
        r#"{"service": "order", "version": "old", "consumer_header": "x-gov-consumer",
            "limits": [{"rule": "order/bursty", "on": {"any": true},
                        "calls": {"amount": 1, "window_ms": 60000}}]}"#,
    )
    .unwrap();
    let a = agent("order", "order-a")
        .upstream(upstream().await)
        .control_plane(&govd)
        .state_dir(&a_dir)
        .start(dir.path())
        .await;
    wait_until(
        "the agent enforces govd's config",
        Duration::from_secs(10),
        async || {
            govd.status()
                .await
                .agents
                .iter()
                .any(|x| x.instance == "order-a" && x.state() == pb::SyncState::Synced)
        },
    )
    .await;
    let log = read(&a.log);
    assert!(log.contains("cannot load the last good config"), "{log}");
    assert!(log.contains("unknown field `limits`"), "{log}");
    // The old file's limit (1 call per minute on everything) is not enforced;
    // govd's `bursty` (3 per minute on /burst) is.
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/burst").await.0, 200);
    }
    assert_eq!(http_get(a.inbound, "/burst").await.0, 429);
}

/// Issue 12, item 3: an apply refused because the state directory cannot
/// be written leaves every agent as it was (no STALE on a version never
/// sent), says why, and the same apply works once the directory is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_refused_by_a_read_only_state_dir_changes_nothing_and_works_once_writable() {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let govd = control_plane(&state_dir).start().await;
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    govd.wait_for_agents(1).await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    let version = govd.status().await.version;
    let v1_order = agent_state(&govd.status().await, "order-1").version;
    assert_eq!(order.configs_applied().await, 1);

    let v2 = write(dir.path(), "v2.gov", &v2());
    {
        let _read_only = ReadOnly::new(&state_dir, &govd);
        let refused = govc(&govd, Some(TOKEN), &["apply", &v2]).await;
        assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
        assert!(
            refused.stderr.contains("nothing was applied")
                && refused.stderr.contains("--state-dir"),
            "{}",
            refused.stderr
        );
        assert!(
            !refused.stderr.contains("is govd running"),
            "govd is running: {}",
            refused.stderr
        );
        let view = govd.status().await;
        assert_eq!(view.version, version);
        let a = agent_state(&view, "order-1");
        assert_eq!(a.state(), pb::SyncState::Synced, "{a:?}");
        assert_eq!(a.version, v1_order, "no version was sent");
        assert_eq!(order.configs_applied().await, 1);
    }

    // Writable again: the same apply is a change and reaches the agent.
    let again = govc(&govd, Some(TOKEN), &["apply", &v2]).await;
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert!(
        again.stdout.contains("Applied version") && !again.stdout.contains("No changes"),
        "{}",
        again.stdout
    );
    assert!(
        again.stdout.contains("max_concurrent 2 -> 4"),
        "{}",
        again.stdout
    );
    wait_until(
        "order-1 SYNCED on the new version",
        Duration::from_secs(10),
        async || all_synced(&govd, &["order-1"]).await,
    )
    .await;
    assert_eq!(order.configs_applied().await, 2);
    // The state on disk is the new version: a restart keeps it.
    assert_ne!(govd.status().await.version, version);
    let audit = read(&state_dir.join("audit.jsonl"));
    assert!(audit.contains("\"action\":\"apply-refused\""), "{audit}");

    order.stop().await;
    govd.stop().await;
}

/// Issue 12, item 4: a release that cannot be recorded (read-only state
/// directory) is refused: `govc release` fails with the reason, the fuse
/// stays tripped at govd and at the agent, and the refusal is audited. Once
/// writable, the same release works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_cannot_be_recorded_is_refused_and_the_fuse_stays() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let a = agent("order", "order-a")
        .upstream(upstream().await)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    govd.wait_for_agents(1).await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;
    {
        let _read_only = ReadOnly::new(&state, &govd);
        let refused = govc(
            &govd,
            Some(OPERATOR_TOKEN),
            &["release", "fuse", "order/errors"],
        )
        .await;
        assert_ne!(refused.code, 0, "{}{}", refused.stdout, refused.stderr);
        assert!(
            flat(&refused.stderr).contains("nothing was released")
                && refused.stderr.contains("--state-dir"),
            "{}",
            refused.stderr
        );
        assert!(
            !refused.stderr.contains("is govd running"),
            "{}",
            refused.stderr
        );
        assert_eq!(govd.status().await.fuses.len(), 1, "govd still holds it");
        assert_eq!(http_get(a.inbound, "/fail").await.0, 503, "the agent too");
    }
    let released = govc(
        &govd,
        Some(OPERATOR_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(govd.status().await.fuses.is_empty());
    let audit = read(&state.join("audit.jsonl"));
    assert!(audit.contains("\"action\":\"release-refused\""), "{audit}");
    a.stop().await;
    govd.stop().await;
}
