//! Operability (issue 13): signals, JSON logs, `/metrics` against
//! docs/metrics.md and Prometheus, and govd's connection limits.

use super::*;

/// `govd 2>&1 | head -3`: once `head` has its lines, stderr is a closed pipe.
/// govd must still stop on SIGTERM (it used to panic inside the log write of
/// its signal task, before cancelling, and needed SIGKILL).
#[tokio::test]
async fn govd_stops_on_sigterm_with_a_closed_stderr() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(govd_bin())
        .args(["--listen", "127.0.0.1:0", "--insecure", "--state-dir"])
        .arg(dir.path().join("state"))
        .env("GOV_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("govd started") {
                return;
            }
        }
        panic!("govd ended its log before `govd started`");
    })
    .await
    .expect("govd did not start within 15 s");
    drop(lines);
    signal(&child, rustix::process::Signal::TERM);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("govd ignored SIGTERM with its stderr closed")
        .unwrap();
    assert!(status.success(), "govd exited with {status}");
}

/// `--log-format json` writes one JSON object per line with the event's fields at
/// the top level, and `RUST_LOG` filters when `GOV_LOG` is unset.
#[tokio::test]
async fn govd_logs_json_lines_filtered_by_rust_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("govd.log");
    let mut child = Command::new(govd_bin())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--insecure",
            "--log-format",
            "json",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .env_remove("GOV_LOG")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until(
        "`govd started` in the log",
        Duration::from_secs(15),
        async || read(&log).contains("govd started"),
    )
    .await;
    signal(&child, rustix::process::Signal::TERM);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    let text = read(&log);
    let started = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .find(|v| v["message"] == "govd started")
        .unwrap_or_else(|| panic!("no `govd started` object in:\n{text}"));
    assert_eq!(started["level"], "INFO");
    let listen: SocketAddr = started["listen"].as_str().unwrap().parse().unwrap();
    assert!(listen.ip().is_loopback());

    // A bad filter is a usage error naming its variable.
    let out = Command::new(govd_bin())
        .args(["--listen", "127.0.0.1:0", "--insecure", "--state-dir"])
        .arg(dir.path().join("state"))
        .env_remove("GOV_LOG")
        .env("RUST_LOG", "info,[{")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`RUST_LOG=info,[{` is not a valid log filter"),
        "{stderr}"
    );
}

/// Every family both binaries export is in docs/metrics.md with its type, and
/// every family the doc marks `always` is exported. The scenario makes the
/// optional ones appear too: a control plane, a state directory, an outbound
/// listener with endpoints from govd, and a limit that rejects and latches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_metrics_lists_every_family_both_binaries_export() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .start()
        .await;
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .state_dir(&dir.path().join("agent-state"))
        .outbound()
        .start(dir.path())
        .await;
    let _payment = agent("payment", "payment-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let file = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &file]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    // The limit: 3 calls per minute, then rejected and latched.
    let mut rejected = 0;
    for _ in 0..5 {
        if http_get(order.inbound, "/burst").await.0 == 429 {
            rejected += 1;
        }
    }
    assert!(rejected > 0);
    // The outbound listener knows payment's instance once govd says so.
    wait_until(
        "payment's endpoint at order",
        Duration::from_secs(15),
        async || {
            http_get(order.admin, "/metrics")
                .await
                .2
                .contains("gov_agent_endpoint_requests_total{service=\"payment\"")
        },
    )
    .await;
    wait_until(
        "govd holding the limit",
        Duration::from_secs(15),
        async || !govd.status().await.limits.is_empty(),
    )
    .await;

    let agent_text = http_get(order.admin, "/metrics").await.2;
    assert!(
        agent_text.contains("gov_agent_control_plane_connected 1\n"),
        "{agent_text}"
    );
    let govd_text = http_get(govd.metrics.unwrap(), "/metrics").await.2;
    for line in [
        "govd_agents{state=\"SYNCED\"} 2\n",
        "govd_applies_total{result=\"applied\"} 1\n",
        "govd_limits_engaged{rule=\"order/bursty\"} 1\n",
        "govd_config_nacks_total 0\n",
    ] {
        assert!(govd_text.contains(line), "missing {line:?} in\n{govd_text}");
    }
    assert!(
        !govd_text.contains("govd_config_answer_seconds_count 0\n"),
        "{govd_text}"
    );

    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"))
            .unwrap();
    // `| `name` | type | labels | when | what |`
    let documented: Vec<(String, String, bool)> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((
                name.to_owned(),
                cells.get(2)?.to_string(),
                cells.get(4)?.starts_with("always"),
            ))
        })
        .collect();
    for (binary, text, prefix) in [
        ("gov-agent", &agent_text, "gov_agent_"),
        ("govd", &govd_text, "govd_"),
    ] {
        let exported: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        for (name, kind) in &exported {
            assert!(
                documented.iter().any(|(n, k, _)| n == name && k == kind),
                "{binary} exports `{name}` ({kind}), which docs/metrics.md does not list with that type"
            );
        }
        for (name, _, always) in &documented {
            let ours = name.starts_with(prefix) || name.starts_with("process_");
            if *always && ours {
                assert!(
                    exported.iter().any(|(n, _)| n == name),
                    "docs/metrics.md says {binary} always exports `{name}`; it does not:\n{text}"
                );
            }
        }
    }
    order.stop().await;
    govd.stop().await;
}

/// A real Prometheus (Debian's `prometheus` package) scrapes an agent and govd,
/// and a PromQL query over its HTTP API sees the limit's rejections and govd's
/// engaged limit. Skipped, saying so, when `prometheus` is not installed
/// (`.ci/run` installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_agent_and_govd_and_sees_a_rejection() {
    if std::process::Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: `prometheus` is not installed (apt-get install prometheus)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .start()
        .await;
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let file = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", &file]).await;
    assert_eq!(applied.code, 0, "{}{}", applied.stdout, applied.stderr);
    let mut rejected = 0;
    for _ in 0..5 {
        if http_get(order.inbound, "/burst").await.0 == 429 {
            rejected += 1;
        }
    }
    assert!(rejected > 0);

    // Prometheus cannot report a port it chose: take a free one and hand it over.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             scrape_configs:\n\
             \x20 - job_name: gov\n\
             \x20   static_configs:\n\
             \x20     - targets: ['{}', '{}']\n",
            order.admin,
            govd.metrics.unwrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("prometheus.log");
    let _prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let api = SocketAddr::from(([127, 0, 0, 1], port));
    let query = async |q: &str| -> Option<f64> {
        let path = format!("/api/v1/query?query={}", percent_encode(q));
        let (status, _, body) = http_get(api, &path).await;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    wait_until(
        "Prometheus to see the agent's rejections and govd's limit",
        Duration::from_secs(60),
        async || {
            let rejections = query(
                "sum(gov_agent_rule_rejected_total{rule=\"order/bursty\",reason=\"limit_calls\"})",
            )
            .await;
            let engaged = query("govd_limits_engaged{rule=\"order/bursty\"}").await;
            rejections.is_some_and(|n| n >= 1.0) && engaged == Some(1.0)
        },
    )
    .await;
    order.stop().await;
    govd.stop().await;
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters kept).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_are_closed_and_connections_beyond_the_cap_wait_for_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .args(&["--max-connections", "2", "--handshake-timeout", "1s"])
        .start()
        .await;

    // Two sockets that never speak hold both slots, until the handshake
    // deadline closes them.
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(tokio::net::TcpStream::connect(govd.addr).await.unwrap());
    }
    for mut socket in idle {
        // govd's HTTP/2 settings come first; then the close.
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            while matches!(socket.read(&mut buf).await, Ok(1..)) {}
        })
        .await;
        assert!(
            closed.is_ok(),
            "govd must close a connection that says nothing"
        );
    }

    // Two clients with a watch each fill the cap; a third waits for a slot
    // and gets one when a watcher leaves.
    let watcher = || async {
        let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
            .await
            .unwrap();
        let mut stream = client
            .watch(as_viewer(pb::WatchRequest::default()))
            .await
            .unwrap()
            .into_inner();
        stream.message().await.unwrap().unwrap();
        (client, stream)
    };
    let first = watcher().await;
    let _second = watcher().await;
    wait_until("the cap is reported", Duration::from_secs(10), async || {
        read(&govd.log).contains("connection cap reached")
    })
    .await;
    let url = govd.url();
    let third = tokio::spawn(async move {
        let mut client = gov_control_plane::client::connect(&url, Duration::from_secs(30))
            .await
            .unwrap();
        client
            .status(as_viewer(pb::StatusRequest::default()))
            .await
            .map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served beyond the cap"
    );
    drop(first);
    tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a slot freed")
        .unwrap()
        .unwrap();
    govd.stop().await;
}
