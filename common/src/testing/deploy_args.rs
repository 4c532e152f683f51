//! The command lines `deploy/` gives `govd` and `gov-agent`: Kubernetes
//! containers (`command`, `args`, `GOV_` variables with a literal `value`) and
//! systemd units (`ExecStart`, and for a templated unit the example
//! `EnvironmentFile` beside it). Used by each binary's tests, which run
//! their own argument parser over every one, so `deploy/` cannot drift from
//! the flags.

use std::path::{Path, PathBuf};

/// `(where, arguments after the program name)` for every invocation of `binary`.
pub fn invocations(binary: &str) -> Vec<(String, Vec<String>)> {
    let deploy = deploy_dir();
    let mut found = Vec::new();
    for path in files(&deploy.join("kubernetes"), "yaml") {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            containers(&value, binary, &path, &mut found);
        }
    }
    for path in files(&deploy.join("systemd"), "service") {
        let text = std::fs::read_to_string(&path).unwrap();
        let exec = text
            .replace("\\\n", " ")
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=").map(str::to_owned))
            .unwrap_or_else(|| panic!("{}: no ExecStart", path.display()));
        let mut words = exec.split_whitespace().map(str::to_owned);
        if !words
            .next()
            .is_some_and(|p| p.ends_with(&format!("/{binary}")))
        {
            continue;
        }
        let mut args: Vec<String> = words.collect();
        // A template (`name@.service`) takes the rest from its example env file.
        if text.contains("EnvironmentFile=") {
            for env in files(&deploy.join("systemd"), "env") {
                let mut with_env = args.clone();
                for line in std::fs::read_to_string(&env).unwrap().lines() {
                    if let Some((var, value)) = line.split_once('=')
                        && !line.starts_with('#')
                    {
                        with_env.push(flag(var));
                        with_env.push(value.to_owned());
                    }
                }
                found.push((
                    format!("{} with {}", path.display(), env.display()),
                    with_env,
                ));
            }
            args.clear();
            continue;
        }
        found.push((path.display().to_string(), args));
    }
    assert!(!found.is_empty(), "deploy/ never runs {binary}");
    found
}

/// The flag of a `GOV_` variable: `GOV_CONTROL_PLANE` is `--control-plane`.
fn flag(var: &str) -> String {
    let name = var.strip_prefix("GOV_").unwrap_or(var);
    format!("--{}", name.to_ascii_lowercase().replace('_', "-"))
}

/// Every mapping with a `command` that runs `binary`, anywhere in `value`.
fn containers(
    value: &serde_yaml::Value,
    binary: &str,
    path: &Path,
    found: &mut Vec<(String, Vec<String>)>,
) {
    match value {
        serde_yaml::Value::Mapping(map) => {
            let strings = |key: &str| -> Vec<String> {
                map.get(key)
                    .and_then(|v| v.as_sequence())
                    .map(|s| {
                        s.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let command = strings("command");
            if command
                .first()
                .is_some_and(|p| p.ends_with(&format!("/{binary}")))
            {
                let mut args: Vec<String> = command[1..].to_vec();
                args.extend(strings("args"));
                for env in map
                    .get("env")
                    .and_then(|v| v.as_sequence())
                    .into_iter()
                    .flatten()
                {
                    let name = env.get("name").and_then(|v| v.as_str()).unwrap_or_default();
                    if let (true, Some(value)) = (
                        name.starts_with("GOV_"),
                        env.get("value").and_then(|v| v.as_str()),
                    ) {
                        args.push(flag(name));
                        args.push(value.to_owned());
                    }
                }
                let name = map.get("name").and_then(|v| v.as_str()).unwrap_or("?");
                found.push((format!("{} container {name}", path.display()), args));
            }
            for (_, v) in map {
                containers(v, binary, path, found);
            }
        }
        serde_yaml::Value::Sequence(seq) => {
            for v in seq {
                containers(v, binary, path, found);
            }
        }
        _ => {}
    }
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

fn deploy_dir() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("deploy").is_dir() {
        assert!(dir.pop(), "no deploy/ above {}", env!("CARGO_MANIFEST_DIR"));
    }
    dir.join("deploy")
}
