//! Tokens, roles and the audit log, and TLS: who may do what, what the
//! audit names, reloading the token file, and an agent over TLS being the
//! service its certificate names.

use super::*;

/// Runs `govd` with `args` (and a fresh state directory) and expects it to
/// refuse to start: its exit code and stderr.
async fn govd_refuses(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        Command::new(govd_bin())
            .args(args)
            .arg("--state-dir")
            .arg(dir.join(format!("refused-{}", rand_suffix())))
            .env_remove("GOV_TOKEN_FILE")
            .env_remove("GOV_INSECURE")
            .output(),
    )
    .await
    .expect("govd must exit, not serve")
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn govd_will_not_start_open_unless_told_and_only_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = govd_refuses(dir.path(), &["--listen", "127.0.0.1:0"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("govd needs tokens"), "{stderr}");
    assert!(stderr.contains("--token-file FILE"), "{stderr}");
    let (code, stderr) = govd_refuses(dir.path(), &["--listen", "0.0.0.0:0", "--insecure"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--insecure is only allowed on a loopback address, not `0.0.0.0:0`"),
        "{stderr}"
    );
    // A token file with a bad line says which line and what is wrong.
    let tokens = write(
        dir.path(),
        "bad.tokens",
        "alice a-token admin\nbob b-token root\n",
    );
    let (code, stderr) = govd_refuses(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--token-file", &tokens],
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("line 2: unknown role `root`"), "{stderr}");
    // etcd's settings without etcd are a usage error, not ignored (clap alone
    // let them through beside `--state-dir`).
    for flag in [["--leader-lease", "5s"], ["--replica", "r1"]] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--insecure"];
        args.extend(flag);
        let (code, stderr) = govd_refuses(dir.path(), &args).await;
        assert_eq!(code, 64, "{flag:?}: {stderr}");
        assert!(stderr.contains("need --store etcd://"), "{stderr}");
    }
    // --insecure on loopback starts (and serves without a token).
    let govd = ControlPlaneBuilder {
        state_dir: dir.path().join("open"),
        store: None,
        token: false,
        agent_token: false,
        metrics: false,
        tls: None,
        args: Vec::new(),
    }
    .start()
    .await;
    let status = govc(&govd, None, &["status", "-o", "json"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, None, &["apply", "--who", "mallory", &v1]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    // Without tokens the claim is all govd has: it is marked as such.
    let audit = govc(&govd, None, &["audit", "-o", "json"]).await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    // The apply's intent and its outcome.
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(
        records.iter().all(|r| r["who"] == "mallory (unverified)"),
        "{records:?}"
    );
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_do_what_it_says_and_the_audit_names_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);

    // Reads need a token too.
    let status = govc(&govd, None, &["status"]).await;
    assert_eq!(status.code, 1, "{}", status.stdout);
    assert!(
        flat(&status.stderr)
            .contains("`Status` needs a token with the viewer, operator or admin role"),
        "{}",
        status.stderr
    );
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let wrong = govc(&govd, Some("not-a-token"), &["status"]).await;
    assert_eq!(wrong.code, 1);
    assert!(
        flat(&wrong.stderr).contains("not one govd knows"),
        "{}",
        wrong.stderr
    );

    // A viewer cannot apply, an operator cannot apply; the refusal names the
    // role needed and the token's role.
    for (token, name, role) in [
        (VIEWER_TOKEN, "board", "viewer"),
        (OPERATOR_TOKEN, "oncall", "operator"),
    ] {
        let refused = govc(&govd, Some(token), &["apply", &v1]).await;
        assert_eq!(refused.code, 1, "{}", refused.stdout);
        let want = format!("`Apply` needs the admin role; the token `{name}` has the {role} role");
        assert!(flat(&refused.stderr).contains(&want), "{}", refused.stderr);
    }
    assert_eq!(govd.status().await.version, "", "nothing was applied");

    // The admin applies; the audit names the token, not `--who` or $USER.
    let applied = govc(&govd, Some(TOKEN), &["apply", "--who", "mallory", &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);

    // A viewer cannot release; an operator can.
    let refused = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(refused.code, 1);
    assert!(
        flat(&refused.stderr).contains(
            "`Release` needs the operator or admin role; the token `board` has the viewer role"
        ),
        "{}",
        refused.stderr
    );
    let released = govc(
        &govd,
        Some(OPERATOR_TOKEN),
        &["release", "fuse", "order/errors"],
    )
    .await;
    assert_eq!(released.code, 0, "{}", released.stderr);

    // `govc audit` reads the log over gRPC, with a viewer's token.
    let refused = govc(&govd, None, &["audit"]).await;
    assert_eq!(refused.code, 1);
    assert!(
        flat(&refused.stderr).contains("`Audit` needs a token"),
        "{}",
        refused.stderr
    );
    let audit = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--since", "1h", "-o", "json"],
    )
    .await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let who: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r["who"].as_str().unwrap(), r["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        who,
        [
            ("e2e", "apply-intended"),
            ("e2e", "apply"),
            ("oncall", "release-intended"),
            ("oncall", "release")
        ],
        "{records:?}"
    );
    assert_eq!(records[3]["rule"], "order/errors");
    assert!(records[0]["at"].as_str().unwrap().ends_with('Z'));
    let table = govc(&govd, Some(VIEWER_TOKEN), &["audit"]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.stdout.starts_with("SEQ  TIME (UTC)"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("fuse order/errors"),
        "{}",
        table.stdout
    );
    // --since a time after both: nothing.
    let later = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--since", "2999-01-01"],
    )
    .await;
    assert_eq!(later.code, 0, "{}", later.stderr);
    assert_eq!(later.stdout, "no audit records\n");
    // --limit keeps the newest and says how many were left out.
    let last = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--limit", "1", "-o", "json"],
    )
    .await;
    let records: Vec<serde_json::Value> = serde_json::from_str(&last.stdout).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["action"], "release");
    assert!(
        flat(&last.stderr).contains("3 older record(s) left out"),
        "{}",
        last.stderr
    );
    let bad = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "--since", "yesterday"],
    )
    .await;
    assert_eq!(bad.code, 64, "{}", bad.stderr);
    govd.stop().await;
}

/// Issue 12: `govc audit` pages over a long log. govd answers one bounded
/// page (never the whole log), `--before` walks back from the note's cursor
/// without gaps or repeats, and `--since` still bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govc_audit_pages_back_over_a_long_log_in_bounded_answers() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // 25,000 records of an old govd, 1 ms apart (older than any page bound).
    let mut log = String::new();
    for i in 1..=25_000u64 {
        log.push_str(&format!(
            "{{\"at_unix_ms\":{},\"who\":\"bot-{i}\",\"action\":\"apply\",\"version\":\"v{i}\"}}\n",
            1_700_000_000_000 + i
        ));
    }
    std::fs::write(state.join("audit.jsonl"), log).unwrap();
    let govd = control_plane(&state).start().await;
    let page = |args: Vec<String>| {
        let govd = &govd;
        async move {
            let mut all = vec!["audit".to_owned(), "-o".into(), "json".into()];
            all.extend(args);
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            let out = govc(govd, Some(VIEWER_TOKEN), &args).await;
            assert_eq!(out.code, 0, "{}", out.stderr);
            let records: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
            let seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
            let next = flat(&out.stderr)
                .split("govc audit --before ")
                .nth(1)
                .map(|n| n.trim().parse::<u64>().unwrap());
            (seqs, next)
        }
    };
    // Asking for everything gets govd's cap, the newest first page.
    let (seqs, next) = page(vec!["--limit".into(), "0".into()]).await;
    assert_eq!(seqs.len(), 10_000);
    assert_eq!((seqs[0], *seqs.last().unwrap()), (15_001, 25_000));
    assert_eq!(next, Some(15_001));
    // Pages of 7,000 walk back to the first record.
    let mut seen: Vec<u64> = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let mut args = vec!["--limit".to_owned(), "7000".into()];
        if let Some(b) = before {
            args.extend(["--before".into(), b.to_string()]);
        }
        let (seqs, next) = page(args).await;
        assert!(seqs.len() <= 7_000);
        seen.splice(0..0, seqs);
        match next {
            Some(n) => before = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, (1..=25_000).collect::<Vec<u64>>());
    // --since bounds the pages too: its last 1,001 records, in two pages
    // of the default 1,000.
    let since = "2023-11-14T22:13:44Z"; // 1_700_000_024_000
    let (seqs, next) = page(vec!["--since".into(), since.into()]).await;
    assert_eq!(seqs, (24_001..=25_000).collect::<Vec<u64>>());
    assert_eq!(next, Some(24_001));
    let (seqs, next) = page(vec![
        "--since".into(),
        since.into(),
        "--before".into(),
        "24001".into(),
    ])
    .await;
    assert_eq!((seqs, next), (vec![24_000], None));
    govd.stop().await;
}

/// Issue 12: govd re-reads its token file on SIGHUP. A token taken out of
/// the file stops working without a restart, a new one works, the reload
/// is audited; a broken file keeps the tokens in force and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_token_file_and_a_bad_one_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let token_file = state.with_extension("token");
    let status = async |token: &str| govc(&govd, Some(token), &["status"]).await;
    assert_eq!(status(OPERATOR_TOKEN).await.code, 0);

    // The operator's token is revoked, a new viewer's added.
    std::fs::write(
        &token_file,
        "e2e e2e-admin-token admin\nboard e2e-viewer-token viewer\nauditor e2e-new-token viewer\n",
    )
    .unwrap();
    signal(&govd.child, rustix::process::Signal::HUP);
    wait_until(
        "govd to reload its tokens",
        Duration::from_secs(10),
        async || read(&govd.log).contains("token files reloaded"),
    )
    .await;
    let revoked = status(OPERATOR_TOKEN).await;
    assert_ne!(
        revoked.code, 0,
        "a revoked token still works: {}",
        revoked.stdout
    );
    assert!(
        flat(&revoked.stderr).contains("not one govd knows"),
        "{}",
        revoked.stderr
    );
    assert_eq!(status("e2e-new-token").await.code, 0);
    assert_eq!(status(VIEWER_TOKEN).await.code, 0);
    let audit = govc(&govd, Some(VIEWER_TOKEN), &["audit", "-o", "json"]).await;
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let reload = records
        .iter()
        .find(|r| r["action"] == "tokens-reloaded")
        .unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!(reload["who"], "govd (SIGHUP)");
    let detail = reload["detail"].as_str().unwrap();
    assert!(
        detail.contains("auditor (viewer)") && !detail.contains("oncall"),
        "{detail}"
    );
    assert!(
        !audit.stdout.contains("e2e-new-token"),
        "a token in the audit log"
    );

    // A broken file: the tokens in force stay, and the log says why.
    std::fs::write(&token_file, "e2e e2e-admin-token superuser\n").unwrap();
    signal(&govd.child, rustix::process::Signal::HUP);
    wait_until(
        "govd to refuse the broken file",
        Duration::from_secs(10),
        async || read(&govd.log).contains("keeping the tokens in force"),
    )
    .await;
    let log = read(&govd.log);
    assert!(log.contains("unknown role `superuser`"), "{log}");
    assert_eq!(status("e2e-new-token").await.code, 0);
    assert_ne!(status(OPERATOR_TOKEN).await.code, 0);
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_an_agent_is_the_service_its_certificate_names_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .start()
        .await;
    let up = upstream().await;
    let ca = pki.ca.display().to_string();

    // People: govc over TLS with the CA; plain HTTP/2 or no CA gets nothing.
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status", "--tls-ca", &ca]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let no_ca = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(no_ca.code, 1);
    assert!(
        flat(&no_ca.stderr).contains("no CA to check govd's certificate"),
        "{}",
        no_ca.stderr
    );
    let plain_url = format!("http://{}", govd.addr);
    let plain = Command::new(binary("govc"))
        .args(["status", "--control-plane", &plain_url])
        .env("GOV_TOKEN", VIEWER_TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(
        plain.status.code(),
        Some(1),
        "plain HTTP/2 must not be served"
    );
    let tls_on_http = Command::new(binary("govc"))
        .args(["status", "--control-plane", &plain_url, "--tls-ca", &ca])
        .env("GOV_TOKEN", VIEWER_TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(tls_on_http.status.code(), Some(1));
    assert!(
        flat(&String::from_utf8_lossy(&tls_on_http.stderr))
            .contains("is plain HTTP, but TLS files were given"),
        "{}",
        String::from_utf8_lossy(&tls_on_http.stderr)
    );

    // An agent with a SPIFFE certificate for its service, and one with CN.
    let order_cert = pki.agent("order", true);
    let pay_cert = pki.agent("payment", false);
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, Some(&order_cert))
        .start(dir.path())
        .await;
    let pay = agent("payment", "payment-1")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, Some(&pay_cert))
        .start(dir.path())
        .await;
    wait_until(
        "both agents connected",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 2,
    )
    .await;

    // The payment certificate cannot claim order; an agent without a
    // certificate is refused too.
    let posing = agent("order", "order-fake")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, Some(&pay_cert))
        .start(dir.path())
        .await;
    let anonymous = agent("order", "order-anon")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, None)
        .start(dir.path())
        .await;
    wait_until(
        "both refusals logged",
        Duration::from_secs(10),
        async || {
            let (a, b) = (read(&posing.log), read(&anonymous.log));
            a.contains("refused this agent's credentials")
                && b.contains("refused this agent's credentials")
        },
    )
    .await;
    assert!(
        read(&posing.log).contains("certificate is for service `payment`, not `order`"),
        "{}",
        read(&posing.log)
    );
    assert!(
        read(&anonymous.log).contains("requires agents to present a client certificate"),
        "{}",
        read(&anonymous.log)
    );
    // The refused agents say so on /ready and in /metrics; the accepted
    // one does not.
    for refused in [&posing, &anonymous] {
        let (_, _, ready) = http_get(refused.admin, "/ready").await;
        assert!(
            ready.contains("control plane refused this agent's credentials"),
            "{ready}"
        );
        let (_, _, metrics) = http_get(refused.admin, "/metrics").await;
        assert!(
            metrics.contains("gov_agent_control_plane_refused 1"),
            "{metrics}"
        );
        assert!(
            !metrics.contains("gov_agent_control_plane_auth_failures_total 0"),
            "{metrics}"
        );
    }
    let (_, _, ready) = http_get(order.admin, "/ready").await;
    assert!(!ready.contains("refused"), "{ready}");
    let (_, _, metrics) = http_get(order.admin, "/metrics").await;
    assert!(
        metrics.contains("gov_agent_control_plane_refused 0"),
        "{metrics}"
    );
    let view = govd.status().await;
    let mut names: Vec<_> = view.agents.iter().map(|a| a.instance.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["order-1", "payment-1"]);
    // The attempt to pose as order is audited and logged.
    let audit = govc(
        &govd,
        Some(VIEWER_TOKEN),
        &["audit", "-o", "json", "--tls-ca", &ca],
    )
    .await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    let refused: Vec<_> = records
        .iter()
        .filter(|r| r["action"] == "agent-refused")
        .collect();
    assert!(!refused.is_empty(), "{records:?}");
    assert_eq!(refused[0]["targets"][0], "order/order-fake");
    assert!(
        read(&govd.log).contains("refused an agent: its certificate is for another service"),
        "{}",
        read(&govd.log)
    );

    // Configs flow over TLS: an apply reaches the order agent.
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--tls-ca", &ca, &v1]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    assert_eq!(order.configs_applied().await, 1);
    for a in [order, pay, posing, anonymous] {
        a.stop().await;
    }
    govd.stop().await;
}
