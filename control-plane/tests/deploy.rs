//! `deploy/` against the code: the Kubernetes example's grace period covers its
//! policy's shutdown, the Prometheus rules pass `promtool`, and every metric the
//! rules and the Grafana dashboard query is one docs/metrics.md lists (which
//! e2e `docs_metrics_lists_every_family_both_binaries_export` checks against
//! the binaries). The flags in `deploy/` are checked by each binary's own
//! parser (`deploy_invocations_parse` in `govd` and `gov-agent`). The
//! commands of docs/deploy.md run here where the machine allows, its HA step
//! against a real etcd member with the certificates its recipe makes.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use gov_proto::v1 as pb;

use gov_common::testing::deploy_args;

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
        // `sh -c HOOK`: HOOK a string, as the API server requires.
        let hook = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2].as_str();
        pre_stop = hook.is_some_and(|h| h.contains("/terminate") && h.contains("/live"));
        // runAsNonRoot needs a numeric user: the image's, given in the pod.
        assert_eq!(
            sidecar["securityContext"]["runAsUser"].as_u64(),
            Some(65532)
        );
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

/// The commands of `docs/deploy.md`'s `sh` blocks, continuation lines joined,
/// comments and blank lines left out.
fn deploy_md_commands() -> Vec<String> {
    let doc = read("docs/deploy.md");
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in doc.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh || line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(line);
                commands.push(
                    std::mem::take(&mut pending)
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                );
            }
        }
    }
    commands
}

/// docs/deploy.md walked as a newcomer would, as far as this machine allows:
/// the token recipe, then `govc plan`, `apply` and `status` against a real
/// govd started with those tokens and certificates as `deploy/` starts it,
/// and `promtool`.
/// Every other command must be one named here with why it cannot run (a new
/// command in the doc fails this test until it runs or is named).
#[test]
fn deploy_md_commands_run_where_the_machine_allows() {
    const ELSEWHERE: [(&str, &str); 5] = [
        ("docker", "no container engine on the CI machine"),
        ("kubectl", "no Kubernetes cluster"),
        ("install", "needs root"),
        ("systemctl", "needs systemd"),
        (
            "cargo",
            "the release build of the image; cargo test builds the same binaries",
        ),
    ];
    let commands = deploy_md_commands();
    let dir = tempfile::tempdir().unwrap();
    let sh = |command: &str, cwd: &Path| {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(cwd)
            .env("NO_COLOR", "1")
            .env_remove("GOV_TOKEN")
            .env_remove("GOV_CONTROL_PLANE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{command}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Step 2: the token and certificate recipe, as written.
    let recipe: Vec<&String> = commands
        .iter()
        .filter(|c| RECIPE.iter().any(|r| c.starts_with(r)))
        .collect();
    assert!(recipe.len() >= 7, "{commands:#?}");
    for command in &recipe {
        sh(command, dir.path());
    }
    // govd with those files, as deploy/kubernetes/govd.yaml starts it: its
    // command line with the secrets' mount paths read as the recipe's files.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _govd = Kill(
        std::process::Command::new(env!("CARGO_BIN_EXE_govd"))
            .args(manifest_govd_args(port))
            .current_dir(dir.path())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let up = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(up, "govd did not listen on {port} within 10s");
    // .../target/debug/deps/deploy-HASH -> .../target/debug/govc
    let exe = std::env::current_exe().unwrap();
    let govc = exe.parent().and_then(Path::parent).unwrap().join("govc");
    assert!(
        govc.exists(),
        "`{}` is missing: cargo test --workspace builds it",
        govc.display()
    );
    let examples = root().join("examples");
    let mut ran = recipe.len();
    for command in &commands {
        let first = command.split_whitespace().next().unwrap_or("");
        if recipe.contains(&command) {
            continue;
        }
        if first == "govc" {
            // Not a terminal here: `apply` needs `--auto-approve` instead of a `yes`.
            let approve = if command.starts_with("govc apply ") {
                " --auto-approve"
            } else {
                ""
            };
            let command = command
                .replacen("govc", &format!("'{}'", govc.display()), 1)
                .replace(
                    "https://localhost:7070",
                    &format!("https://localhost:{port}"),
                )
                .replace("examples/", &format!("'{}'/", examples.display()))
                + approve;
            let out = sh(&command, dir.path());
            if command.contains(" status ") {
                assert!(out.contains("No agents"), "{command}: {out}");
            }
            if command.contains(" audit ") {
                assert!(out.contains("operator"), "{command}: {out}");
            }
        } else if first == "promtool" {
            if std::process::Command::new("promtool")
                .arg("--version")
                .output()
                .is_err()
            {
                eprintln!("SKIPPED `{command}`: promtool is not installed; .ci/run installs it");
                continue;
            }
            sh(command, &root());
        } else {
            assert!(
                ELSEWHERE.iter().any(|(name, _)| *name == first),
                "docs/deploy.md runs `{command}`: run it in this test, or name `{first}` in ELSEWHERE with why it cannot run here"
            );
            continue;
        }
        ran += 1;
    }
    assert!(ran >= 12, "ran {ran} of {commands:#?}");
}

/// The commands of step 2 that make the tokens and certificates.
const RECIPE: [&str; 3] = ["head ", "printf ", "openssl "];

/// govd's command line in deploy/kubernetes/govd.yaml, on 127.0.0.1:`port`,
/// with the files the secrets mount read from step 2's recipe.
fn manifest_govd_args(port: u16) -> Vec<String> {
    let (place, args) = deploy_args::invocations("govd")
        .into_iter()
        .find(|(place, _)| place.contains("govd.yaml"))
        .expect("deploy/kubernetes/govd.yaml runs govd");
    let files = [
        ("/etc/gov/tokens/govd.tokens", "govd.tokens"),
        ("/etc/gov/tls/tls.crt", "govd.pem"),
        ("/etc/gov/tls/tls.key", "govd.key"),
        ("/etc/gov/identity-ca/tls.crt", "identity-ca.pem"),
        ("/etc/gov/identity-ca/tls.key", "identity-ca.key"),
    ];
    let args: Vec<String> = args
        .into_iter()
        .map(|arg| {
            let arg = files
                .iter()
                .fold(arg, |arg, (mount, file)| arg.replace(mount, file));
            match arg.split_once('=') {
                Some(("--listen", _)) => format!("--listen=127.0.0.1:{port}"),
                Some(("--metrics-listen", _)) => "--metrics-listen=127.0.0.1:0".into(),
                Some(("--state-dir", _)) => "--state-dir=state".into(),
                _ => arg,
            }
        })
        .collect();
    assert!(
        args.iter().all(|a| !a.contains("/etc/gov/")),
        "{place} mounts a file step 2 does not make: {args:?}"
    );
    args
}

/// docs/deploy.md's HA step walked on loopback: its certificates made by its
/// recipe (step 2's and step 3 (HA)'s `openssl` lines, as written), one etcd
/// member started with the TLS flags of deploy/kubernetes/govd-ha.yaml, and
/// govd with that manifest's command line: it reads the state from etcd
/// over mutual TLS and starts.
#[test]
fn the_ha_manifest_runs_govd_on_etcd_over_mutual_tls_with_the_recipes_certificates() {
    let Some(etcd_bin) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("etcd"))
            .find(|p| p.is_file())
    }) else {
        panic!("this test needs `etcd`: apt-get install etcd-server (.ci/run does)");
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe: Vec<String> = deploy_md_commands()
        .into_iter()
        .filter(|c| RECIPE.iter().any(|r| c.starts_with(r)))
        .collect();
    assert!(
        recipe.iter().any(|c| c.contains("govd-etcd.pem")),
        "{recipe:#?}"
    );
    for command in &recipe {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "`{command}`: {out:?}");
    }
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (client, peer, metrics, grpc) = (free(), free(), free(), free());
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let manifest = |binary: &str| {
        deploy_args::invocations(binary)
            .into_iter()
            .find(|(place, _)| place.contains("govd-ha.yaml"))
            .unwrap_or_else(|| panic!("deploy/kubernetes/govd-ha.yaml runs {binary}"))
            .1
    };
    // The member: the manifest's flags, its names and ports on loopback.
    let etcd_files = [
        ("/etc/etcd/tls/tls.crt", "etcd.pem"),
        ("/etc/etcd/tls/tls.key", "etcd.key"),
        ("/etc/etcd/tls/ca.crt", "etcd-ca.pem"),
    ];
    let etcd_args: Vec<String> = manifest("etcd")
        .into_iter()
        .map(|arg| {
            let arg = etcd_files
                .iter()
                .fold(arg, |arg, (mount, file)| arg.replace(mount, file));
            match arg.split_once('=') {
                Some(("--name", _)) => "--name=govd-etcd-0".into(),
                Some(("--data-dir", _)) => "--data-dir=etcd-data".into(),
                Some(("--listen-client-urls" | "--advertise-client-urls", _)) => {
                    format!(
                        "{}=https://127.0.0.1:{client}",
                        arg.split_once('=').unwrap().0
                    )
                }
                Some(("--listen-peer-urls" | "--initial-advertise-peer-urls", _)) => {
                    format!(
                        "{}=https://127.0.0.1:{peer}",
                        arg.split_once('=').unwrap().0
                    )
                }
                Some(("--initial-cluster", _)) => {
                    format!("--initial-cluster=govd-etcd-0=https://127.0.0.1:{peer}")
                }
                Some(("--listen-metrics-urls", _)) => {
                    format!("--listen-metrics-urls=http://127.0.0.1:{metrics}")
                }
                _ => arg,
            }
        })
        .collect();
    assert!(etcd_args.contains(&"--client-cert-auth".to_owned()));
    assert!(
        etcd_args
            .iter()
            .all(|a| !a.contains("/etc/") && !a.contains("$(")),
        "{etcd_args:?}"
    );
    let _etcd = Kill(
        std::process::Command::new(etcd_bin)
            .args(&etcd_args)
            .args(["--logger", "zap", "--log-level", "error"])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let healthy = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", metrics)) else {
            return false;
        };
        use std::io::{Read, Write};
        let _ = s.write_all(b"GET /health HTTP/1.0\r\n\r\n");
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    });
    let etcd_log = || std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default();
    assert!(healthy, "etcd never healthy: {}", etcd_log());

    // govd: the manifest's command line, the secrets' mounts read as the recipe's files.
    let files = [
        ("/etc/gov/tokens/govd.tokens", "govd.tokens"),
        ("/etc/gov/tls/tls.crt", "govd.pem"),
        ("/etc/gov/tls/tls.key", "govd.key"),
        ("/etc/gov/identity-ca/tls.crt", "identity-ca.pem"),
        ("/etc/gov/identity-ca/tls.key", "identity-ca.key"),
        ("/etc/gov/etcd/ca.crt", "etcd-ca.pem"),
        ("/etc/gov/etcd/tls.crt", "govd-etcd.pem"),
        ("/etc/gov/etcd/tls.key", "govd-etcd.key"),
    ];
    let govd_args: Vec<String> = manifest("govd")
        .into_iter()
        .map(|arg| {
            let arg = files
                .iter()
                .fold(arg, |arg, (mount, file)| arg.replace(mount, file));
            match arg.split_once('=') {
                Some(("--listen", _)) => format!("--listen=127.0.0.1:{grpc}"),
                Some(("--metrics-listen", _)) => "--metrics-listen=127.0.0.1:0".into(),
                Some(("--store", url)) => {
                    assert!(url.starts_with("etcds://"), "{url}");
                    let prefix = url.rsplit_once('/').unwrap().1;
                    format!("--store=etcds://127.0.0.1:{client}/{prefix}")
                }
                Some(("--replica", _)) => "--replica=govd-0".into(),
                _ => arg,
            }
        })
        .collect();
    assert!(
        govd_args
            .iter()
            .all(|a| !a.contains("/etc/gov/") && !a.contains("$(")),
        "govd-ha.yaml mounts a file the recipe does not make: {govd_args:?}"
    );
    let log = dir.path().join("govd.log");
    let mut govd = Kill(
        std::process::Command::new(env!("CARGO_BIN_EXE_govd"))
            .args(&govd_args)
            .current_dir(dir.path())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut text = String::new();
    for _ in 0..300 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("govd started") || govd.0.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        text.contains("govd started") && text.contains(&format!("etcds://127.0.0.1:{client}/gov")),
        "govd on the HA manifest's flags did not start on etcd over TLS:\n{text}\netcd:\n{}",
        etcd_log()
    );
}
