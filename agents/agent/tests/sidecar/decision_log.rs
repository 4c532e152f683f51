//! The decision log (`--decision-log`): a line per call on both proxy paths,
//! size rotation, records dropped (never a call held) when the writer is
//! behind, a disk that fails, and hostile header values kept valid JSON.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use gov_agent::decision_log::{LogOptions, rotated_path};
use gov_proto::decision_log::{Outcome, Record, Verdict};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::h1::Wire;
use crate::support::{Agent, http, upstream};

const LIMITED: &str = r#"
service: shop
version: log-v1
consumer_header: x-gov-consumer
rules:
  - name: shop/per_consumer
    on:
      and:
        exprs:
          - path: { kind: PATH_KIND_PREFIX, value: /limited }
          - header: { name: x-tenant, value: blue }
    limit:
      calls: { amount: 2, window_ms: 60000 }
      key: LIMIT_KEY_CONSUMER
"#;

/// Waits (bounded) until the agent has written `n` records.
async fn wait_written(agent: &Agent, n: u64) {
    let mut written = 0;
    for _ in 0..500 {
        written = metric(agent, "gov_agent_decision_log_written_total").await;
        if written >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{written} of {n} records written");
}

/// The records of `path` and its rotated files, by arrival (`t_us`): a
/// file holds them in the order the calls ended, and a call's record is
/// handed to the writer after its response went out, so two sequential calls
/// may land in either order.
fn records(path: &Path) -> Vec<Record> {
    let mut records = records_as_written(path);
    records.sort_by_key(|r| r.t_us);
    records
}

/// The records of `path` and its rotated files, oldest file first.
fn records_as_written(path: &Path) -> Vec<Record> {
    let mut files: Vec<_> = (1..10)
        .rev()
        .map(|i| rotated_path(path, i))
        .filter(|p| p.exists())
        .collect();
    files.push(path.to_owned());
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Record>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect::<Vec<_>>()
        })
        .collect()
}

async fn metric(agent: &Agent, name: &str) -> u64 {
    let text = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_paths_log_each_call_with_what_each_rule_decided() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let up = upstream()
        .sized("/limited/1", 100)
        .sized("/limited/2", 100)
        .sized("/free", 7)
        .start()
        .await;
    let agent = crate::support::agent()
        .config(LIMITED)
        .upstream(&up)
        .decision_log(LogOptions::new(&path, "shop-1"))
        .start()
        .await;

    // HTTP/1 (the agent's own path): two admitted, the third rejected.
    let client = http();
    let h = [("x-gov-consumer", "crm"), ("x-tenant", "blue")];
    for expected in [200, 200, 429] {
        let reply = client.get_with(&agent.url("/limited/1"), &h).await.unwrap();
        assert_eq!(reply.status, expected);
    }
    // HTTP/2 (hyper's path): another consumer, then an unmatched call.
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    for (uri, expected) in [("/limited/2", 200), ("/free", 200)] {
        let req = Request::get(agent.url(uri))
            .header("x-gov-consumer", "erp")
            .header("x-tenant", "blue")
            .body(Full::default())
            .unwrap();
        let resp = h2.request(req).await.unwrap();
        assert_eq!(resp.status(), expected);
        resp.into_body().collect().await.unwrap();
    }

    wait_written(&agent, 5).await;
    let got = records(&path);
    assert_eq!(got.len(), 5, "{got:#?}");
    let first = &got[0];
    assert_eq!(
        (
            &*first.service,
            &*first.instance,
            &*first.method,
            &*first.path
        ),
        ("shop", "shop-1", "GET", "/limited/1")
    );
    assert_eq!(first.consumer.as_deref(), Some("crm"));
    assert_eq!(first.headers, [("x-tenant".to_owned(), "blue".to_owned())]);
    assert_eq!(
        (first.status, first.outcome),
        (Some(200), Outcome::Response)
    );
    assert_eq!(first.response_bytes, Some(100));
    assert_eq!(first.request_bytes, Some(0));
    assert_eq!(first.config, "log-v1");
    assert_eq!(first.rules[0].rule, "shop/per_consumer");
    assert_eq!(first.rules[0].decision, Verdict::Admitted);
    assert_eq!(first.epochs.len(), 1, "the first record has the epochs");
    assert!(first.epochs[0].t_us <= first.t_us);
    assert!(got[1].epochs.is_empty(), "once per file and config");

    // Each admitted call's outcome was counted at its response head, on
    // both paths: at most its end; a rejected one has none.
    for admitted in [&got[0], &got[1], &got[3]] {
        let at = admitted.outcome_us.expect("an outcome time");
        assert!(at <= admitted.latency_us, "{admitted:?}");
    }
    assert_eq!(got[2].outcome_us, None);

    let rejected = &got[2];
    assert_eq!(
        (rejected.status, rejected.outcome),
        (Some(429), Outcome::Rejected)
    );
    assert_eq!(rejected.rules[0].decision, Verdict::Rejected);
    assert_eq!(rejected.rules[0].reason.as_deref(), Some("limit_calls"));

    let h2_call = &got[3];
    assert_eq!(h2_call.consumer.as_deref(), Some("erp"));
    assert_eq!(
        (h2_call.status, h2_call.response_bytes),
        (Some(200), Some(100))
    );
    let free = &got[4];
    assert!(free.rules.is_empty() && free.config.is_empty(), "{free:?}");
    assert_eq!(free.response_bytes, Some(7));
    assert_eq!(
        metric(&agent, "gov_agent_decision_log_dropped_total").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_rotates_by_size_keeping_n_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let up = upstream().sized("/free", 1).start().await;
    let mut options = LogOptions::new(&path, "shop-1");
    options.max_bytes = 2048;
    options.keep = 2;
    let agent = crate::support::agent()
        .config(LIMITED)
        .upstream(&up)
        .decision_log(options)
        .start()
        .await;
    let client = http();
    for _ in 0..60 {
        assert_eq!(client.get(&agent.url("/free")).await.unwrap().status, 200);
    }
    wait_written(&agent, 60).await;
    assert!(metric(&agent, "gov_agent_decision_log_rotations_total").await >= 2);
    assert!(rotated_path(&path, 1).exists() && rotated_path(&path, 2).exists());
    assert!(
        !rotated_path(&path, 3).exists(),
        "only 2 rotated files are kept"
    );
    for file in [path.clone(), rotated_path(&path, 1), rotated_path(&path, 2)] {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.len() <= 2048,
            "{} has {} bytes",
            file.display(),
            text.len()
        );
        for line in text.lines() {
            serde_json::from_str::<Record>(line).unwrap();
        }
    }
    // The newest record is in the current file, with its path.
    let current = std::fs::read_to_string(&path).unwrap();
    let last: Record = serde_json::from_str(current.lines().last().unwrap()).unwrap();
    assert_eq!(last.path, "/free");
}

/// A FIFO nobody reads: the writer blocks opening it, its queue fills, and
/// every call still goes through at once while the records are counted as
/// dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_writer_drops_records_and_never_holds_a_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stuck.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    let up = upstream().sized("/free", 1).start().await;
    let mut options = LogOptions::new(&path, "shop-1");
    options.queue = 4;
    let agent = crate::support::agent()
        .config(LIMITED)
        .upstream(&up)
        .decision_log(options)
        .start()
        .await;
    let client = http();
    for _ in 0..40 {
        let reply = tokio::time::timeout(Duration::from_secs(5), client.get(&agent.url("/free")))
            .await
            .expect("a call is never held by the log")
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK);
    }
    // One record may be in the writer's hands, `queue` in the channel.
    let dropped = metric(&agent, "gov_agent_decision_log_dropped_total").await;
    assert!((35..=40).contains(&dropped), "dropped {dropped}");
    assert_eq!(
        metric(&agent, "gov_agent_decision_log_written_total").await,
        0
    );
    // Unblock the writer so that its thread ends with the test.
    let reader = std::thread::spawn(move || std::fs::read(&path).map(|b| b.len()));
    drop(agent);
    let _ = reader;
}

/// A disk that is full: every write fails. The calls are served, the failed
/// records counted, and the agent keeps trying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_counts_errors_and_fails_no_call() {
    let up = upstream().sized("/free", 1).start().await;
    let agent = crate::support::agent()
        .config(LIMITED)
        .upstream(&up)
        .decision_log(LogOptions::new("/dev/full", "shop-1"))
        .start()
        .await;
    let client = http();
    for _ in 0..20 {
        assert_eq!(client.get(&agent.url("/free")).await.unwrap().status, 200);
    }
    let mut errors = 0;
    for _ in 0..500 {
        errors = metric(&agent, "gov_agent_decision_log_write_errors_total").await;
        if errors >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Each buffered record fails at its flush; the file is reopened for the next.
    assert_eq!(errors, 20);
    assert_eq!(
        metric(&agent, "gov_agent_decision_log_written_total").await,
        0
    );
    assert_eq!(
        metric(&agent, "gov_agent_decision_log_dropped_total").await,
        0
    );
}

/// Values a client controls (the consumer, a matched header, the path) land
/// escaped; a value that is not visible ASCII is left out, never mangled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_header_values_land_escaped_as_valid_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let up = upstream().sized("/limited/x", 1).start().await;
    let agent = crate::support::agent()
        .config(LIMITED)
        .upstream(&up)
        .decision_log(LogOptions::new(&path, "shop-1"))
        .start()
        .await;
    let requests: [&[u8]; 3] = [
        b"GET /limited/x HTTP/1.1\r\nhost: x\r\nx-gov-consumer: a\"b\\c\t}{\r\nx-tenant: blue\r\n\r\n",
        b"GET /limited/%22%0A HTTP/1.1\r\nhost: x\r\nx-gov-consumer: \xff\xfe\r\nx-tenant: \"\\\r\n\r\n",
        b"GET /limited/x HTTP/1.1\r\nhost: x\r\nx-gov-consumer: <script>\\u0000\r\nx-tenant: blue\r\n\r\n",
    ];
    for request in requests {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(request).await;
        assert_ne!(wire.response().await.status, 400, "{request:?}");
    }
    wait_written(&agent, 3).await;
    let got = records(&path);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].consumer.as_deref(), Some("a\"b\\c\t}{"));
    assert_eq!(got[1].consumer, None, "not visible ASCII: left out");
    assert_eq!(got[1].headers, [("x-tenant".to_owned(), "\"\\".to_owned())]);
    assert_eq!(got[1].path, "/limited/%22%0A");
    assert_eq!(got[2].consumer.as_deref(), Some("<script>\\u0000"));
    // Each line is one JSON object (no raw control byte split a line).
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert!(!text.contains('\t'), "the tab is escaped");
}

/// A shadow rule's would-be rejections are in the record's `shadow` list,
/// on admitted calls and on calls another rule rejected, and never in its
/// `rules` as a rejection (the call was not refused for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_rules_that_would_reject_are_logged_beside_the_decision() {
    const SHADOWED: &str = r#"
service: shop
version: log-shadow
consumer_header: x-gov-consumer
rules:
  - name: shop/new_limit
    mode: MODE_SHADOW
    on: { path: { kind: PATH_KIND_PREFIX, value: /api } }
    limit:
      calls: { amount: 1, window_ms: 60000 }
      key: LIMIT_KEY_ALL
  - name: shop/old_limit
    on: { path: { kind: PATH_KIND_PREFIX, value: /api } }
    limit:
      calls: { amount: 2, window_ms: 60000 }
      key: LIMIT_KEY_ALL
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let up = upstream().sized("/api/x", 10).start().await;
    let agent = crate::support::agent()
        .config(SHADOWED)
        .upstream(&up)
        .decision_log(LogOptions::new(&path, "shop-1"))
        .start()
        .await;
    let client = http();
    for expected in [200, 200, 429] {
        let reply = client.get_with(&agent.url("/api/x"), &[]).await.unwrap();
        assert_eq!(reply.status, expected);
    }
    wait_written(&agent, 3).await;
    let got = records(&path);
    assert_eq!(got.len(), 3, "{got:#?}");
    let shadow = |r: &Record| -> Vec<(String, String)> {
        r.shadow
            .iter()
            .map(|s| (s.rule.clone(), s.reason.clone()))
            .collect()
    };
    let would = vec![("shop/new_limit".to_owned(), "limit_calls".to_owned())];
    assert!(shadow(&got[0]).is_empty(), "{:?}", got[0]);
    assert_eq!(shadow(&got[1]), would, "admitted, the shadow limit spent");
    assert_eq!(got[1].status, Some(200));
    assert_eq!(shadow(&got[2]), would, "rejected by the other rule");
    assert_eq!(
        (got[2].outcome, got[2].rules[0].rule.as_str()),
        (Outcome::Rejected, "shop/old_limit")
    );
    assert!(
        got.iter()
            .flat_map(|r| &r.rules)
            .all(|d| d.rule != "shop/new_limit" || d.decision != Verdict::Rejected),
        "a shadow rule never rejects: {got:#?}"
    );
}
