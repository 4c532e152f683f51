//! Rules that expire, with the real binaries: a limit with `for 4s` rejects
//! (and latches), `govc status` shows its time left, and the agent stops
//! enforcing it on time with govd dead (nothing is pushed); govd, back,
//! records the expiry in the audit and ends the latch, audited.

use super::*;

/// A limit of one call an hour on /promo that latches for an hour and
/// lives 4 s from the apply; one on /api that never expires.
const EXPIRING: &str = r#"service order {
  limit promo on path prefix "/promo" {
    calls 1 per 1h
    algorithm fixed window
    release after 1h
    for 4s
  }
  limit api on path prefix "/api" {
    calls 1 per 1h
    algorithm fixed window
  }
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_stops_on_time_without_govd_and_govd_audits_its_expiry_and_latch() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let govd = control_plane(&state).start().await;
    let port = govd.addr.port();
    let up = upstream().await;
    let a = agent("order", "order-a")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    govd.wait_for_agents(1).await;
    let policy = write(dir.path(), "expiring.gov", EXPIRING);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--wait", "10s", &policy]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    // The latch would outlive the rule: the compiler says so.
    assert!(
        applied.stderr.contains("gov::lint::latch-outlives-rule"),
        "{}",
        applied.stderr
    );
    let expires = govd
        .status()
        .await
        .rules
        .iter()
        .find(|r| r.rule == "order/promo")
        .map(|r| r.expires_at_unix_ms)
        .unwrap();
    assert!(expires > 0);

    assert_eq!(http_get(a.inbound, "/promo").await.0, 200);
    assert_eq!(http_get(a.inbound, "/promo").await.0, 429);
    assert_eq!(http_get(a.inbound, "/api").await.0, 200);
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let row = status
        .stdout
        .lines()
        .find(|l| l.starts_with("order/promo") && l.contains("limit") && l.contains('Z'))
        .unwrap_or_else(|| panic!("no expiry row: {}", status.stdout));
    assert!(
        row.ends_with('s') && !row.contains("expired"),
        "time left before the expiry: {row}"
    );
    // Recorded on disk, not only in govd's memory: govd shows a latch an
    // agent reported before its audit and its part file are written, and
    // the kill below must not fall between the two.
    let latch_on_disk = || {
        std::fs::read_dir(&state).is_ok_and(|dir| {
            dir.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("latch-") && name.ends_with(".json")
            })
        })
    };
    wait_until("the latch recorded", Duration::from_secs(10), async || {
        govd.status().await.limits.len() == 1 && latch_on_disk()
    })
    .await;

    // govd dies: nothing can be pushed. The agent stops the rule by itself.
    govd.kill().await;
    wait_until(
        "the agent stopped enforcing the expired rule",
        Duration::from_secs(20),
        async || http_get(a.inbound, "/promo").await.0 == 200,
    )
    .await;
    assert!(
        gov_common::instant::now_unix_ms() + 500 >= expires,
        "not before its instant"
    );
    assert_eq!(http_get(a.inbound, "/promo").await.0, 200);
    assert_eq!(
        http_get(a.inbound, "/api").await.0,
        429,
        "the other rule goes on"
    );

    // govd back: the expiry that passed while it was down is recorded, and
    // the latch of the expired rule ended, audited.
    let govd = control_plane(&state).start_on(port).await;
    let audit = || read(&state.join("audit.jsonl"));
    wait_until("the expiry audited", Duration::from_secs(20), async || {
        audit().contains("\"action\":\"expire\"")
    })
    .await;
    let audit = audit();
    let lines: Vec<&str> = audit.lines().collect();
    let expire = lines
        .iter()
        .position(|l| l.contains("\"action\":\"expire\""))
        .unwrap();
    let release = lines
        .iter()
        .position(|l| l.contains("\"action\":\"release\"") && l.contains("govd (rule expired)"))
        .unwrap_or_else(|| panic!("no release of the latch: {audit}"));
    assert!(
        release < expire,
        "the latch ends before the expiry is recorded: {audit}"
    );
    assert!(lines[expire].contains("order/promo"), "{audit}");
    wait_until("the latch gone", Duration::from_secs(10), async || {
        govd.status().await.limits.is_empty()
    })
    .await;
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert!(
        status
            .stdout
            .lines()
            .any(|l| l.starts_with("order/promo") && l.trim_end().ends_with("expired")),
        "{}",
        status.stdout
    );
    // Recorded once, even when govd starts again.
    govd.kill().await;
    let govd = control_plane(&state).start_on(port).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = govd.status().await;
    let expiries = read(&state.join("audit.jsonl"))
        .lines()
        .filter(|l| l.contains("\"action\":\"expire\""))
        .count();
    assert_eq!(expiries, 1);
    a.stop().await;
}
