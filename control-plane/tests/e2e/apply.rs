//! Applies end to end: what reaches which agents, a config an agent
//! cannot enforce, dry runs, `apply` without a terminal, and the history's
//! bounds.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_reaches_every_agent_of_the_changed_service_and_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let up = upstream().await;
    let order1 = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let order2 = agent("order", "order-2")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let pay = agent("payment", "payment-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    wait_until(
        "three agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 3,
    )
    .await;

    // Without the token, nothing is applied.
    let v1 = write(dir.path(), "v1.gov", V1);
    let refused = govc(&govd, None, &["apply", &v1]).await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("token"), "{}", refused.stderr);
    assert_eq!(govd.status().await.version, "");

    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v1]).await;
    assert_eq!(
        applied.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        applied.stdout, applied.stderr
    );
    assert!(
        applied.stdout.contains("+ service order"),
        "{}",
        applied.stdout
    );
    assert_eq!(
        applied.stdout.matches("SYNCED").count(),
        3,
        "{}",
        applied.stdout
    );
    // 2 in flight at most on each order agent: 4 of 6 concurrent slow calls are shed.
    assert_eq!(slow_burst(order1.inbound, 6).await, (2, 4));
    assert_eq!(slow_burst(order2.inbound, 6).await, (2, 4));
    assert_eq!(pay.configs_applied().await, 1);

    // The TUI's stream: one view at once, then one per change.
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let mut watch = client
        .watch(as_viewer(pb::WatchRequest {
            service: "order".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(
        first.agents.iter().all(|a| a.service == "order") && first.agents.len() == 2,
        "{first:?}"
    );

    // V2 changes only order: both order agents enforce 4, payment gets nothing.
    let v2 = write(dir.path(), "v2.gov", &v2());
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &v2]).await;
    assert_eq!(
        applied.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        applied.stdout, applied.stderr
    );
    assert!(
        applied.stdout.contains("~ service order"),
        "{}",
        applied.stdout
    );
    assert!(
        !applied.stdout.contains("payment"),
        "payment is unchanged:\n{}",
        applied.stdout
    );
    assert_eq!(
        applied.stdout.matches("SYNCED").count(),
        2,
        "{}",
        applied.stdout
    );
    assert!(all_synced(&govd, &["order-1", "order-2", "payment-1"]).await);
    assert_eq!(slow_burst(order1.inbound, 6).await, (4, 2));
    assert_eq!(slow_burst(order2.inbound, 6).await, (4, 2));
    assert_eq!(
        pay.configs_applied().await,
        1,
        "the payment agent must receive nothing"
    );
    let version = govd.status().await.version;
    let watched = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let view = watch.message().await.unwrap().unwrap();
            if view.version == version {
                return view;
            }
        }
    })
    .await
    .expect("the watch stream shows the new version");
    assert!(
        watched.rules.iter().any(|r| r.rule == "order/slow_calls"),
        "{watched:?}"
    );
    assert!(
        watched.rules.iter().all(|r| r.rule.starts_with("order/")),
        "{watched:?}"
    );

    // An invalid policy is refused with the diagnostics; nothing changes.
    let bad = write(dir.path(), "bad.gov", INVALID);
    let refused = govc(&govd, Some(TOKEN), &["apply", &bad]).await;
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("gov::unknown-match"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("bad.gov:2:"), "{}", refused.stderr);
    assert!(refused.stderr.contains("slwo"), "{}", refused.stderr);
    assert_eq!(govd.status().await.version, version);
    assert_eq!(slow_burst(order1.inbound, 6).await, (4, 2));
    assert_eq!(order1.configs_applied().await, 2);

    // `govc plan` against the live control plane costs a compile and shows
    // the policy in force: it needs the token like an apply.
    let plan = govc(&govd, None, &["plan", "--detailed-exitcode", &v2]).await;
    assert_eq!(plan.code, 1, "{}{}", plan.stdout, plan.stderr);
    assert!(
        flat(&plan.stderr).contains("needs a token with the admin role"),
        "{}",
        plan.stderr
    );
    // No change for V2.
    let plan = govc(&govd, Some(TOKEN), &["plan", "--detailed-exitcode", &v2]).await;
    assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
    let plan = govc(&govd, Some(TOKEN), &["plan", "--detailed-exitcode", &v1]).await;
    assert_eq!(plan.code, 2, "{}{}", plan.stdout, plan.stderr);
    assert!(
        plan.stdout.contains("max_concurrent 4 -> 2"),
        "{}",
        plan.stdout
    );

    // The audit log says who applied what.
    let audit = read(&dir.path().join("state").join("audit.jsonl"));
    assert_eq!(
        audit
            .lines()
            .filter(|l| l.contains("\"action\":\"apply\""))
            .count(),
        2,
        "{audit}"
    );
    assert!(audit.contains("\"who\":\"e2e\""), "{audit}");

    for a in [order1, order2, pay] {
        a.stop().await;
    }
    govd.stop().await;
    // The watch stream ends when govd drains.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = watch.message().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch stream must end when govd stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_the_agent_cannot_enforce_is_nacked_by_rule_and_the_old_one_stays() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .agent_token()
        .start()
        .await;
    let up = upstream().await;
    // Without the agent token, an agent is refused (and keeps retrying).
    let intruder = agent("order", "intruder")
        .upstream(up)
        .control_plane(&govd)
        .no_token()
        .start(dir.path())
        .await;
    wait_until(
        "the intruder refused",
        Duration::from_secs(10),
        // Said as what it is, with what to check (not "unavailable").
        async || read(&intruder.log).contains("the control plane refused this agent's credentials"),
    )
    .await;
    intruder.stop().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .token()
        .start(dir.path())
        .await;
    govd.wait_for_agents(1).await;
    assert_eq!(
        agent_state(&govd.status().await, "order-1").instance,
        "order-1"
    );

    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    let good = agent_state(&govd.status().await, "order-1").last_good_version;

    let bad = write(dir.path(), "cluster.gov", &cluster_limit());
    let nacked = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &bad]).await;
    assert_eq!(
        nacked.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        nacked.stdout, nacked.stderr
    );
    assert!(nacked.stdout.contains("NACKED"), "{}", nacked.stdout);
    assert!(
        // The rule once, as the agent's reason names it (not "rule x: rule `x`").
        nacked.stdout.contains("NACKED  ")
            && nacked
                .stdout
                .contains("rule `order/shared`: `scope cluster`")
            && !nacked.stdout.contains("rule order/shared: rule"),
        "{}",
        nacked.stdout
    );
    assert!(nacked.stdout.contains("scope cluster"), "{}", nacked.stdout);
    assert!(
        nacked.stderr.contains("refused the config"),
        "{}",
        nacked.stderr
    );

    // Never reported as applied (istio#30498): NACKED, still on the old version.
    let view = govd.status().await;
    let a = agent_state(&view, "order-1");
    assert_eq!(a.state(), pb::SyncState::Nacked);
    assert_eq!(a.rule, "order/shared");
    assert_eq!(a.last_good_version, good);
    // ...and the agent still enforces V1's bulkhead of 2.
    assert_eq!(slow_burst(order.inbound, 6).await, (2, 4));
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(status.stdout.contains("NACKED"), "{}", status.stdout);
    assert!(
        // The rule once here too, as the agent's reason names it.
        status
            .stdout
            .contains("rule `order/shared`: `scope cluster`")
            && !status.stdout.contains("rule order/shared: rule"),
        "{}",
        status.stdout
    );
    assert!(status.stdout.contains("scope cluster"), "{}", status.stdout);

    order.stop().await;
    govd.stop().await;
}

/// Issue 12, item 2: a dry run against govd costs what its size allows.
/// 1,000 limits on one match give one `conflicting-rules` per rule (999),
/// not one per pair (499,500); a policy over `--max-statements` is refused
/// before the compiler runs, naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_of_many_rules_on_one_match_is_linear_and_capped() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .args(&["--max-statements", "3000"])
        .start()
        .await;
    let limits = |n: usize| -> String {
        let rules: String = (0..n)
            .map(|i| {
                format!(
                    "  limit l{i} on all {{\n    calls {} per 1s\n  }}\n",
                    10 + i
                )
            })
            .collect();
        format!("service wide {{\n  match all = path prefix \"/\"\n{rules}}}\n")
    };
    let thousand = write(dir.path(), "thousand.gov", &limits(1_000));
    let planned = govc(&govd, Some(TOKEN), &["plan", &thousand]).await;
    let out = format!("{}{}", planned.stdout, planned.stderr);
    let conflicts = out.matches("conflicting-rules").count();
    assert!(
        (1..=1_000).contains(&conflicts),
        "{conflicts} conflicts reported:\n{}",
        &out[..out.len().min(2_000)]
    );
    let too_many = write(dir.path(), "many.gov", &limits(5_000));
    let refused = govc(&govd, Some(TOKEN), &["plan", &too_many]).await;
    assert_ne!(refused.code, 0);
    assert!(
        flat(&refused.stderr).contains("GOV_MAX_STATEMENTS"),
        "{}",
        refused.stderr
    );
    // govd is not busy with either: an apply goes through at once.
    let small = write(dir.path(), "small.gov", &limits(1));
    let applied = govc(&govd, Some(TOKEN), &["apply", &small]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    govd.stop().await;
}

/// `govc apply` shows the plan and applies only when confirmed: without a
/// terminal it needs `--auto-approve` (exit 64, nothing sent); a removed
/// service is called out in the plan.
#[tokio::test]
async fn apply_without_a_terminal_needs_auto_approve_and_calls_out_a_removal() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    let version = govd.status().await.version;

    let order_only = write(
        dir.path(),
        "order.gov",
        &V1[..V1.find("service payment").unwrap()],
    );
    let out = Command::new(binary("govc"))
        .args(["apply", &order_only])
        .env("GOV_CONTROL_PLANE", govd.url())
        .env("GOV_TOKEN", TOKEN)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(64), "{stdout}{stderr}");
    assert!(
        stdout.contains("- service payment"),
        "the plan is shown:\n{stdout}"
    );
    assert!(
        stdout.contains("WARNING: this removes service payment"),
        "{stdout}"
    );
    assert!(stderr.contains("--auto-approve"), "{stderr}");
    assert_eq!(govd.status().await.version, version, "nothing was applied");

    let approved = govc(&govd, Some(TOKEN), &["apply", &order_only]).await;
    assert_eq!(approved.code, 0, "{}{}", approved.stdout, approved.stderr);
    assert!(
        approved
            .stdout
            .contains("WARNING: this removes service payment")
    );
    assert_ne!(govd.status().await.version, version);

    // A file with no service would empty every agent: refused by govc, and
    // by govd for a client that does not ask first, unless it is asked for.
    let version = govd.status().await.version;
    let empty = write(dir.path(), "empty.gov", "\n");
    let refused = govc(&govd, Some(TOKEN), &["apply", &empty]).await;
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert!(
        flat(&refused.stderr).contains("--remove-all-services"),
        "{}",
        refused.stderr
    );
    assert_eq!(govd.status().await.version, version, "nothing was applied");
    let direct = govd
        .client()
        .await
        .apply(as_token(
            TOKEN,
            pb::ApplyRequest {
                sources: vec![pb::SourceFile {
                    name: "empty.gov".into(),
                    text: "\n".into(),
                }],
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(direct.code(), tonic::Code::FailedPrecondition, "{direct:?}");
    assert_eq!(govd.status().await.version, version, "nothing was applied");
    let removed = govc(
        &govd,
        Some(TOKEN),
        &["apply", "--remove-all-services", &empty],
    )
    .await;
    assert_eq!(removed.code, 0, "{}{}", removed.stdout, removed.stderr);
    assert_ne!(govd.status().await.version, version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_applies_of_the_examples_keep_one_copy_of_each_source() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<String> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gov"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    let examples_bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    // Two versions of one more file, alternating: every apply is a change.
    let mut first = 0;
    for i in 0..50 {
        let extra = write(
            dir.path(),
            "extra.gov",
            &format!(
                "service extra_svc {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent {}\n  }}\n}}\n",
                2 + i % 2
            ),
        );
        let mut args = vec!["apply", "--wait", "0s", &extra];
        args.extend(files.iter().map(String::as_str));
        let applied = govc(&govd, Some(TOKEN), &args).await;
        assert_eq!(
            applied.code, 0,
            "apply {i}: {}{}",
            applied.stdout, applied.stderr
        );
        if i == 0 {
            first = state_bytes(&state);
        }
    }
    govd.stop().await;
    let size = state_bytes(&state);
    assert_eq!(state_files(&state, "history-").len(), 50);
    // 49 more versions cost their metadata (names, content addresses), not
    // 49 more copies of the examples (before: about 49 x the examples).
    assert!(
        (size - first) * 10 < 49 * examples_bytes,
        "the state grew from {first} to {size} bytes over 49 applies of {examples_bytes} bytes of examples"
    );
    println!(
        "the state: {first} bytes after 1 apply, {size} bytes after 50; the examples: {examples_bytes} bytes"
    );
}

/// The part files of the state directory whose names start with `prefix`.
fn state_files(state: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with(prefix) && name.ends_with(".json") && !name.starts_with('.')
        })
        .collect();
    files.sort();
    files
}

/// Bytes of the shared state in the state directory (its parts: not the
/// agents' journal, not the audit log).
fn state_bytes(state: &Path) -> u64 {
    [
        "policy", "history-", "text-", "latch-", "release-", "canary",
    ]
    .iter()
    .flat_map(|p| state_files(state, p))
    .map(|f| std::fs::metadata(f).unwrap().len())
    .sum()
}

/// Issue 12: the history is bounded by size. Six applies of a 150 KB policy
/// that changes every time, under `--history-bytes 400000`: the state
/// keeps the two newest versions (two distinct texts fit, three do not),
/// not six.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_of_large_changing_policies_stops_at_history_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state)
        .args(&["--history-bytes", "400000"])
        .start()
        .await;
    for i in 0..6 {
        let comment: String = (0..12_000).map(|n| format!("# {i} {n:08}\n")).collect();
        assert!(comment.len() > 140_000);
        let policy = write(
            dir.path(),
            "big.gov",
            &format!(
                "{comment}service big_svc {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent {}\n  }}\n}}\n",
                2 + i
            ),
        );
        let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "0s", &policy]).await;
        assert_eq!(
            applied.code, 0,
            "apply {i}: {}{}",
            applied.stdout, applied.stderr
        );
    }
    govd.stop().await;
    let size = state_bytes(&state);
    let versions = state_files(&state, "history-");
    assert_eq!(versions.len(), 2, "{versions:?}");
    let newest: serde_json::Value = serde_json::from_str(&read(&versions[1])).unwrap();
    let policy: serde_json::Value =
        serde_json::from_str(&read(&state.join("policy.json"))).unwrap();
    assert_eq!(
        newest["version"], policy["version"],
        "the version in force is kept"
    );
    assert_eq!(
        state_files(&state, "text-").len(),
        2,
        "the texts of the versions dropped are removed"
    );
    assert!(size < 700_000, "the state is {size} bytes");
}
