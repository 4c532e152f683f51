//! Day-2 commands against a real govd (issue 34): `govc history`, `show`,
//! `rollback`, `version`, saved plans and `apply -o json`.

use super::*;

/// `govc` with standard input closed (not a terminal), as a script runs it;
/// no `--auto-approve` added.
async fn govc_plain(govd: &Govd, args: &[&str]) -> Govc {
    let out = Command::new(binary("govc"))
        .args(args)
        .env("GOV_CONTROL_PLANE", govd.url())
        .env("GOV_TOKEN", TOKEN)
        .env("NO_COLOR", "1")
        .env("USER", "e2e")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    Govc {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_show_rollback_saved_plans_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let (v1, v2_file) = (
        write(dir.path(), "v1.gov", V1),
        write(dir.path(), "v2.gov", &v2()),
    );
    for file in [&v1, &v2_file] {
        let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "0s", file]).await;
        assert_eq!(applied.code, 0, "{}", applied.stderr);
    }
    let history = govc(&govd, Some(TOKEN), &["history", "-o", "json"]).await;
    assert_eq!(history.code, 0, "{}", history.stderr);
    let history: serde_json::Value = serde_json::from_str(&history.stdout).unwrap();
    let versions: Vec<&str> = history["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions.len(), 2, "{history}");
    let (first, second) = (versions[1].to_owned(), versions[0].to_owned());
    assert_eq!(history["applied"], second.as_str(), "newest first");
    let table = govc(&govd, Some(VIEWER_TOKEN), &["history"]).await;
    assert!(
        table.stdout.contains(&format!("*  {}", &second[..12])),
        "{}",
        table.stdout
    );

    // `show` prints a version's sources as they were applied.
    let shown = govc(&govd, Some(VIEWER_TOKEN), &["show", &first[..8]]).await;
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert_eq!(shown.stdout, V1);
    let unknown = govc(&govd, Some(VIEWER_TOKEN), &["show", "abcdef01"]).await;
    assert_eq!(unknown.code, 1);
    assert!(
        flat(&unknown.stderr).contains("no kept version"),
        "{}",
        unknown.stderr
    );

    // A saved plan applies as planned, without a question...
    let plan = dir.path().join("back-to-v1.plan");
    let plan = plan.to_str().unwrap();
    let saved = govc_plain(&govd, &["plan", &v1, "--out", plan]).await;
    assert_eq!(saved.code, 0, "{}", saved.stderr);
    // ...unless another version was applied since: refused, nothing applied.
    let v3 = write(
        dir.path(),
        "v3.gov",
        &v2().replacen("max_concurrent 4", "max_concurrent 6", 1),
    );
    assert_eq!(
        govc(&govd, Some(TOKEN), &["apply", "--wait", "0s", &v3])
            .await
            .code,
        0
    );
    let before = govd.status().await.version;
    let stale = govc_plain(&govd, &["apply", plan, "--wait", "0s"]).await;
    assert_eq!(stale.code, 1, "{}{}", stale.stdout, stale.stderr);
    assert!(
        flat(&stale.stderr).contains("the saved plan was made against"),
        "{}",
        stale.stderr
    );
    assert_eq!(govd.status().await.version, before, "nothing was applied");
    let fresh = govc_plain(&govd, &["plan", &v1, "--out", plan]).await;
    assert_eq!(fresh.code, 0, "{}", fresh.stderr);
    let applied = govc_plain(&govd, &["apply", plan, "--wait", "0s"]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    assert_eq!(govd.status().await.version, first);

    // A rollback is planned, needs approval, and is audited as one.
    let asked = govc_plain(&govd, &["rollback", &second[..10]]).await;
    assert_eq!(asked.code, 64, "{}", asked.stderr);
    assert_eq!(govd.status().await.version, first);
    let rolled = govc_plain(
        &govd,
        &["rollback", &second[..10], "--auto-approve", "--wait", "0s"],
    )
    .await;
    assert_eq!(rolled.code, 0, "{}{}", rolled.stdout, rolled.stderr);
    assert!(
        rolled.stdout.contains("max_concurrent 2 -> 4"),
        "{}",
        rolled.stdout
    );
    assert_eq!(govd.status().await.version, second);
    let audit = govc(&govd, Some(VIEWER_TOKEN), &["audit", "-o", "json"]).await;
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let last = records.last().unwrap();
    assert_eq!(last["action"], "apply");
    assert!(
        last["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("rollback to {second}")),
        "{last}"
    );

    // `apply -o json`: only the result on stdout, and only when approved.
    let refused = govc_plain(&govd, &["apply", &v1, "-o", "json"]).await;
    assert_eq!(refused.code, 64, "{}", refused.stderr);
    let json = govc_plain(
        &govd,
        &["apply", &v1, "-o", "json", "--auto-approve", "--wait", "0s"],
    )
    .await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let result: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(result["applied"], true);
    assert_eq!(result["version"], first.as_str());

    // `release -o json`: govd's answer as JSON; a fuse with --key is a usage error.
    let released = govc(
        &govd,
        Some(TOKEN),
        &["release", "limit", "order/bursty", "-o", "json"],
    )
    .await;
    assert_eq!(released.code, 0, "{}", released.stderr);
    let answer: serde_json::Value = serde_json::from_str(&released.stdout).unwrap();
    assert!(
        answer["message"].as_str().unwrap().contains("order/bursty"),
        "{answer}"
    );
    let keyed_fuse = govc(
        &govd,
        Some(TOKEN),
        &["release", "fuse", "order/f", "--key", "x"],
    )
    .await;
    assert_eq!(keyed_fuse.code, 64, "{}", keyed_fuse.stderr);

    let version = govc(&govd, Some(VIEWER_TOKEN), &["version"]).await;
    assert_eq!(version.code, 0);
    let client = env!("CARGO_PKG_VERSION");
    assert!(
        version.stdout.contains(&format!("govc {client}")),
        "{}",
        version.stdout
    );
    assert!(
        version.stdout.contains(&format!("govd {client} at")),
        "{}",
        version.stdout
    );
}

/// `govc config --agent` shows what the agent enforces, not what was
/// applied: after a NACK, the config it kept, the reason, and the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_shows_what_an_agent_enforces_after_a_nack() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .agent_token()
        .start()
        .await;
    let up = upstream().await;
    let _order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .token()
        .start(dir.path())
        .await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    wait_until("the agent synced", Duration::from_secs(10), async || {
        all_synced(&govd, &["order-1"]).await
    })
    .await;
    let synced = govc(&govd, Some(VIEWER_TOKEN), &["config", "--agent", "order-1"]).await;
    assert_eq!(synced.code, 0, "{}", synced.stderr);
    assert!(synced.stdout.contains("SYNCED"), "{}", synced.stdout);
    assert!(
        synced.stdout.contains("the version in force"),
        "{}",
        synced.stdout
    );
    assert!(
        synced.stdout.contains("service: order"),
        "{}",
        synced.stdout
    );
    assert!(synced.stderr.is_empty(), "{}", synced.stderr);

    let bad = write(dir.path(), "cluster.gov", &cluster_limit());
    assert_eq!(
        govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &bad])
            .await
            .code,
        1,
        "the agent NACKs a cluster limit it has no store for"
    );
    let kept = govc(&govd, Some(VIEWER_TOKEN), &["config", "--agent", "order-1"]).await;
    assert_eq!(kept.code, 0, "{}", kept.stderr);
    assert!(kept.stdout.contains("NACKED"), "{}", kept.stdout);
    assert!(
        kept.stdout.contains("# it refused config"),
        "{}",
        kept.stdout
    );
    assert!(
        !kept.stdout.contains("name: order/shared"),
        "{}",
        kept.stdout
    );
    assert!(
        kept.stderr.contains("does not enforce the applied policy")
            && kept.stderr.contains("order/shared"),
        "{}",
        kept.stderr
    );
    let unknown = govc(&govd, Some(VIEWER_TOKEN), &["config", "--agent", "nobody"]).await;
    assert_eq!(unknown.code, 1);
}
