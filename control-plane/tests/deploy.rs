//! `deploy/` against the code: the Kubernetes example's grace period covers its
//! policy's shutdown, the Prometheus rules pass `promtool`, and every metric the
//! rules and the Grafana dashboard query is one docs/metrics.md lists (which
//! e2e `docs_metrics_lists_every_family_both_binaries_export` checks against
//! the binaries). The flags in `deploy/` are checked by each binary's own
//! parser (`deploy_invocations_parse` in `govd` and `gov-agent`).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use gov_proto::v1 as pb;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The longest the agent can take for `steps`: waits and drains as written,
/// `wait for gov` at its bound, each action at the agent's action timeout.
fn worst_case(steps: &[pb::ShutdownStep]) -> Duration {
    use pb::shutdown_step::Step;
    steps
        .iter()
        .filter_map(|s| s.step.as_ref())
        .map(|step| match step {
            Step::Deregister(_) => Duration::ZERO,
            Step::Wait(w) => Duration::from_millis(w.duration_ms),
            Step::WaitForGov(w) => Duration::from_millis(w.timeout_ms),
            Step::Stop(_) => gov_agent::lifecycle::ACTION_TIMEOUT,
            Step::DrainMs(ms) => Duration::from_millis(*ms),
        })
        .sum()
}

#[test]
fn the_kubernetes_example_gives_its_shutdown_enough_time() {
    let policy = "examples/scale-with-gov.gov";
    let compiled = gov_compiler::compile(&[gov_compiler::SourceFile::new(policy, read(policy))])
        .unwrap_or_else(|e| panic!("{policy}: {e:?}"));
    let stock = compiled
        .bundle
        .targets
        .iter()
        .find(|t| t.service == "stock")
        .unwrap();
    let steps = &stock.shutdown.as_ref().unwrap().steps;
    let needed = worst_case(steps);
    assert!(
        needed > Duration::from_secs(30),
        "{needed:?}: more than the default grace"
    );

    let text = read("deploy/kubernetes/stock.yaml");
    let mut grace = None;
    let mut pre_stop = false;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
        if v["kind"] != "Deployment" {
            continue;
        }
        let spec = &v["spec"]["template"]["spec"];
        grace = spec["terminationGracePeriodSeconds"].as_u64();
        let sidecar = &spec["initContainers"][0];
        assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
        assert_eq!(sidecar["readinessProbe"]["httpGet"]["path"], "/ready");
        let hook = serde_yaml::to_string(&spec["containers"][0]["lifecycle"]["preStop"]).unwrap();
        pre_stop = hook.contains("/terminate") && hook.contains("/live");
    }
    let grace = Duration::from_secs(grace.expect("terminationGracePeriodSeconds"));
    assert!(
        grace >= needed + Duration::from_secs(5),
        "terminationGracePeriodSeconds {grace:?} < {needed:?} of shutdown steps + 5 s"
    );
    assert!(
        pre_stop,
        "the app's preStop runs the agent's steps and waits for them"
    );
}

/// Metric names in PromQL text: `gov_agent_...` and `govd_...`, without the
/// histogram suffixes.
fn metrics_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let starts = (rest.starts_with("gov_agent_") || rest.starts_with("govd_"))
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if starts {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..len];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.push(family.to_owned());
            i += len;
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn alerts_and_dashboard_query_only_documented_metrics() {
    let doc = read("docs/metrics.md");
    let rules = read("deploy/prometheus/alerts.yaml");
    let dashboard = read("deploy/grafana/gov.json");
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(!exprs.is_empty());
    let mut queried = metrics_in(&rules);
    for e in &exprs {
        queried.extend(metrics_in(e));
    }
    assert!(queried.len() > 10, "{queried:?}");
    for name in queried {
        assert!(
            doc.contains(&format!("| `{name}` |")),
            "`{name}` is queried in deploy/ but not listed in docs/metrics.md"
        );
    }
}

/// `promtool check rules` (Debian's `prometheus` package; `.ci/run` installs it).
#[test]
fn promtool_accepts_the_alert_rules() {
    let Ok(out) = std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(root().join("deploy/prometheus/alerts.yaml"))
        .output()
    else {
        eprintln!(
            "SKIPPED: promtool is not installed (apt-get install prometheus); .ci/run installs it"
        );
        return;
    };
    assert!(
        out.status.success(),
        "promtool check rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
