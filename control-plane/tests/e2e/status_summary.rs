//! `govc status` at scale (issue 35): the Status request's `agent_rows` and
//! `max_agents`, the counts per service and state every view carries, and
//! `govc status --summary` on a real govd with three real agents, one of
//! them killed (DISCONNECTED).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_every_agent_and_lists_only_the_rows_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .agent_token()
        .start()
        .await;
    let up = upstream().await;
    let mut agents = Vec::new();
    for name in ["order-1", "order-2", "order-3"] {
        let a = agent("order", name)
            .upstream(up)
            .control_plane(&govd)
            .token()
            .start(dir.path())
            .await;
        agents.push(a);
    }
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    wait_until("three agents SYNCED", Duration::from_secs(10), async || {
        all_synced(&govd, &["order-1", "order-2", "order-3"]).await
    })
    .await;
    agents.pop().unwrap().kill().await;
    wait_until(
        "order-3 DISCONNECTED",
        Duration::from_secs(10),
        async || {
            agent_state(&govd.status().await, "order-3").state() == pb::SyncState::Disconnected
        },
    )
    .await;

    let mut client = govd.client().await;
    let mut ask = async |agent_rows: pb::AgentRows, max_agents: u32| {
        let request = pb::StatusRequest {
            service: String::new(),
            agent_rows: agent_rows as i32,
            max_agents,
        };
        client
            .status(as_viewer(request))
            .await
            .unwrap()
            .into_inner()
    };
    let count = |view: &pb::ClusterView, state: pb::SyncState| {
        view.agent_counts
            .iter()
            .find(|c| c.service == "order" && c.state() == state)
            .map_or(0, |c| c.agents)
    };
    // A client that sets nothing gets every row, as before; and the counts.
    let all = ask(pb::AgentRows::All, 0).await;
    assert_eq!((all.agents.len(), all.agents_left_out), (3, 0));
    assert_eq!(
        count(&all, pb::SyncState::Synced),
        2,
        "{:?}",
        all.agent_counts
    );
    assert_eq!(count(&all, pb::SyncState::Disconnected), 1);
    // The agents not SYNCED only.
    let not_synced = ask(pb::AgentRows::NotSynced, 0).await;
    let names: Vec<&str> = not_synced
        .agents
        .iter()
        .map(|a| a.instance.as_str())
        .collect();
    assert_eq!(names, ["order-3"]);
    assert_eq!(not_synced.agent_counts, all.agent_counts);
    // A bound: the first by name, the rest counted.
    let one = ask(pb::AgentRows::All, 1).await;
    let names: Vec<&str> = one.agents.iter().map(|a| a.instance.as_str()).collect();
    assert_eq!((names, one.agents_left_out), (vec!["order-1"], 2));
    let none = ask(pb::AgentRows::None, 0).await;
    assert!(none.agents.is_empty() && none.agents_left_out == 0);
    assert_eq!(none.agent_counts, all.agent_counts);

    // `govc status --summary`: a count per state, the one not SYNCED listed.
    let summary = govc(&govd, Some(VIEWER_TOKEN), &["status", "--summary"]).await;
    assert_eq!(summary.code, 0, "{}", summary.stderr);
    let text = &summary.stdout;
    assert!(
        text.contains("SERVICE  AGENTS  SYNCED  STALE  NACKED  UNSAVED  DISCONNECTED"),
        "{text}"
    );
    assert!(
        text.contains("order    3       2       0      0       0        1"),
        "{text}"
    );
    assert!(text.contains("Not SYNCED: 1.\n"), "{text}");
    assert!(
        text.contains("order-3") && !text.contains("order-1"),
        "{text}"
    );
    // Three agents: `govc status` lists every one, as before.
    let table = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    for name in ["order-1", "order-2", "order-3"] {
        assert!(table.stdout.contains(name), "{}", table.stdout);
    }
    assert!(!table.stdout.contains("Not SYNCED"), "{}", table.stdout);

    for a in agents {
        a.stop().await;
    }
    govd.stop().await;
}
