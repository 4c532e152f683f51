//! `govc replay` against traffic a real agent recorded: bounded load through
//! a gov-agent (in process, its decision log at 100%) in front of a real
//! upstream on loopback, then the `govc` binary replays the log.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use gov_proto::decision_log::{Record, Verdict};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

/// P: a per-consumer limit, a fuse and a fail-fast bulkhead.
const P: &str = r#"
service order {
  consumer from header "x-gov-consumer"
  match api = path prefix "/api"
  match flaky = path prefix "/flaky"
  match slow = path prefix "/slow"
  limit per_consumer on api {
    calls 20 per 1s
    algorithm fixed window
    per consumer
  }
  fuse flaky_fuse on flaky {
    trip when business_error_ratio > 50% over 10s min_calls 10
    recover manual
  }
  bulkhead slow_calls on slow {
    max_concurrent 2
  }
}
"#;

/// An upstream: `/api/*` answers at once, `/flaky/err` with 500, `/slow/*`
/// after 20 ms.
async fn upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let path = req.uri().path().to_owned();
                        if path.starts_with("/slow") {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        let status = if path == "/flaky/err" { 500 } else { 200 };
                        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok\n")));
                        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                        Ok::<_, Infallible>(resp)
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn compile(policy: &str) -> gov_proto::v1::TargetConfig {
    let files = [gov_compiler::SourceFile::new("p.gov", policy.to_owned())];
    let compiled = gov_compiler::compile(&files)
        .map_err(|d| format!("{d:?}"))
        .unwrap();
    compiled.bundle.targets.into_iter().next().unwrap()
}

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn get(client: &Http, url: &str, consumer: &str) -> u16 {
    let req = Request::get(url)
        .header("x-gov-consumer", consumer)
        .body(Full::default())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
        .await
        .expect("answered within 5 s")
        .unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

fn govc(args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_govc"))
        .args(args)
        .env_remove("GOV_SERVICE")
        .env_remove("GOV_OUTPUT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "govc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rule<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report}"))
}

/// Rejections by consumer of `rule` in a replay report.
fn rejected_by_consumer(report: &Value, name: &str) -> BTreeMap<String, u64> {
    rule(report, name)["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["rejected"].as_u64().unwrap() > 0)
        .map(|c| {
            (
                c["consumer"].as_str().unwrap_or("").to_owned(),
                c["rejected"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Live rejections by consumer of `rule`, from the log itself.
fn live_rejected(records: &[Record], name: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for r in records {
        if r.rules
            .iter()
            .any(|d| d.rule == name && d.decision == Verdict::Rejected)
        {
            *out.entry(r.consumer.clone().unwrap_or_default())
                .or_default() += 1;
        }
    }
    out
}

async fn wait_for_lines(path: &Path, n: usize) -> Vec<Record> {
    for _ in 0..500 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n {
            return text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("fewer than {n} records in {}", path.display());
}

/// Traffic recorded under P and replayed against P gives the live decisions
/// of the limit and the fuse exactly, and of the bulkhead within the bound
/// stated below; replayed against a stricter P' it reports the extra
/// rejections by consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reproduces_the_live_decisions_and_shows_a_stricter_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (policy, stricter) = (dir.path().join("p.gov"), dir.path().join("strict.gov"));
    std::fs::write(&policy, P).unwrap();
    std::fs::write(&stricter, P.replace("calls 20 per 1s", "calls 10 per 1s")).unwrap();
    let config = dir.path().join("order.yaml");
    std::fs::write(&config, serde_yaml::to_string(&compile(P)).unwrap()).unwrap();
    let log = dir.path().join("order.jsonl");

    let up = upstream().await;
    let mut options = gov_agent::sidecar::Options::new("order", up.to_string().parse().unwrap());
    options.config = Some(config);
    options.decision_log = Some(gov_agent::decision_log::LogOptions::new(&log, "order-1"));
    let agent = gov_agent::sidecar::Sidecar::start(options).await.unwrap();
    let base = format!("http://{}", agent.inbound_addr());

    // The load, bounded in count (each call in time): 160 limited calls from
    // two consumers, 4 callers at once; 40 calls to the fail-fast bulkhead, 4
    // at once; 30 calls to the fuse, one after another on one connection (a
    // call's outcome reaches the fuse before the next call arrives).
    let pooled: Http = Client::builder(TokioExecutor::new()).build_http();
    let mut tasks = tokio::task::JoinSet::new();
    for (consumer, path) in [
        ("crm", "/api/a"),
        ("crm", "/api/b"),
        ("erp", "/api/a"),
        ("erp", "/api/b"),
    ] {
        let (client, url) = (pooled.clone(), format!("{base}{path}"));
        tasks.spawn(async move {
            for _ in 0..40 {
                get(&client, &url, consumer).await;
            }
        });
    }
    for n in 0..4 {
        let (client, url) = (pooled.clone(), format!("{base}/slow/{n}"));
        tasks.spawn(async move {
            for _ in 0..10 {
                get(&client, &url, "crm").await;
            }
        });
    }
    let one: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build_http();
    let mut fuse_statuses = Vec::new();
    for n in 0..30 {
        let path = if n % 3 == 0 {
            "/flaky/ok"
        } else {
            "/flaky/err"
        };
        fuse_statuses.push(get(&one, &format!("{base}{path}"), "erp").await);
    }
    while tasks.join_next().await.is_some() {}
    assert!(
        fuse_statuses.contains(&503),
        "the fuse tripped live: {fuse_statuses:?}"
    );

    let records = wait_for_lines(&log, 230).await;
    assert_eq!(records.len(), 230);
    let log_arg = log.to_str().unwrap();

    // Against P: limits and fuses exactly as live.
    let report = govc(&[
        "replay",
        policy.to_str().unwrap(),
        "--log",
        log_arg,
        "-o",
        "json",
    ]);
    let replay = &report["replay"];
    assert_eq!(report["calls"], 230);
    for name in ["order/per_consumer", "order/flaky_fuse"] {
        let live = live_rejected(&records, name);
        assert!(!live.is_empty(), "{name} rejected calls live");
        assert_eq!(rejected_by_consumer(replay, name), live, "{name}");
    }
    let trips: Vec<&Value> = rule(replay, "order/flaky_fuse")["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "fuse_tripped")
        .collect();
    assert_eq!(trips.len(), 1, "one trip (recover manual)");
    // The bulkhead within a stated bound: its rejections differ from the live
    // ones by at most 4 of the 40 calls (a permit freed a few microseconds
    // before or after a call's arrival, on a busy two-core machine).
    let live_bulkhead: u64 = live_rejected(&records, "order/slow_calls").values().sum();
    let replay_bulkhead = rule(replay, "order/slow_calls")["rejected"]
        .as_u64()
        .unwrap();
    assert!(
        live_bulkhead.abs_diff(replay_bulkhead) <= 4,
        "bulkhead: live {live_bulkhead}, replay {replay_bulkhead}"
    );
    // Calls decided otherwise than live are all the bulkhead's.
    let differ = replay["calls"].as_u64().unwrap() - replay["as_recorded"].as_u64().unwrap();
    assert!(differ <= 4, "{differ} calls decided otherwise");

    // Against a stricter P': the extra rejections, by consumer.
    let report = govc(&[
        "replay",
        stricter.to_str().unwrap(),
        "--log",
        log_arg,
        "--against",
        policy.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let strict = rejected_by_consumer(&report["replay"], "order/per_consumer");
    let before = rejected_by_consumer(&report["against"], "order/per_consumer");
    let extra: BTreeMap<String, u64> = report["change"]["extra_rejections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rule"] == "order/per_consumer")
        .map(|r| {
            (
                r["consumer"].as_str().unwrap().to_owned(),
                r["calls"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(extra.keys().collect::<Vec<_>>(), ["crm", "erp"]);
    for (consumer, n) in &extra {
        assert_eq!(strict[consumer] - before[consumer], *n, "{consumer}");
        assert!(*n > 0);
    }
    assert!(
        report["change"]["fewer_rejections"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // `govc suggest` over the same log: a proposal that compiles, with a
    // fail-fast bulkhead on the slow route, a limit per consumer and a fuse,
    // and whose replay rejects what it says: nothing the limit and the fuse
    // saw (the comments say the traffic seen would not trip or throttle).
    let proposed = dir.path().join("proposed.gov");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_govc"))
        .args(["suggest", "--log", log_arg, "--out"])
        .arg(&proposed)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Replayed over the same log"), "{stdout}");
    let text = std::fs::read_to_string(&proposed).unwrap();
    for rule in ["limit per_consumer on all", "fuse errors on all"] {
        assert!(text.contains(rule), "{rule} in\n{text}");
    }
    // P's own bulkhead (2, fail fast) rejected most /slow calls live, how
    // many depends on timing: /slow gets a bulkhead when 20 or more were
    // admitted, else the proposal says why it has none.
    assert!(
        text.contains("bulkhead slow_calls on slow")
            || text.contains("Not proposed: /slow: ")
                && text.contains("too few to size a bulkhead"),
        "{text}"
    );
    let report = govc(&[
        "replay",
        proposed.to_str().unwrap(),
        "--log",
        log_arg,
        "-o",
        "json",
    ]);
    let replay = &report["replay"];
    assert_eq!(rule(replay, "order/per_consumer")["rejected"], 0, "{text}");
    assert_eq!(rule(replay, "order/errors")["rejected"], 0, "{text}");
    assert!(
        rule(replay, "order/errors")["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["event"] != "fuse_tripped"),
        "{text}"
    );
    agent.shutdown();
}

fn govc_fails(args: &[&str]) -> String {
    // JSON diagnostics: one line each, not wrapped to a terminal's width.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_govc"))
        .args(args)
        .args(["--error-format", "json"])
        .env_remove("GOV_SERVICE")
        .env_remove("GOV_OUTPUT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?}");
    assert!(out.stdout.is_empty());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const LINE: &str = r#"{"v":1,"t_us":1000000,"service":"order","instance":"order-1","direction":"inbound","consumer":"crm","method":"GET","path":"/api/a","headers":[],"status":200,"outcome":"response","latency_us":10,"rules":[]}"#;

/// Bad input stops a replay with what is wrong and where, and prints no report.
#[test]
fn bad_logs_unknown_services_and_broken_policies_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.gov");
    std::fs::write(&policy, P).unwrap();
    let p = policy.to_str().unwrap();
    let log = dir.path().join("bad.jsonl");
    let (l, f) = (log.to_str().unwrap(), format!("{}", log.display()));

    std::fs::write(
        &log,
        format!("{LINE}\n{}\n", LINE.replace("1000000", "\"x\"")),
    )
    .unwrap();
    let err = govc_fails(&["replay", p, "--log", l]);
    assert!(
        err.contains(&format!(
            "{f}:2: not a decision log record: column 17: invalid type"
        )),
        "{err}"
    );

    std::fs::write(
        &log,
        format!("{LINE}\n{}\n", LINE.replace("\"GET\"", "\"G T\"")),
    )
    .unwrap();
    let err = govc_fails(&["replay", p, "--log", l]);
    assert!(
        err.contains(&format!(
            "{f}:2: not a decision log record: `G T` is not an HTTP method"
        )),
        "{err}"
    );

    std::fs::write(&log, LINE.replace("\"v\":1", "\"v\":2")).unwrap();
    let err = govc_fails(&["replay", p, "--log", l]);
    assert!(
        err.contains("format version 2, this govc reads version 1"),
        "{err}"
    );

    std::fs::write(&log, format!("{LINE}\n")).unwrap();
    let err = govc_fails(&["replay", p, "--log", l, "--service", "shop"]);
    assert!(err.contains("no service `shop` in the policy"), "{err}");
    std::fs::write(&log, LINE.replace("\"order\"", "\"shop\"")).unwrap();
    let err = govc_fails(&["replay", p, "--log", l]);
    assert!(
        err.contains("calls of service `shop`, which the policy does not define"),
        "{err}"
    );

    let broken = dir.path().join("broken.gov");
    std::fs::write(&broken, P.replace("calls 20 per 1s", "calls 0 per 1s")).unwrap();
    let err = govc_fails(&["replay", broken.to_str().unwrap(), "--log", l]);
    assert!(err.contains("must be greater than zero"), "{err}");
}

/// Times and waits at the end of `u64` (a hostile or damaged log) are
/// replayed without a panic: sums saturate.
#[test]
fn times_and_waits_at_the_end_of_u64_do_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.gov");
    std::fs::write(&policy, P).unwrap();
    let log = dir.path().join("calls.jsonl");
    let max = u64::MAX.to_string();
    let waited = r#""rules":[{"rule":"order/a","decision":"waited","wait_us":M},{"rule":"order/b","decision":"waited","wait_us":M}]"#
        .replace('M', &max);
    let lines = [
        LINE.replace("1000000", "1"),
        LINE.replace("\"latency_us\":10", &format!("\"latency_us\":{max}")),
        LINE.replace("\"rules\":[]", &waited),
        LINE.replace("1000000", &max)
            .replace("\"latency_us\":10", &format!("\"latency_us\":{max}")),
    ];
    std::fs::write(&log, lines.join("\n")).unwrap();
    let report = govc(&[
        "replay",
        policy.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(report["calls"], 4);
    assert_eq!(report["from_us"], 1);
    assert_eq!(report["to_us"].as_u64(), Some(u64::MAX));

    // The same calls under an adaptive bulkhead: its timeline saturates too.
    std::fs::write(
        &policy,
        "service order {\n  match api = path prefix \"/api\"\n  bulkhead b on api {\n    max_concurrent adaptive min 1 max 4\n  }\n}\n",
    )
    .unwrap();
    let report = govc(&[
        "replay",
        policy.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let t = &rule(&report["replay"], "order/b")["limit"][0];
    assert_eq!(t["moves"][0]["limit"], 1);
    assert!(t["intervals"].as_array().unwrap().len() <= 121);
}

/// A log whose calls no rule rejected live (nothing in it names a rule),
/// replayed against a limit: the first 20 calls of the window are admitted,
/// the other 10 rejected, and the report says so per rule and consumer.
#[test]
fn a_policy_the_log_never_saw_is_replayed_by_its_own_rule_names() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.gov");
    std::fs::write(&policy, P).unwrap();
    let log = dir.path().join("calls.jsonl");
    let lines: Vec<String> = (0..30)
        .map(|k| LINE.replace("1000000", &(1_000_000 + k * 1000).to_string()))
        .collect();
    std::fs::write(&log, lines.join("\n")).unwrap();
    let report = govc(&[
        "replay",
        policy.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let limit = rule(&report["replay"], "order/per_consumer");
    assert_eq!(
        (limit["matched"].as_u64(), limit["admitted"].as_u64()),
        (Some(30), Some(20))
    );
    assert_eq!(
        rejected_by_consumer(&report["replay"], "order/per_consumer")["crm"],
        10
    );
    assert_eq!(report["replay"]["as_recorded"], 20);
}

/// An adaptive bulkhead replayed on recorded latencies moves as it would
/// have live: an upstream at 100 ms with 30 calls in flight, then at 400 ms
/// for 10 s, then at 100 ms again. The limit grows from `min` to `max`,
/// falls with the slow calls (the rejections rise), and grows back after
/// the upstream heals; the report has every move and, per second, the
/// limit's range and the rule's calls. A fixed bulkhead has no timeline.
#[test]
fn an_adaptive_bulkhead_replayed_moves_with_the_recorded_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.gov");
    std::fs::write(
        &policy,
        r#"
service reports {
  capacity workers 20
  match slow_io = path prefix "/io"
  bulkhead io_calls on slow_io {
    max_concurrent adaptive min 2 max 20
  }
}
"#,
    )
    .unwrap();
    let log = dir.path().join("calls.jsonl");
    let t0: u64 = 1_700_000_000_000_000;
    let lines: Vec<String> = (0..9000u64)
        .map(|k| {
            // 300 calls/s for 30 s.
            let t = k * 1_000_000 / 300;
            let latency = if (10_000_000..20_000_000).contains(&t) {
                400_000
            } else {
                100_000
            };
            LINE.replace("1000000", &(t0 + t).to_string())
                .replace("\"order\"", "\"reports\"")
                .replace("order-1", "reports-1")
                .replace("/api/a", "/io/x")
                .replace("\"latency_us\":10", &format!("\"latency_us\":{latency}"))
        })
        .collect();
    std::fs::write(&log, lines.join("\n")).unwrap();
    let (p, l) = (policy.to_str().unwrap(), log.to_str().unwrap());
    let report = govc(&["replay", p, "--log", l, "-o", "json"]);
    let io = rule(&report["replay"], "reports/io_calls");
    let t = &io["limit"][0];
    assert_eq!(t["instance"], "reports-1");
    let moves = t["moves"].as_array().unwrap();
    assert_eq!(
        moves[0]["limit"], 2,
        "a new adaptive bulkhead starts at min"
    );
    assert_eq!(
        moves.last().unwrap()["limit"],
        20,
        "back at max once healed"
    );
    let limit_at = |at_us: u64| {
        moves
            .iter()
            .take_while(|m| m["at_us"].as_u64().unwrap() <= at_us)
            .last()
            .unwrap()["limit"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(limit_at(t0 + 9_900_000), 20, "grew to max while healthy");
    assert!(limit_at(t0 + 19_900_000) <= 4, "fell with the slow calls");
    assert!(
        moves
            .iter()
            .all(|m| (2..=20).contains(&m["limit"].as_u64().unwrap())),
        "within min..max"
    );
    let intervals = t["intervals"].as_array().unwrap();
    assert_eq!(t["interval_us"], 1_000_000);
    assert!((30..=32).contains(&intervals.len()), "{}", intervals.len());
    let sum = |key: &str, from: usize, to: usize| -> u64 {
        intervals[from..to]
            .iter()
            .map(|i| i[key].as_u64().unwrap())
            .sum()
    };
    assert_eq!(sum("admitted", 0, intervals.len()), io["admitted"]);
    assert_eq!(sum("rejected", 0, intervals.len()), io["rejected"]);
    // 300/s offered: at 20 x 100 ms about 200/s admitted; at 2 x 400 ms, 5/s.
    assert!(sum("admitted", 5, 10) > 900, "{intervals:?}");
    assert!(sum("admitted", 15, 20) < 100, "{intervals:?}");
    assert!(sum("admitted", 25, 30) > 900, "recovered: {intervals:?}");

    let text = std::process::Command::new(env!("CARGO_BIN_EXE_govc"))
        .args(["replay", p, "--log", l])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("limit on reports-1:") && text.contains("per 1s from"),
        "{text}"
    );

    // A fixed bulkhead: no limit over time.
    let fixed = dir.path().join("fixed.gov");
    std::fs::write(
        &fixed,
        std::fs::read_to_string(&policy)
            .unwrap()
            .replace("adaptive min 2 max 20", "20"),
    )
    .unwrap();
    let report = govc(&["replay", fixed.to_str().unwrap(), "--log", l, "-o", "json"]);
    assert!(rule(&report["replay"], "reports/io_calls")["limit"].is_null());
}

/// A fuse counts an outcome at the response head, while the body may stream
/// for long after: a replay counts it at the record's `outcome_us`, so a
/// call arriving between a trip and the end of the call that tripped it is
/// rejected as it was live. Without `outcome_us` (an older agent's log) the
/// outcome counts at the end, and that call is admitted.
#[test]
fn a_replay_counts_outcomes_when_the_agent_did_not_when_the_body_ended() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.gov");
    std::fs::write(&policy, P).unwrap();
    let t0: u64 = 1_700_000_000_000_000;
    // Ten failing calls 1 ms apart, each answered in 50 us and streaming
    // its body for 5 ms: the tenth trips the fuse (min_calls 10) at once.
    let failed = |k: u64| {
        LINE.replace("1000000", &(t0 + k * 1_000).to_string())
            .replace("\"crm\"", "\"erp\"")
            .replace("/api/a", "/flaky/err")
            .replace("\"status\":200", "\"status\":500")
            .replace("\"latency_us\":10", "\"latency_us\":5000,\"outcome_us\":50")
    };
    // Then, 100 us after the trip, a call the live fuse rejected.
    let rejected = LINE
        .replace("1000000", &(t0 + 9_000 + 150).to_string())
        .replace("\"crm\"", "\"erp\"")
        .replace("/api/a", "/flaky/ok")
        .replace("\"status\":200", "\"status\":503")
        .replace("\"response\"", "\"rejected\"")
        .replace(
            "\"rules\":[]",
            r#""rules":[{"rule":"order/flaky_fuse","decision":"rejected","reason":"fuse_open"}]"#,
        );
    let mut lines: Vec<String> = (0..10).map(failed).collect();
    lines.push(rejected);
    let p = policy.to_str().unwrap();
    let replayed = |lines: &[String]| {
        let log = dir.path().join("calls.jsonl");
        std::fs::write(&log, lines.join("\n")).unwrap();
        let report = govc(&["replay", p, "--log", log.to_str().unwrap(), "-o", "json"]);
        rejected_by_consumer(&report["replay"], "order/flaky_fuse")
    };
    assert_eq!(
        replayed(&lines),
        BTreeMap::from([("erp".to_owned(), 1)]),
        "rejected as live"
    );
    let older: Vec<String> = lines
        .iter()
        .map(|l| l.replace(",\"outcome_us\":50", ""))
        .collect();
    assert_eq!(
        replayed(&older),
        BTreeMap::new(),
        "counted at the end, the outcomes come after the call"
    );
}
