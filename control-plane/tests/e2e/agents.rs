//! The registry of instances: callers learn instances from govd, a new one
//! gets no call before it is ready, `wait for gov` and the removals it waits
//! for, and each agent's phase and weight.

use super::*;

/// govd is the registry: a caller's outbound listener, started with no
/// `--instances`, learns the instances of `inv` from govd as they register
/// (their lifecycle says READY), and an instance that is stopped leaves the
/// caller's set: no call fails while it goes.
#[tokio::test]
async fn callers_learn_instances_from_govd_and_lose_none_when_one_stops() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 10\n").await;

    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    // Before any instance registered, govd knows none: the call cannot be routed.
    assert_eq!(call(caller, "inv").await.0, 502);

    let a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    // Both registered: the caller reaches both (bounded: 200 calls).
    assert_eq!(
        reached(caller, 2).await,
        ["a", "b"],
        "the caller reaches both instances govd registered"
    );

    // Stop `b` under a bounded load: it deregisters (DRAINING), govd pushes the
    // set without it, and a call that still finds its port closed connects to `a`.
    let load = load_through(caller);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.stop().await;
    let failed = load.await.unwrap();
    assert!(failed.is_empty(), "calls failed while `b` left: {failed:?}");
    wait_until(
        "govd to drop `inv-b` from the registry",
        Duration::from_secs(10),
        async || {
            let view = govd.status().await;
            view.agents
                .iter()
                .find(|x| x.instance == "inv-b")
                .is_none_or(|x| x.state() == pb::SyncState::Disconnected)
        },
    )
    .await;
    for _ in 0..20 {
        assert_eq!(call(caller, "inv").await, (200, "a".to_owned()));
    }
    drop(a);
}

/// govd down: a caller restarted with its state directory still routes to the
/// instances govd last pushed (the sets are kept on disk like configs).
#[tokio::test]
async fn a_caller_restarted_while_govd_is_down_keeps_the_last_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let url = govd.url();
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 10\n").await;
    let web_state = dir.path().join("web-state");
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .state_dir(&web_state)
        .start(dir.path())
        .await;
    let a = inv_instance(&govd, dir.path(), "a").await;
    let caller = web.outbound.unwrap();
    assert_eq!(
        reached(caller, 1).await,
        ["a"],
        "the caller reaches `a` through govd's registry"
    );

    govd.kill().await;
    web.stop().await;
    let web = agent("web", "web-1")
        .control_plane_url(url)
        .outbound()
        .state_dir(&web_state)
        .start(dir.path())
        .await;
    assert_eq!(
        call(web.outbound.unwrap(), "inv").await,
        (200, "a".to_owned()),
        "the restarted caller routes by the kept set while govd is down"
    );
    web.stop().await;
    a.stop().await;
}

/// Scale-out: a new instance gets no call before its readiness probe passes
/// (govd registers it only then), and then takes a share of the calls; none
/// fails meanwhile.
#[tokio::test]
async fn a_new_instance_gets_no_call_before_it_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  warmup {\n    ready when http GET \"/ready\" is 200 every 1s after 0s\n  }\n",
    )
    .await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let (a_up, a_ready, _) = gated_upstream("a").await;
    a_ready.store(true, Ordering::SeqCst);
    let a = agent("inv", "inv-a")
        .upstream(a_up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let mut reached = false;
    for _ in 0..300 {
        if call(caller, "inv").await == (200, "a".to_owned()) {
            reached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reached, "`a` became ready and registered");

    let (c_up, c_ready, c_served) = gated_upstream("c").await;
    let c = agent("inv", "inv-c")
        .upstream(c_up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    // Not ready: 100 calls, none reaches `c`, none fails.
    for _ in 0..100 {
        assert_eq!(call(caller, "inv").await, (200, "a".to_owned()));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        c_served.load(Ordering::SeqCst),
        0,
        "a call reached `c` before it was ready"
    );
    // Ready: its next probe (every 1s) registers it, and calls come.
    c_ready.store(true, Ordering::SeqCst);
    let mut failed = 0;
    for _ in 0..600 {
        if call(caller, "inv").await.0 != 200 {
            failed += 1;
        }
        if c_served.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(failed, 0);
    assert!(
        c_served.load(Ordering::SeqCst) > 0,
        "`c` never got a call once ready"
    );
    c.stop().await;
    a.stop().await;
}

/// SIGKILL of an instance's agent under load: its stream drops, govd removes it
/// from every caller's set, and a call that still tries it is retried on the
/// other instance (connect failures are retried once, any method): GETs see no
/// failure.
#[tokio::test]
async fn a_killed_instance_costs_its_callers_no_failed_get() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 10\n").await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    assert_eq!(reached(caller, 2).await, ["a", "b"]);
    let load = load_through(caller);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.kill().await;
    let failed = load.await.unwrap();
    assert!(
        failed.is_empty(),
        "GETs failed after `b` was killed: {failed:?}"
    );
    a.stop().await;
}

/// Instance names are unique: a second agent claiming a live agent's name is
/// refused with a reason that says what to do, and the first keeps its place.
#[tokio::test]
async fn a_second_agent_with_a_live_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let first = agent("inv", "inv-1")
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until(
        "the first agent connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 1,
    )
    .await;
    let second = agent("inv", "inv-1")
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let log = second.log.clone();
    wait_until(
        "the second agent to be refused",
        Duration::from_secs(10),
        async || read(&log).contains("give each agent its own `--instance`"),
    )
    .await;
    let view = govd.status().await;
    assert_eq!(view.agents.len(), 1);
    assert_eq!(view.agents[0].address, first.inbound.to_string());
    second.stop().await;
    first.stop().await;
}

/// The agent's log line when govd says every caller dropped it (`wait for
/// gov` ends on govd's word). Not a bare "every caller has dropped this
/// instance": the step's first line, "waiting until every caller has
/// dropped this instance", contains that too.
const CALLERS_DROPPED: &str = "lifecycle: every caller has dropped this instance";

/// `wait for gov`: an instance that stops deregisters, waits until every
/// agent connected to govd has acknowledged the set without it (not a fixed
/// sleep), then drains; its callers' calls all succeed meanwhile.
#[tokio::test]
async fn wait_for_gov_ends_when_every_caller_has_dropped_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  shutdown {\n    deregister\n    wait for gov\n    drain 5s\n  }\n",
    )
    .await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    assert_eq!(
        reached(caller, 2).await,
        ["a", "b"],
        "both instances registered"
    );

    let load = load_through(caller);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = b.log.clone();
    b.stop().await;
    let failed = load.await.unwrap();
    assert!(failed.is_empty(), "calls failed while `b` left: {failed:?}");
    let text = read(&log);
    assert!(
        text.contains(CALLERS_DROPPED),
        "the step ended on govd's word, not on its 30 s timeout:\n{text}"
    );
    assert!(!text.contains("not every caller acknowledged"), "{text}");
    drop(a);
}

/// Issue 11 (govd's side): while an instance is being removed, `govc status`
/// names the callers that have not yet acknowledged the endpoint set without
/// it, in the table and in `-o json`; a caller that is stopped (SIGSTOP) is
/// named until it runs again (SIGCONT) and acknowledges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_caller_a_removal_waits_for_until_it_acknowledges() {
    let dir = tempfile::tempdir().unwrap();
    // A stopped caller answers no HTTP/2 ping: with the default keepalive
    // (10s + 5s) govd would drop it mid-test on a loaded box, and the removal
    // would stop waiting on it for that reason instead of the one under test.
    let govd = control_plane(&dir.path().join("state"))
        .args(&["--http2-keepalive-interval", "300s"])
        .start()
        .await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  shutdown {\n    deregister\n    wait for gov\n    drain 5s\n  }\n",
    )
    .await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let _a = inv_instance(&govd, dir.path(), "a").await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    assert_eq!(reached(caller, 2).await, ["a", "b"]);

    // The caller stops reading its stream; `b` leaves.
    signal(&web.child, rustix::process::Signal::STOP);
    let b_log = b.log.clone();
    signal(&b.child, rustix::process::Signal::TERM);
    // `inv-a` acknowledges at once; the stopped caller does not.
    wait_until(
        "govd to show inv-b waiting on web-1 only",
        Duration::from_secs(10),
        async || agent_state(&govd.status().await, "inv-b").removal_waiting_on == ["web/web-1"],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        agent_state(&govd.status().await, "inv-b").removal_waiting_on,
        ["web/web-1"],
        "still waiting on the stopped caller"
    );
    let table = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    let row = table
        .stdout
        .lines()
        .find(|l| l.contains("inv-b"))
        .unwrap_or_else(|| panic!("no inv-b row:\n{}", table.stdout));
    assert!(row.contains("DRAINING"), "{row}");
    assert!(row.contains("removal waiting on web/web-1"), "{row}");
    let json = govc(&govd, Some(VIEWER_TOKEN), &["status", "-o", "json"]).await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let view: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let inv_b = view["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["instance"] == "inv-b")
        .unwrap();
    assert_eq!(
        inv_b["removal_waiting_on"],
        serde_json::json!(["web/web-1"])
    );

    // The caller runs again, acknowledges, and `b` hears it is dropped.
    signal(&web.child, rustix::process::Signal::CONT);
    wait_until(
        "inv-b's wait for gov to end",
        Duration::from_secs(15),
        async || read(&b_log).contains(CALLERS_DROPPED),
    )
    .await;
    let view = govd.status().await;
    assert!(
        view.agents
            .iter()
            .filter(|a| a.instance == "inv-b")
            .all(|a| a.removal_waiting_on.is_empty()),
        "{view:?}\nB LOG:\n{}\nWEB LOG:\n{}\nGOVD LOG:\n{}",
        read(&b_log),
        read(&web.log),
        read(&govd.log)
    );
    let table = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(
        !table.stdout.contains("removal waiting on"),
        "{}",
        table.stdout
    );
}

/// What an agent's lifecycle reports reaches govd: STARTING (weight 0) until its
/// readiness probe passes, WARMING with a weight that rises over its ramp, READY at
/// 100%, and DRAINING once SIGTERM begins its shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govd_shows_each_agents_phase_and_weight_from_start_to_drain() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    apply_inv_and_web(
        &govd,
        dir.path(),
        "  warmup {\n    ready when http GET \"/ready\" is 200 every 1s after 0s\n    \
         register\n    ramp 3s from 10%\n  }\n  shutdown {\n    deregister\n    \
         wait 3s\n    drain 1s\n  }\n",
    )
    .await;
    let (up, ready, _) = gated_upstream("a").await;
    let a = agent("inv", "inv-a")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let state = async || {
        let view = govd.status().await;
        view.agents
            .iter()
            .find(|a| a.instance == "inv-a")
            .map(|a| (a.phase(), a.weight_milli_percent))
    };
    // Its probe fails: STARTING, no weight (and it stays so while the probe fails).
    wait_until("inv-a connected", Duration::from_secs(15), async || {
        state().await.is_some()
    })
    .await;
    assert_eq!(state().await, Some((pb::Phase::Starting, 0)));

    // Ready: WARMING from 10% up, then READY at 100%; what govd shows never falls.
    ready.store(true, Ordering::SeqCst);
    let mut seen = Vec::new();
    wait_until("inv-a READY", Duration::from_secs(30), async || {
        let now = state().await.unwrap();
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        now.0 == pb::Phase::Ready
    })
    .await;
    let warming: Vec<u32> = seen
        .iter()
        .filter(|(p, _)| *p == pb::Phase::Warming)
        .map(|(_, w)| *w)
        .collect();
    assert!(
        warming.iter().any(|w| (10_000..100_000).contains(w)),
        "no WARMING weight between 10% and 100%: {seen:?}"
    );
    assert!(warming.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&(pb::Phase::Ready, 100_000)), "{seen:?}");

    // SIGTERM: the shutdown's wait (3s) keeps it connected and DRAINING.
    signal(&a.child, rustix::process::Signal::TERM);
    wait_until("inv-a DRAINING", Duration::from_secs(15), async || {
        state().await.is_some_and(|(p, _)| p == pb::Phase::Draining)
    })
    .await;
    a.stop().await;
}

/// The endpoints of `inv` that `agent`'s outbound balancer holds now, with
/// their weights (its `/metrics`: one series per endpoint of the directory).
async fn balancer_set(agent: &Agent) -> Vec<(String, String)> {
    let (_, _, body) = http_get(agent.admin, "/metrics").await;
    let mut set: Vec<(String, String)> = body
        .lines()
        .filter_map(|l| {
            l.strip_prefix("gov_agent_endpoint_weight_ratio{service=\"inv\",endpoint=\"")
        })
        .filter_map(|l| l.split_once("\"} "))
        .map(|(endpoint, weight)| (endpoint.to_owned(), weight.to_owned()))
        .collect();
    set.sort();
    set
}

/// Issue 35: a real caller follows instances joining and leaving by deltas
/// onto the set it acknowledged (govd sends one instance, not the set), and
/// its balancer ends with exactly the instances registered, at full weight.
#[tokio::test]
async fn a_caller_follows_joins_and_leaves_by_endpoint_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .start()
        .await;
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 10\n").await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .log_filter("info,gov_agent::control::endpoints=debug")
        .start(dir.path())
        .await;
    let expect = |agents: &[&Agent]| {
        let mut set: Vec<(String, String)> = agents
            .iter()
            .map(|a| (a.inbound.to_string(), "1".to_owned()))
            .collect();
        set.sort();
        set
    };
    let settles = async |what: &str, want: Vec<(String, String)>| {
        wait_until(what, Duration::from_secs(30), async || {
            balancer_set(&web).await == want
        })
        .await;
    };
    let a = inv_instance(&govd, dir.path(), "a").await;
    settles("the caller's set to be {a}", expect(&[&a])).await;
    let b = inv_instance(&govd, dir.path(), "b").await;
    settles("the caller's set to be {a, b}", expect(&[&a, &b])).await;
    let c = inv_instance(&govd, dir.path(), "c").await;
    settles("the caller's set to be {a, b, c}", expect(&[&a, &b, &c])).await;
    assert_eq!(reached(web.outbound.unwrap(), 3).await, ["a", "b", "c"]);
    b.stop().await;
    settles("the caller's set to be {a, c}", expect(&[&a, &c])).await;
    let d = inv_instance(&govd, dir.path(), "d").await;
    settles("the caller's set to be {a, c, d}", expect(&[&a, &c, &d])).await;
    a.kill().await;
    settles("the caller's set to be {c, d}", expect(&[&c, &d])).await;
    assert_eq!(reached(web.outbound.unwrap(), 2).await, ["c", "d"]);

    // Joins and leaves after the first set came as deltas; none was refused.
    let log = read(&web.log);
    let deltas = log.matches("endpoints delta").count();
    assert!(deltas >= 4, "{deltas} deltas:\n{log}");
    assert!(!log.contains("asking govd for the whole set"), "{log}");
    // govd counted them, and what they cost: a delta is one instance.
    let (_, _, metrics) = http_get(govd.metrics.unwrap(), "/metrics").await;
    let counter = |name: &str, form: &str| -> u64 {
        let prefix = format!("{name}{{form=\"{form}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{metrics}"))
    };
    let pushed = counter("govd_endpoint_pushes_total", "delta");
    assert!(pushed >= 4, "{pushed} deltas pushed:\n{metrics}");
    let bytes = counter("govd_endpoint_push_bytes_total", "delta");
    assert!(bytes <= pushed * 100, "{bytes} bytes in {pushed} deltas");
    drop((c, d));
}
