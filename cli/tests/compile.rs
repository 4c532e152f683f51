//! `govc compile`, `govc plan` and the compiler inside `govc check`, run as
//! a real process on real files.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

fn govc() -> Command {
    let mut cmd = Command::cargo_bin("govc").unwrap();
    cmd.env("NO_COLOR", "1")
        .env_remove("GOV_OUTPUT")
        .env_remove("GOV_SERVICE");
    cmd
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../compiler/tests/fixtures")
        .join(name)
}

/// `shop.gov` with one number changed, in a temporary directory.
fn changed_shop(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(example("shop.gov")).unwrap();
    assert_eq!(text.matches("max_concurrent 10\n").count(), 1);
    let path = dir.join("shop.gov");
    std::fs::write(
        &path,
        text.replace("max_concurrent 10\n", "max_concurrent 20\n"),
    )
    .unwrap();
    path
}

#[test]
fn compile_prints_deterministic_yaml() {
    let first = govc()
        .arg("compile")
        .arg(example("shop.gov"))
        .assert()
        .success();
    let first = String::from_utf8(first.get_output().stdout.clone()).unwrap();
    let again = govc()
        .arg("compile")
        .arg(example("shop.gov"))
        .assert()
        .success();
    assert_eq!(
        first,
        String::from_utf8(again.get_output().stdout.clone()).unwrap()
    );
    let yaml: serde_yaml::Value = serde_yaml::from_str(&first).unwrap();
    let services: Vec<&str> = yaml["targets"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|t| t["service"].as_str().unwrap())
        .collect();
    assert_eq!(services, ["inventory", "order"]);
    assert!(first.contains("name: order/slow_calls"));
    assert!(first.contains("mode: MODE_ENFORCE"));
    assert!(first.contains("reject_status: 408"));
}

#[test]
fn compile_one_service_as_json() {
    let out = govc()
        .args(["compile", "--service", "order", "-o", "json"])
        .arg(example("shop.gov"))
        .assert()
        .success();
    let json: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(json["service"], "order");
    assert_eq!(json["rules"][0]["name"], "order/slow_calls");
    assert_eq!(json["rules"][0]["bulkhead"]["max_concurrent"], 10);
    assert_eq!(json["version"].as_str().unwrap().len(), 16);
}

#[test]
fn compile_an_unknown_service_fails_and_lists_the_known_ones() {
    govc()
        .args(["compile", "--service", "ordr"])
        .arg(example("shop.gov"))
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::contains("no service `ordr` in the policy"))
        .stderr(predicate::str::contains("`inventory`, `order`"));
}

#[test]
fn compile_reports_errors_like_check_and_prints_nothing() {
    govc()
        .arg("compile")
        .arg(fixture("unknown-match.gov"))
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::contains("gov::unknown-match"))
        .stderr(predicate::str::contains("did you mean `supplier`?"))
        .stderr(predicate::str::contains("unknown-match.gov:6:16"));
}

#[test]
fn compile_prints_warnings_and_succeeds_unless_denied() {
    govc()
        .arg("compile")
        .arg(fixture("bulkhead-over-workers.gov"))
        .assert()
        .success()
        .stdout(predicate::str::contains("max_concurrent: 50"))
        .stderr(predicate::str::contains("gov::lint::bulkhead-over-workers"));
    govc()
        .args(["compile", "--deny-warnings"])
        .arg(fixture("bulkhead-over-workers.gov"))
        .assert()
        .code(1)
        .stdout("");
}

#[test]
fn plan_without_changes() {
    govc()
        .args(["plan", "--detailed-exitcode"])
        .arg(example("shop.gov"))
        .arg("--against")
        .arg(example("shop.gov"))
        .assert()
        .code(0)
        .stdout(predicate::str::starts_with("No changes"));
}

#[test]
fn plan_shows_exactly_the_changed_number() {
    let dir = tempfile::tempdir().unwrap();
    let new = changed_shop(dir.path());
    let out = govc()
        .args(["plan", "--detailed-exitcode"])
        .arg(example("shop.gov"))
        .arg("--against")
        .arg(&new)
        .assert()
        .code(2);
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    insta::assert_snapshot!(stdout, @r"
    ~ service order
      ~ bulkhead order/slow_calls: max_concurrent 10 -> 20

    Plan: 0 service(s) to add, 1 to change, 0 to remove.
    ");
    // Without --detailed-exitcode, changes are a success.
    govc()
        .arg("plan")
        .arg(example("shop.gov"))
        .arg("--against")
        .arg(&new)
        .assert()
        .code(0);
}

#[test]
fn plan_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let new = changed_shop(dir.path());
    let out = govc()
        .args(["plan", "-o", "json"])
        .arg(example("shop.gov"))
        .arg("--against")
        .arg(&new)
        .assert()
        .success();
    let json: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let order = &json["services"][1];
    assert_eq!(order["service"], "order");
    assert_eq!(order["change"], "changed");
    assert_eq!(order["rules"][0]["rule"], "order/slow_calls");
    assert_eq!(order["rules"][0]["fields"][0]["old"], "10");
    assert_eq!(order["rules"][0]["fields"][0]["new"], "20");
    assert_eq!(json["services"][0]["change"], "unchanged");
}

#[test]
fn plan_of_an_invalid_policy_is_an_error() {
    govc()
        .args(["plan", "--detailed-exitcode"])
        .arg(example("shop.gov"))
        .arg("--against")
        .arg(fixture("match-cycle.gov"))
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::contains("gov::match-cycle"));
}

#[test]
fn plan_without_new_files_is_a_usage_error() {
    govc()
        .args(["plan", "--against"])
        .arg(example("shop.gov"))
        .assert()
        .code(64);
}

#[test]
fn check_runs_the_compiler() {
    govc()
        .arg("check")
        .arg(fixture("conflicting-rules.gov"))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("gov::conflicting-rules"));
    govc()
        .arg("check")
        .arg(fixture("shutdown-wait.gov"))
        .assert()
        .code(0)
        .stderr(predicate::str::contains("gov::lint::shutdown-wait"));
    govc()
        .args(["check", "--deny-warnings"])
        .arg(fixture("shutdown-wait.gov"))
        .assert()
        .code(1);
}

#[test]
fn check_sees_the_files_as_one_policy_unless_each() {
    // The same service in two files: one policy, a duplicate.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(example("shop.gov")).unwrap();
    let both = [dir.path().join("a.gov"), dir.path().join("b.gov")];
    for path in &both {
        std::fs::write(path, &text).unwrap();
    }
    govc()
        .arg("check")
        .args(&both)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("gov::duplicate-service"))
        .stderr(predicate::str::contains("first defined here"));
    govc()
        .args(["check", "--each"])
        .args(&both)
        .assert()
        .code(0);
}

#[test]
fn every_example_together_is_one_valid_policy() {
    let mut examples: Vec<PathBuf> = std::fs::read_dir(example(""))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gov"))
        .collect();
    examples.sort();
    govc()
        .arg("check")
        .args(&examples)
        .assert()
        .code(0)
        .stderr("");
    govc()
        .arg("compile")
        .args(&examples)
        .assert()
        .code(0)
        .stderr("");
}

#[test]
fn compile_output_does_not_depend_on_file_order_or_layout() {
    // shop.gov split in two files (registry + order, inventory), given in
    // both orders, one of them re-indented.
    let text = std::fs::read_to_string(example("shop.gov")).unwrap();
    let at = text.find("\nservice inventory").unwrap();
    let (head, tail) = text.split_at(at + 1);
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gov"), dir.path().join("b.gov"));
    std::fs::write(&a, head).unwrap();
    std::fs::write(&b, tail.replace("\n  ", "\n      ")).unwrap();
    let yaml = |files: [&PathBuf; 2]| {
        let out = govc().arg("compile").args(files).assert().success();
        let v: serde_yaml::Value = serde_yaml::from_slice(&out.get_output().stdout).unwrap();
        let versions: Vec<(String, String)> = v["targets"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["service"].as_str().unwrap().to_owned(),
                    t["version"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        (versions, v["version"].as_str().unwrap().to_owned())
    };
    let whole = govc()
        .arg("compile")
        .arg(example("shop.gov"))
        .assert()
        .success();
    let whole: serde_yaml::Value = serde_yaml::from_slice(&whole.get_output().stdout).unwrap();
    let (ab, ab_version) = yaml([&a, &b]);
    let (ba, ba_version) = yaml([&b, &a]);
    assert_eq!(ab, ba);
    assert_eq!(ab_version, ba_version);
    assert_eq!(ab_version, whole["version"].as_str().unwrap());
}

#[test]
fn compile_errors_as_json_lines() {
    let out = govc()
        .args(["compile", "--error-format", "json"])
        .arg(fixture("unknown-service.gov"))
        .assert()
        .code(1);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert_eq!(lines[0]["code"], "gov::unknown-service");
    assert_eq!(lines[0]["severity"], "error");
    assert_eq!(lines[0]["help"], "did you mean `inventory`?");
    let text = std::fs::read_to_string(fixture("unknown-service.gov")).unwrap();
    let offset = text.find("inventroy").unwrap();
    assert_eq!(lines[0]["labels"][0]["span"]["offset"], offset);
    assert_eq!(lines[0]["labels"][0]["span"]["length"], "inventroy".len());
}

/// `queue 0` means no call waits: the compiled config says so on the wire, and
/// the engine rejects a call that finds no permit at once, even with a
/// `max_wait` (before, 0 meant "no bound" and the call queued for 50 ms).
#[test]
fn queue_0_compiles_to_no_waiting_and_the_engine_rejects_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("queue0.gov");
    std::fs::write(
        &policy,
        "service order {\n  match slow = path prefix \"/slow\"\n  bulkhead slow_calls on slow {\n    max_concurrent 1\n    max_wait 50ms\n    queue 0\n  }\n}\n",
    )
    .unwrap();
    let out = govc()
        .args(["compile", "--service", "order"])
        .arg(&policy)
        .assert()
        .success();
    let yaml = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(yaml.contains("max_queue: 0"), "{yaml}");
    let target: gov_proto::v1::TargetConfig = serde_yaml::from_str(&yaml).unwrap();

    let engine = gov_engine::Engine::empty("order");
    engine.apply_target(&target).unwrap();
    let headers = http::HeaderMap::new();
    let get = http::Method::GET;
    let info = gov_engine::RequestInfo::inbound(&get, "/slow/1", &headers);
    let held = match engine.try_admit(&info) {
        gov_engine::Decision::Admitted(a) => a,
        other => panic!("the first call takes the permit: {other:?}"),
    };
    match engine.try_admit(&info) {
        gov_engine::Decision::Rejected(r) => {
            assert_eq!(r.reason, gov_engine::RejectReason::BulkheadFull);
        }
        other => panic!("the second call must not wait: {other:?}"),
    }
    drop(held);
}
