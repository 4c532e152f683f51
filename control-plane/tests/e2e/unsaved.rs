//! An agent whose `--state-dir` cannot take the last good config (issue 26,
//! finding 6): it enforces the config but says it is not saved, and govd,
//! `govc apply`, `govc status` and both `/metrics` say so, with LAST GOOD the
//! version a restart without govd goes back to.

use super::*;

/// The agent's state directory, on a small tmpfs that can be filled up (a
/// real full disk). Where mounting is not allowed, the write fails on a
/// directory where the agent's temp file goes instead: the same failure seen
/// from the agent, and the saved file stays as it was.
struct StateDisk {
    dir: PathBuf,
    mounted: bool,
}

impl StateDisk {
    fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "gov-e2e-unsaved"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("cannot mount a tmpfs here; the write fails on a directory instead");
        }
        StateDisk {
            dir: dir.to_owned(),
            mounted,
        }
    }

    /// No room for the next last good config.
    fn fill(&self) {
        if self.mounted {
            use std::io::Write as _;
            let mut filler = std::fs::File::create(self.dir.join("filler")).unwrap();
            let chunk = [0_u8; 4096];
            while filler.write_all(&chunk).is_ok() {}
        } else {
            std::fs::create_dir_all(self.dir.join(".last-good-config.json.tmp/blocker")).unwrap();
        }
    }

    fn make_room(&self) {
        if self.mounted {
            std::fs::remove_file(self.dir.join("filler")).unwrap();
        } else {
            std::fs::remove_dir_all(self.dir.join(".last-good-config.json.tmp")).unwrap();
        }
    }

    /// The version of the last good config on disk.
    fn saved_version(&self) -> String {
        let text = read(&self.dir.join("last-good-config.json"));
        let target: pb::TargetConfig = serde_json::from_str(&text).unwrap();
        target.version
    }
}

impl Drop for StateDisk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .status();
        }
    }
}

async fn metrics_of(addr: SocketAddr) -> String {
    let (code, _, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// The `govc status` row of `instance`.
fn row<'a>(text: &'a str, instance: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(instance))
        .unwrap_or_else(|| panic!("no {instance} row:\n{text}"))
}

/// With its state directory full, an apply reaches the agent, which enforces
/// it and ACKs it unsaved: apply exits 0 but prints the agent UNSAVED and
/// warns; status shows UNSAVED with LAST GOOD still the saved version and why;
/// the agent's `gov_agent_config_unsaved` is 1 and govd counts it. Once the
/// disk has room, the next apply is saved and SYNCED again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_save_its_config_is_shown_unsaved_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    // Declared before the agent: dropped (unmounted) after it is killed.
    let disk = StateDisk::new(&dir.path().join("agent-state"));
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .start()
        .await;
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .state_dir(&disk.dir)
        .start(dir.path())
        .await;

    let v1_file = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &v1_file]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    wait_until("v1 in force", Duration::from_secs(10), async || {
        all_synced(&govd, &["order-1"]).await
    })
    .await;
    // The version of order's config (not the bundle's).
    let v1 = agent_state(&govd.status().await, "order-1").last_good_version;
    assert_eq!(disk.saved_version(), v1);

    disk.fill();
    let v2_file = write(dir.path(), "v2.gov", &v2());
    let applied = govc(&govd, Some(TOKEN), &["apply", &v2_file]).await;
    let v2 = agent_state(&govd.status().await, "order-1").version;
    assert_ne!(v1, v2);
    // In force everywhere: exit 0, but loudly.
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    let outcome = row(&applied.stdout, "order-1");
    assert!(outcome.contains("UNSAVED"), "{outcome}");
    assert!(outcome.contains(&v2[..12]), "{outcome}");
    assert!(outcome.contains("not saved, lost on restart:"), "{outcome}");
    assert!(
        applied
            .stdout
            .contains("0 synced, 1 unsaved, 0 nacked, 0 stale, 0 disconnected."),
        "{}",
        applied.stdout
    );
    assert!(
        applied.stderr.contains(
            "warning: 1 agent(s) enforce the config but could not save it in their --state-dir"
        ),
        "{}",
        applied.stderr
    );

    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let line = row(&status.stdout, "order-1");
    assert!(line.contains("UNSAVED"), "{line}");
    // VERSION is what it enforces, LAST GOOD what a restart goes back to.
    let (at_v2, at_v1) = (line.find(&v2[..12]), line.find(&v1[..12]));
    assert!(
        at_v2.is_some() && at_v1.is_some() && at_v2 < at_v1,
        "{line}"
    );
    assert!(line.contains("not saved, lost on restart:"), "{line}");
    let json = govc(&govd, Some(VIEWER_TOKEN), &["status", "-o", "json"]).await;
    let view: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let agent = &view["agents"][0];
    assert_eq!(agent["state"], "UNSAVED", "{agent}");
    assert_eq!(agent["last_good_version"], v1.as_str(), "{agent}");
    assert!(
        agent["reason"]
            .as_str()
            .is_some_and(|r| r.contains("last good config")),
        "{agent}"
    );

    let agent_metrics = metrics_of(order.admin).await;
    assert_eq!(
        sample(&agent_metrics, "gov_agent_config_unsaved"),
        1,
        "{agent_metrics}"
    );
    let govd_metrics = metrics_of(govd.metrics.unwrap()).await;
    assert_eq!(
        sample(&govd_metrics, "govd_agents{state=\"UNSAVED\"}"),
        1,
        "{govd_metrics}"
    );
    // Nothing was written over the saved config.
    assert_eq!(disk.saved_version(), v1);

    // Room again: the next apply is saved, and the agent is SYNCED.
    disk.make_room();
    let v3_file = write(
        dir.path(),
        "v3.gov",
        &V1.replacen("max_concurrent 2", "max_concurrent 6", 1),
    );
    let applied = govc(&govd, Some(TOKEN), &["apply", &v3_file]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    assert!(
        applied
            .stdout
            .contains("1 synced, 0 nacked, 0 stale, 0 disconnected."),
        "{}",
        applied.stdout
    );
    assert!(!applied.stderr.contains("warning"), "{}", applied.stderr);
    let a = agent_state(&govd.status().await, "order-1");
    assert_eq!(a.state(), pb::SyncState::Synced, "{a:?}");
    assert_ne!(a.last_good_version, v2);
    assert_eq!(disk.saved_version(), a.last_good_version);
    let agent_metrics = metrics_of(order.admin).await;
    assert_eq!(
        sample(&agent_metrics, "gov_agent_config_unsaved"),
        0,
        "{agent_metrics}"
    );
    order.kill().await;
}
