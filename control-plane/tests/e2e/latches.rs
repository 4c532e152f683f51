//! Fuse and limit latches with real agents: kept across agent restarts and
//! kills, per consumer key, a release an agent missed, the TUI's release,
//! and a shadow limit's latch.

use super::*;

/// Issue 12, item 1, govd's half: an agent restart never makes govd drop a
/// tripped manual fuse silently. Either the restarted agent still enforces
/// it, or govd keeps the latch, shows the instance as not enforcing it and
/// audits that; only an operator's release ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_never_drops_a_manual_fuse_from_govd_unaudited() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let up = upstream().await;
    let a_dir = dir.path().join("agent-a");
    let start_a = || {
        agent("order", "order-a")
            .upstream(up)
            .control_plane(&govd)
            .state_dir(&a_dir)
            .start(dir.path())
    };
    let a = start_a().await;
    govd.wait_for_agents(1).await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;

    // The agent restarts (govd up) and reports its stats again.
    a.stop().await;
    let a = start_a().await;
    wait_until(
        "the restarted agent synced",
        Duration::from_secs(15),
        async || all_synced(&govd, &["order-a"]).await,
    )
    .await;
    // Stats go out every second: give it two.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = govd.status().await;
    assert_eq!(view.fuses.len(), 1, "the latch holds: {view:?}");
    let enforced = http_get(a.inbound, "/fail").await.0 == 503;
    let audit = read(&state.join("audit.jsonl"));
    if !enforced {
        assert!(
            view.fuses[0].reason.contains("NOT ENFORCED by order-a"),
            "{:?}",
            view.fuses[0]
        );
        assert!(
            audit.contains("\"action\":\"latch-not-enforced\""),
            "{audit}"
        );
        let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
        assert!(status.stdout.contains("NOT ENFORCED"), "{}", status.stdout);
    }
    assert!(!audit.contains("\"action\":\"untrip\""), "{audit}");

    // A release that cannot be recorded is refused and changes nothing.
    {
        let _read_only = ReadOnly::new(&state, &govd);
        let refused = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
        assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
        assert!(
            refused.stderr.contains("nothing was released"),
            "{}",
            refused.stderr
        );
        assert_eq!(govd.status().await.fuses.len(), 1);
    }

    // An operator's release ends it, on govd and on the agent.
    let released = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(govd.status().await.fuses.is_empty());
    assert_eq!(http_get(a.inbound, "/fail").await.0, 500);

    a.stop().await;
    govd.stop().await;
}

/// Issue 12, item 1, the agent's half: a tripped manual fuse survives a `kill -9` of
/// its agent, with govd up and with govd down; no call reaches the failing upstream
/// until an operator releases it, and the release is audited. An agent restarted
/// without its state directory gets the latch back from govd when it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_keeps_its_tripped_manual_fuse_with_govd_up_or_down() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let url = format!("http://127.0.0.1:{port}");
    let (up, reached) = failing_upstream().await;
    let reached = move || reached.load(Ordering::SeqCst);
    let a_dir = dir.path().join("agent-a");
    let start_a = || {
        agent("order", "order-a")
            .upstream(up)
            .control_plane_url(url.clone())
            .state_dir(&a_dir)
            .start(dir.path())
    };
    // b keeps no state: only govd can give its latch back.
    let start_b = || {
        agent("order", "order-b")
            .upstream(up)
            .control_plane_url(url.clone())
            .start(dir.path())
    };
    let (a, b) = (start_a().await, start_b().await);
    wait_until(
        "two agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 2,
    )
    .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for agent in [&a, &b] {
        for _ in 0..3 {
            assert_eq!(http_get(agent.inbound, "/fail").await.0, 500);
        }
        let tripped = http_get(agent.inbound, "/fail").await;
        assert_eq!(
            (tripped.0, tripped.1.as_deref()),
            (503, Some("order/errors"))
        );
    }
    assert_eq!(reached(), 6);
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;
    // Both trip events and a round of stats.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // kill -9 with govd up: the restarted agent refuses from its first call.
    a.kill().await;
    let a = start_a().await;
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    }
    assert_eq!(
        reached(),
        6,
        "a call reached the failing upstream after a restart"
    );

    // b comes back without its state: govd re-arms the latch it holds for it.
    b.kill().await;
    let b = start_b().await;
    wait_until(
        "govd re-armed b's latch",
        Duration::from_secs(15),
        async || read(&b.log).contains("re-armed a latch the control plane holds"),
    )
    .await;
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);

    // kill -9 with govd down: the same.
    govd.kill().await;
    a.kill().await;
    let a = start_a().await;
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    }
    assert_eq!(http_get(b.inbound, "/fail").await.0, 503);
    assert_eq!(
        reached(),
        6,
        "a call reached the failing upstream while govd was down"
    );

    // govd back: one latch, enforced by both, never ended.
    let govd = control_plane(&state).start_on(port).await;
    wait_until(
        "both agents reconnected and synced",
        Duration::from_secs(40),
        async || all_synced(&govd, &["order-a", "order-b"]).await,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view = govd.status().await;
    assert_eq!(view.fuses.len(), 1, "{view:?}");
    assert!(!view.fuses[0].reason.contains("NOT ENFORCED"), "{view:?}");
    let audit = read(&state.join("audit.jsonl"));
    assert!(!audit.contains("\"action\":\"untrip\""), "{audit}");
    assert!(
        !audit
            .lines()
            .any(|l| l.contains("latch-not-enforced") && l.contains("order-a")),
        "{audit}"
    );

    // Only an operator's release lets calls through again, and it is audited.
    let released = govc(&govd, Some(TOKEN), &["release", "fuse", "order/errors"]).await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    for agent in [&a, &b] {
        wait_until(
            "the fuse admits again",
            Duration::from_secs(5),
            async || http_get(agent.inbound, "/fail").await.0 == 500,
        )
        .await;
    }
    assert!(reached() > 6);
    let audit = read(&state.join("audit.jsonl"));
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"release\"") && l.contains("order/errors")),
        "{audit}"
    );

    a.stop().await;
    b.stop().await;
    govd.stop().await;
}

/// order: one call per second per consumer on /keyed, latched until an
/// operator releases it.
const PER_CONSUMER: &str = r#"service order {
  match keyed = path prefix "/keyed"

  limit per_caller on keyed {
    calls 1 per 1s
    algorithm fixed window
    per consumer
    release manual
  }
  consumer from header "x-gov-consumer"
}
"#;

/// The latched keys govd shows for `order/per_caller`, sorted.
async fn latched_keys(govd: &Govd) -> Vec<String> {
    let mut keys: Vec<String> = govd
        .status()
        .await
        .limits
        .into_iter()
        .filter(|l| l.rule == "order/per_caller")
        .map(|l| l.key)
        .collect();
    keys.sort();
    keys
}

/// The keys agent stats report latched for `order/per_caller`.
async fn reported_keys(govd: &Govd) -> Vec<String> {
    govd.status()
        .await
        .rules
        .into_iter()
        .find(|r| r.rule == "order/per_caller")
        .and_then(|r| r.stats)
        .map(|s| s.engaged_keys)
        .unwrap_or_default()
}

#[tokio::test]
async fn latches_of_two_consumers_of_one_limit_are_released_and_kept_apart_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let url = format!("http://127.0.0.1:{port}");
    let up = upstream().await;
    let start_a = |state_dir: PathBuf| {
        agent("order", "order-a")
            .upstream(up)
            .control_plane_url(url.clone())
            .state_dir(&state_dir)
            .start(dir.path())
    };
    let a = start_a(dir.path().join("agent-a")).await;
    govd.wait_for_agents(1).await;
    let policy = write(dir.path(), "keyed.gov", PER_CONSUMER);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &policy]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);

    // alice and bob each exceed the limit: two latches of one rule.
    for consumer in ["alice", "bob"] {
        assert_eq!(http_get_as(a.inbound, "/keyed", consumer).await.0, 200);
        let refused = http_get_as(a.inbound, "/keyed", consumer).await;
        assert_eq!(
            (refused.0, refused.1.as_deref()),
            (429, Some("order/per_caller")),
            "{consumer}"
        );
    }
    wait_until(
        "govd holds both latches",
        Duration::from_secs(10),
        async || latched_keys(&govd).await == ["alice", "bob"],
    )
    .await;
    wait_until(
        "stats list both keys",
        Duration::from_secs(10),
        async || reported_keys(&govd).await == ["alice", "bob"],
    )
    .await;
    let status = govc(&govd, Some(TOKEN), &["status"]).await;
    assert!(
        status.stdout.contains("alice") && status.stdout.contains("bob"),
        "{}",
        status.stdout
    );

    // Release bob only.
    let released = govc(
        &govd,
        Some(TOKEN),
        &["release", "limit", "order/per_caller", "--key", "bob"],
    )
    .await;
    assert_eq!(released.code, 0, "{}{}", released.stdout, released.stderr);
    assert!(released.stdout.contains("key `bob`"), "{}", released.stdout);
    assert_eq!(latched_keys(&govd).await, ["alice"]);
    wait_until(
        "the agent released bob",
        Duration::from_secs(10),
        async || reported_keys(&govd).await == ["alice"],
    )
    .await;
    // A new window: bob's count is spent in the one it was latched in.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(http_get_as(a.inbound, "/keyed", "bob").await.0, 200);
    assert_eq!(http_get_as(a.inbound, "/keyed", "alice").await.0, 429);
    let audit = read(&state.join("audit.jsonl"));
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"release\"") && l.contains("\"key\":\"bob\"")),
        "{audit}"
    );
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"action\":\"trip\"") && l.contains("\"key\":\"alice\"")),
        "{audit}"
    );

    // A govd restart keeps alice (and only alice).
    govd.kill().await;
    let govd = control_plane(&state).start_on(port).await;
    wait_until(
        "the agent synced again",
        Duration::from_secs(40),
        async || all_synced(&govd, &["order-a"]).await,
    )
    .await;
    assert_eq!(latched_keys(&govd).await, ["alice"]);

    // The agent restarts with a fresh state directory: only govd knows of
    // alice's latch, and re-arms it; bob stays free.
    a.kill().await;
    let a = start_a(dir.path().join("agent-a-fresh")).await;
    wait_until(
        "govd re-armed alice's latch",
        Duration::from_secs(15),
        async || read(&a.log).contains("re-armed a latch the control plane holds"),
    )
    .await;
    assert_eq!(http_get_as(a.inbound, "/keyed", "alice").await.0, 429);
    assert_eq!(http_get_as(a.inbound, "/keyed", "bob").await.0, 200);
    wait_until(
        "stats list alice again",
        Duration::from_secs(10),
        async || reported_keys(&govd).await == ["alice"],
    )
    .await;
    let view = govd.status().await;
    assert!(
        view.limits
            .iter()
            .all(|l| !l.reason.contains("NOT ENFORCED")),
        "{view:?}"
    );
    let audit = read(&state.join("audit.jsonl"));
    assert!(!audit.contains("\"action\":\"untrip\""), "{audit}");

    // A release without --key ends every key and names them.
    let all = govc(
        &govd,
        Some(TOKEN),
        &["release", "limit", "order/per_caller"],
    )
    .await;
    assert_eq!(all.code, 0, "{}{}", all.stdout, all.stderr);
    assert!(all.stdout.contains("`alice`"), "{}", all.stdout);
    assert!(!all.stdout.contains("bob"), "{}", all.stdout);
    assert!(latched_keys(&govd).await.is_empty());
    // A fuse has no keys.
    let fuse = govc(
        &govd,
        Some(TOKEN),
        &["release", "fuse", "order/per_caller", "--key", "x"],
    )
    .await;
    assert_eq!(fuse.code, 64, "{}{}", fuse.stdout, fuse.stderr);

    a.stop().await;
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_made_while_an_agent_is_away_is_not_a_new_trip_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let (up, _reached) = failing_upstream().await;
    let a_dir = dir.path().join("agent-a");
    let start_a = || {
        agent("order", "order-a")
            .upstream(up)
            .control_plane(&govd)
            .state_dir(&a_dir)
            .start(dir.path())
    };
    let a = start_a().await;
    govd.wait_for_agents(1).await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);
    wait_until("the fuse recorded", Duration::from_secs(10), async || {
        govd.status().await.fuses.len() == 1
    })
    .await;

    // The agent goes away with its latch on disk; the operator releases.
    a.kill().await;
    let released = govc(
        &govd,
        Some(OPERATOR_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(released.code, 0, "{}", released.stderr);
    assert!(govd.status().await.fuses.is_empty());

    // Back with the latch it kept: govd sends it the release it missed,
    // and records no new trip.
    let a = start_a().await;
    wait_until(
        "the agent released the fuse",
        Duration::from_secs(15),
        async || http_get(a.inbound, "/fail").await.0 == 500,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        govd.status().await.fuses.is_empty(),
        "the missed release became a new trip: {:?}",
        govd.status().await.fuses
    );
    let audit = govc(&govd, Some(VIEWER_TOKEN), &["audit", "-o", "json"]).await;
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let actions: Vec<&str> = records
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "apply-intended",
            "apply",
            "trip",
            "release-intended",
            "release"
        ],
        "{records:?}"
    );
    a.stop().await;
    govd.stop().await;
}

/// The TUI's own client against govd: its watch needs no token and shows a tripped
/// fuse; a release with a wrong token or none is refused with govd's readable reason
/// and changes nothing; the token as read from a file (with its newline) releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tuis_watch_and_token_release_work_against_govd() {
    use gov_tui::Msg;
    use gov_tui::proto::ReleaseKind;

    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let (failing, _) = failing_upstream().await;
    let a = agent("order", "order-a")
        .upstream(failing)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    // `apply --wait` waits for the agents connected when it applies: one not
    // connected yet would get the policy later, after the calls below.
    govd.wait_for_agents(1).await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    for _ in 0..3 {
        assert_eq!(http_get(a.inbound, "/fail").await.0, 500);
    }
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);

    let opts = |token: Option<&str>| gov_tui::WatchOptions {
        url: govd.url(),
        token: token.map(str::to_owned),
        tls: gov_common::tls::ClientTls::default(),
        service: String::new(),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let watcher = tokio::spawn(gov_tui::watch(opts(Some(VIEWER_TOKEN)), tx));
    // Views until one shows the tripped fuse (bounded: 30 s).
    let until = async |rx: &mut tokio::sync::mpsc::Receiver<Msg>, tripped: bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some(Msg::View(v))) if v.fuses.is_empty() != tripped => return v,
                Ok(Some(Msg::View(_))) => {}
                Ok(Some(other)) => panic!("the watch failed against govd: {other:?}"),
                Ok(None) | Err(_) => panic!("no view with the fuse tripped={tripped} in 30 s"),
            }
        }
    };
    let view = until(&mut rx, true).await;
    assert_eq!(view.fuses[0].rule, "order/errors");

    for (token, reason) in [
        (None, "needs a token with the operator or admin role"),
        (Some("not-the-token"), "the token is not one govd knows"),
    ] {
        let err = gov_tui::release(
            &opts(token),
            ReleaseKind::Fuse,
            "order/errors".into(),
            "e2e".into(),
        )
        .await
        .unwrap_err();
        assert!(err.contains(reason), "{token:?}: {err}");
    }
    assert_eq!(
        govd.status().await.fuses.len(),
        1,
        "a refused release released"
    );
    assert_eq!(http_get(a.inbound, "/fail").await.0, 503);

    // As read from a token file: with its newline, which the TUI trims.
    let token = format!("{OPERATOR_TOKEN}\n");
    let result = gov_tui::release(
        &opts(Some(&token)),
        ReleaseKind::Fuse,
        "order/errors".into(),
        "e2e".into(),
    )
    .await
    .unwrap();
    assert!(result.released, "{result:?}");
    until(&mut rx, false).await;
    wait_until(
        "the agent admits again",
        Duration::from_secs(10),
        async || http_get(a.inbound, "/fail").await.0 == 500,
    )
    .await;
    drop(rx);
    tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("the watch task ends once its receiver is gone")
        .unwrap();
    a.stop().await;
}

/// One limit on `/api`, as a team would first roll it out.
const API_LIMIT: &str = r#"service order {
  match api = path prefix "/api"
  limit api_rate on api {
    calls 20 per 1s
  }
}
"#;

/// The same limit applied with `govc apply --shadow` to one govd and as
/// written to another, each with one agent, under the same load at the same
/// time (every call sent to both at once; limit windows are Unix-time
/// aligned on every agent). The shadow agent rejects nothing and counts as
/// would-be rejections what the enforced agent rejects, within one window's
/// worth (20 calls): the two copies of a call reach their agents a few
/// microseconds apart, so only the pairs in flight at a window boundary (at
/// most 4 per boundary here) can fall into different windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_limit_rejects_nothing_and_counts_what_the_enforced_limit_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream().await;
    let policy = write(dir.path(), "api.gov", API_LIMIT);
    let shadow_govd = control_plane(&dir.path().join("shadow")).start().await;
    let enforce_govd = control_plane(&dir.path().join("enforce")).start().await;
    let shadowed = agent("order", "order-shadow")
        .upstream(up)
        .control_plane(&shadow_govd)
        .start(dir.path())
        .await;
    let enforced = agent("order", "order-enforce")
        .upstream(up)
        .control_plane(&enforce_govd)
        .start(dir.path())
        .await;
    let applied = govc(
        &shadow_govd,
        Some(TOKEN),
        &["apply", "--shadow", "--wait", "10s", &policy],
    )
    .await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert!(applied.stdout.contains("mode shadow"), "{}", applied.stdout);
    let applied = govc(
        &enforce_govd,
        Some(TOKEN),
        &["apply", "--wait", "10s", &policy],
    )
    .await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    wait_until("both agents synced", Duration::from_secs(15), async || {
        all_synced(&shadow_govd, &["order-shadow"]).await
            && all_synced(&enforce_govd, &["order-enforce"]).await
    })
    .await;

    // Bounded load: 4 workers, 600 calls in all (about 3 s), at most 20 s.
    const WORKERS: usize = 4;
    const CALLS: usize = 600;
    let sent = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let sent = sent.clone();
            let (a, b) = (shadowed.inbound, enforced.inbound);
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while sent.fetch_add(1, Ordering::SeqCst) < CALLS
                    && started.elapsed() < Duration::from_secs(20)
                {
                    answers.push(tokio::join!(
                        http_get(a, "/api/orders"),
                        http_get(b, "/api/orders")
                    ));
                    // About 200 calls a second in all: the load spans
                    // several windows.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answers
            })
        })
        .collect();
    let (mut calls, mut enforced_rejections) = (0u64, 0u64);
    for w in workers {
        for (s, e) in w.await.unwrap() {
            calls += 1;
            assert_eq!(
                (s.0, &s.1),
                (200, &None),
                "the shadow agent rejected a call"
            );
            match e {
                (200, None, _) => {}
                (429, Some(rule), _) if rule == "order/api_rate" => enforced_rejections += 1,
                other => panic!("unexpected answer of the enforced agent: {other:?}"),
            }
        }
    }
    let shadow_metrics = http_get(shadowed.admin, "/metrics").await.2;
    let enforce_metrics = http_get(enforced.admin, "/metrics").await.2;
    let would = sample(
        &shadow_metrics,
        "gov_agent_shadow_rejected_total{rule=\"order/api_rate\",reason=\"limit_calls\"}",
    );
    let rejected = sample(
        &enforce_metrics,
        "gov_agent_rule_rejected_total{rule=\"order/api_rate\",reason=\"limit_calls\"}",
    );
    eprintln!("{calls} calls: shadow would have rejected {would}, enforced rejected {rejected}");
    assert_eq!(rejected, enforced_rejections);
    assert_eq!(
        sample(
            &shadow_metrics,
            "gov_agent_rule_rejected_total{rule=\"order/api_rate\",reason=\"limit_calls\"}"
        ),
        0
    );
    assert!(
        rejected > 0,
        "{calls} calls never exceeded 20 per second: the load proves nothing"
    );
    assert!(
        would.abs_diff(rejected) <= 20,
        "shadow counted {would} would-be rejections, enforced rejected {rejected} of {calls} calls"
    );

    // govd shows the rule in shadow, for how long, and what it would have
    // rejected (once the agent's stats have arrived).
    wait_until(
        "the shadow counts in govd",
        Duration::from_secs(10),
        async || {
            let view = shadow_govd.status().await;
            view.rules.iter().any(|r| {
                r.rule == "order/api_rate"
                    && r.mode() == pb::Mode::Shadow
                    && r.shadow_since_unix_ms > 0
                    && r.stats
                        .as_ref()
                        .and_then(|s| s.shadow_rejected.as_ref())
                        .is_some_and(|x| x.limit_calls == would)
            })
        },
    )
    .await;
    let status = govc(&shadow_govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let row = status
        .stdout
        .lines()
        .find(|l| l.starts_with("order/api_rate"))
        .unwrap_or_else(|| panic!("no shadow row:\n{}", status.stdout));
    assert!(
        row.contains("SHADOW") && row.contains(&format!("{would} (limit_calls {would})")),
        "{row}"
    );
    let json = govc(&shadow_govd, Some(VIEWER_TOKEN), &["status", "-o", "json"]).await;
    let view: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let rule = &view["rules"][0];
    assert_eq!(rule["mode"], "shadow", "{rule}");
    assert!(
        rule["shadow_since_unix_ms"].as_u64().is_some_and(|t| t > 0),
        "{rule}"
    );
    // The audit says the apply was a shadow one.
    let audit = govc(&shadow_govd, Some(TOKEN), &["audit", "-o", "json"]).await;
    assert!(
        audit.stdout.contains("govc apply --shadow"),
        "{}",
        audit.stdout
    );

    // Enforced by a plain apply: no longer in shadow, nothing re-pushed that
    // loses its state (the engine keeps an unchanged rule's state).
    let applied = govc(
        &shadow_govd,
        Some(TOKEN),
        &["apply", "--wait", "10s", &policy],
    )
    .await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let view = shadow_govd.status().await;
    assert_eq!(view.rules[0].mode(), pb::Mode::Enforce);
    assert_eq!(view.rules[0].shadow_since_unix_ms, 0);

    shadowed.stop().await;
    enforced.stop().await;
    shadow_govd.stop().await;
    enforce_govd.stop().await;
}
