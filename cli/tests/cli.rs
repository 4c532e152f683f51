//! The `govc` binary as users run it: exit codes, output streams, formats.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

fn govc() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_govc"));
    // Tests must not depend on the environment they run in.
    cmd.env_remove("GOV_ERROR_FORMAT")
        .env_remove("GOV_DENY_WARNINGS")
        .env_remove("NO_COLOR");
    cmd
}

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gov"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    files
}

const FORMATTED: &str = "service order {\n  capacity workers 20 # own pool\n\n  match slow = path prefix \"/slow\"\n}\n";
const UNFORMATTED: &str =
    "service order {capacity workers 20 # own pool\n\n\n  match slow = path   prefix \"/slow\" }";
const BROKEN: &str = "service order {\n  capacity workers\n}\n";

/// A temporary directory holding one file.
fn file_with(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

// === Exit codes ===

#[test]
fn check_passes_on_every_example() {
    govc()
        .arg("check")
        .args(examples())
        .assert()
        .success()
        .stdout("");
}

#[test]
fn fmt_check_passes_on_every_example() {
    govc()
        .args(["fmt", "--check"])
        .args(examples())
        .assert()
        .success()
        .stdout("");
}

#[test]
fn check_fails_with_a_diagnostic_on_a_syntax_error() {
    let (_dir, path) = file_with("broken.gov", BROKEN);
    govc()
        .arg("check")
        .arg(&path)
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::contains("gov::syntax"))
        .stderr(predicate::str::contains(
            "expected a whole number, found `}`",
        ))
        .stderr(predicate::str::contains("broken.gov:3:1"));
}

#[test]
fn check_reports_every_file_not_only_the_first() {
    let (dir, broken) = file_with("broken.gov", BROKEN);
    let also = dir.path().join("also.gov");
    std::fs::write(&also, "servce x {}\n").unwrap();
    let missing = dir.path().join("missing.gov");
    let out = govc()
        .arg("check")
        .args([&broken, &missing, &also])
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("broken.gov:3:1"), "{stderr}");
    // Long temporary paths may wrap, so look for the parts.
    assert!(stderr.contains("cannot read `"), "{stderr}");
    assert!(stderr.contains("missing.gov"), "{stderr}");
    assert!(stderr.contains("did you mean `service`?"), "{stderr}");
}

#[test]
fn usage_errors_exit_64() {
    govc().assert().code(64);
    govc()
        .arg("check")
        .assert()
        .code(64)
        .stderr(predicate::str::contains("<FILE>"));
    govc().args(["fmt"]).assert().code(64);
    govc()
        .args(["check", "--no-such-flag", "x.gov"])
        .assert()
        .code(64);
    govc()
        .args(["check", "--error-format", "xml", "x.gov"])
        .assert()
        .code(64);
    govc().args(["frobnicate"]).assert().code(64);
    govc()
        .args(["fmt", "--write", "--check", "x.gov"])
        .assert()
        .code(64);
}

/// A boolean flag's variable takes the spellings people write (`1`, `yes`,
/// `on`, `true` and their opposites), as every gov binary's do; anything else
/// is a usage error.
#[test]
fn boolean_variables_take_1_yes_on_and_true() {
    let policy = "service order {\n  match slow = path prefix \"/slow\"\n  bulkhead b on slow {\n    max_concurrent 2\n  }\n}\n";
    let (_dir, old) = file_with("old.gov", policy);
    let (_dir2, new) = file_with("new.gov", &policy.replace('2', "3"));
    for yes in ["1", "yes", "on", "true", "TRUE"] {
        govc()
            .args(["plan"])
            .arg(&old)
            .arg("--against")
            .arg(&new)
            .env("GOV_DETAILED_EXITCODE", yes)
            .assert()
            .code(2);
    }
    for no in ["0", "no", "off", "false"] {
        govc()
            .args(["plan"])
            .arg(&old)
            .arg("--against")
            .arg(&new)
            .env("GOV_DETAILED_EXITCODE", no)
            .assert()
            .code(0);
    }
    govc()
        .args(["plan"])
        .arg(&old)
        .arg("--against")
        .arg(&new)
        .env("GOV_DETAILED_EXITCODE", "maybe")
        .assert()
        .code(64);
}

/// `GOV_OUTPUT` and `GOV_SERVICE` (an agent's identity) mean nothing to
/// govc: one command's output format is another's error, and a compile of
/// every service must not quietly become a compile of one.
#[test]
fn an_agents_environment_does_not_change_govc() {
    let (_dir, path) = file_with("p.gov", FORMATTED);
    govc()
        .arg("compile")
        .arg(&path)
        .env("GOV_OUTPUT", "text")
        .env("GOV_SERVICE", "billing")
        .assert()
        .success()
        .stdout(predicate::str::contains("service: order"));
}

#[test]
fn help_and_version_exit_0_on_stdout() {
    govc()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("Usage: govc"));
    govc()
        .args(["check", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("--error-format"));
    govc()
        .arg("--version")
        .assert()
        .success()
        .stdout(predicate::str::starts_with("govc "));
}

#[test]
fn oversize_files_are_refused() {
    let (_dir, path) = file_with("big.gov", &"#".repeat(gov_lang_limit() + 10));
    govc()
        .arg("check")
        .arg(&path)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("is too large"));
}

fn gov_lang_limit() -> usize {
    4 * 1024 * 1024
}

// === Error formats and colour ===

#[test]
fn json_prints_one_object_per_diagnostic_per_line() {
    let (dir, broken) = file_with("broken.gov", BROKEN);
    let missing = dir.path().join("missing.gov");
    let out = govc()
        .args(["check", "--error-format", "json"])
        .args([&broken, &missing])
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stderr}");

    // The order of diagnostics across files is not part of the contract.
    let by_code = |code: &str| {
        lines
            .iter()
            .find(|l| l["code"] == code)
            .unwrap_or_else(|| panic!("no {code} in {stderr}"))
    };
    let syntax = by_code("gov::syntax");
    assert_eq!(syntax["severity"], "error");
    assert_eq!(syntax["message"], "expected a whole number, found `}`");
    assert!(syntax["filename"].as_str().unwrap().ends_with("broken.gov"));
    let span = &syntax["labels"][0]["span"];
    assert_eq!(span["offset"], BROKEN.find('}').unwrap());
    assert_eq!(span["length"], 1);
    assert_eq!(
        (span["line"].clone(), span["column"].clone()),
        (3.into(), 1.into())
    );
    assert_eq!(
        (syntax["line"].clone(), syntax["column"].clone()),
        (3.into(), 1.into())
    );
    assert_eq!(syntax["labels"][0]["primary"], true);

    let io = by_code("gov::io");
    assert_eq!(io["severity"], "error");
    assert!(io["message"].as_str().unwrap().contains("missing.gov"));
}

#[test]
fn json_lines_and_columns_are_those_of_the_human_header() {
    // Multi-byte text before the error on its line, and (in a second file)
    // a lint whose context label comes first: the JSON position is the
    // human header's.
    let text = "service order {\n  domain \"café\"  capacity workers x\n}\n";
    let (dir, path) = file_with("utf8.gov", text);
    let lint =
        "service b {\n  capacity workers 2\n\n\n\n  bulkhead w on any { max_concurrent 5 }\n}\n";
    let other = dir.path().join("lint.gov");
    std::fs::write(&other, lint).unwrap();
    let run = |format: &str| {
        let out = govc()
            .args(["check", "--each", "--error-format", format])
            .args([&path, &other])
            .assert()
            .code(1)
            .get_output()
            .clone();
        String::from_utf8(out.stderr).unwrap()
    };
    let human = run("human");
    let json = run("json");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{json}");
    let headers: Vec<&str> = human
        .split("╭─[")
        .skip(1)
        .map(|rest| rest.split(']').next().unwrap())
        .filter(|h| !h.is_empty())
        .collect();
    for d in &lines {
        let file = std::path::Path::new(d["filename"].as_str().unwrap());
        let name = file.file_name().unwrap().to_string_lossy();
        let header = format!("{name}:{}:{}", d["line"], d["column"]);
        assert!(
            headers.iter().any(|h| h.ends_with(&header)),
            "{header} not among {headers:?}"
        );
    }
    // `x` is the 36th byte of line 2 (`é` is two bytes), the 35th character.
    assert_eq!(
        (lines[0]["line"].clone(), lines[0]["column"].clone()),
        (2.into(), 36.into())
    );
    let span = &lines[0]["labels"][0]["span"];
    assert_eq!(
        (span["end_line"].clone(), span["end_column"].clone()),
        (2.into(), 37.into())
    );
    // The lint is headed by `max_concurrent 5`, not by `capacity workers 2`.
    assert_eq!(
        (lines[1]["line"].clone(), lines[1]["column"].clone()),
        (6.into(), 38.into())
    );
}

#[test]
fn error_format_comes_from_the_environment_and_the_flag_wins() {
    let (_dir, broken) = file_with("broken.gov", BROKEN);
    let out = govc()
        .env("GOV_ERROR_FORMAT", "json")
        .arg("check")
        .arg(&broken)
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    serde_json::from_str::<serde_json::Value>(stderr.trim()).unwrap();

    govc()
        .env("GOV_ERROR_FORMAT", "json")
        .args(["check", "--error-format", "human"])
        .arg(&broken)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("× expected a whole number"));
}

#[test]
fn no_colour_codes_without_a_terminal_or_with_no_color() {
    let (_dir, broken) = file_with("broken.gov", BROKEN);
    for no_color in [None, Some("1")] {
        let mut cmd = govc();
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        cmd.arg("check")
            .arg(&broken)
            .assert()
            .code(1)
            .stderr(predicate::str::contains("gov::syntax"))
            .stderr(predicate::str::contains("\u{1b}[").not());
    }
}

// === fmt ===

#[test]
fn fmt_prints_the_formatted_file() {
    let (_dir, path) = file_with("a.gov", UNFORMATTED);
    govc()
        .arg("fmt")
        .arg(&path)
        .assert()
        .success()
        .stdout(FORMATTED);
    // The file itself is untouched.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), UNFORMATTED);
}

#[test]
fn fmt_check_lists_unformatted_files_and_fails() {
    let (dir, bad) = file_with("bad.gov", UNFORMATTED);
    let good = dir.path().join("good.gov");
    std::fs::write(&good, FORMATTED).unwrap();
    govc()
        .args(["fmt", "--check"])
        .args([&bad, &good])
        .assert()
        .code(1)
        .stdout(format!("{}\n", bad.display()))
        .stderr(predicate::str::contains("1 file is not formatted"));
    govc()
        .args(["fmt", "--check"])
        .arg(&good)
        .assert()
        .success()
        .stdout("");
}

#[test]
fn fmt_write_rewrites_only_changed_files() {
    let (dir, bad) = file_with("bad.gov", UNFORMATTED);
    let good = dir.path().join("good.gov");
    std::fs::write(&good, FORMATTED).unwrap();
    let before = std::fs::metadata(&good).unwrap().modified().unwrap();
    govc()
        .args(["fmt", "--write"])
        .args([&bad, &good])
        .assert()
        .success()
        .stdout(format!("{}\n", bad.display()));
    assert_eq!(std::fs::read_to_string(&bad).unwrap(), FORMATTED);
    assert_eq!(
        std::fs::metadata(&good).unwrap().modified().unwrap(),
        before
    );
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // A second run has nothing to do.
    govc()
        .args(["fmt", "--write"])
        .arg(&bad)
        .assert()
        .success()
        .stdout("");
}

#[test]
fn fmt_write_leaves_a_broken_file_alone() {
    let (_dir, path) = file_with("broken.gov", BROKEN);
    govc()
        .args(["fmt", "--write"])
        .arg(&path)
        .assert()
        .code(1)
        .stdout("")
        .stderr(predicate::str::contains("gov::syntax"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), BROKEN);
}

#[test]
fn fmt_diff_prints_a_unified_diff() {
    let (_dir, path) = file_with("a.gov", UNFORMATTED);
    let name = path.display().to_string();
    let out = govc()
        .args(["fmt", "--diff"])
        .arg(&path)
        .assert()
        .success()
        .get_output()
        .clone();
    let stdout = String::from_utf8(out.stdout).unwrap();
    // An absolute path is written as it is (not `a//tmp/...`).
    assert!(name.starts_with('/'));
    assert!(
        stdout.starts_with(&format!("--- {name}\n+++ {name}\n@@ ")),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n-service order {capacity workers 20 # own pool\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n+  capacity workers 20 # own pool\n"),
        "{stdout}"
    );
    // With --check the diff replaces the list and the exit code says "not formatted".
    govc()
        .args(["fmt", "--check", "--diff"])
        .arg(&path)
        .assert()
        .code(1)
        .stdout(stdout);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), UNFORMATTED);
}

#[test]
fn a_relative_path_gets_git_style_diff_headers() {
    let (dir, _path) = file_with("a.gov", UNFORMATTED);
    let out = govc()
        .current_dir(dir.path())
        .args(["fmt", "--diff", "a.gov"])
        .assert()
        .success()
        .get_output()
        .clone();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with("--- a/a.gov\n+++ b/a.gov\n@@ "),
        "{stdout}"
    );
}

#[test]
fn a_directory_means_every_gov_file_below_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("team/.hidden")).unwrap();
    std::fs::write(
        dir.path().join("team/a.gov"),
        "service a {\n  capacity workers 2\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.gov"),
        "service b {\n  bulkhead x on nope {\n    max_concurrent 1\n  }\n}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("team/.hidden/c.gov"), "not a policy").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a policy").unwrap();
    // b.gov's unknown match is found; the hidden directory and the .txt are not read.
    let out = govc()
        .arg("check")
        .arg(dir.path())
        .assert()
        .code(1)
        .get_output()
        .clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("unknown match `nope`"), "{stderr}");
    assert_eq!(stderr.matches("gov::").count(), 1, "{stderr}");
    // A directory without a policy is an error that says so.
    let empty = tempfile::tempdir().unwrap();
    govc()
        .arg("check")
        .arg(empty.path())
        .assert()
        .code(1)
        .stderr(predicates::str::contains("no `.gov` file below"));
}

#[test]
fn a_dash_reads_standard_input() {
    govc()
        .args(["fmt", "-"])
        .write_stdin(UNFORMATTED)
        .assert()
        .success()
        .stdout(FORMATTED);
    govc()
        .args(["fmt", "--check", "-"])
        .write_stdin(UNFORMATTED)
        .assert()
        .code(1)
        .stdout("<stdin>\n");
    govc()
        .args(["check", "-"])
        .write_stdin(BROKEN)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("<stdin>:3:1"));
    govc()
        .args(["fmt", "--write", "-"])
        .write_stdin(FORMATTED)
        .assert()
        .code(64);
}

// === Closed output streams ===

/// `govc ... 2>&1 | head` once `head` has gone: stdout and stderr are closed
/// pipes. Every command exits with the code it has on open streams (it used to
/// panic in `println!`/`eprintln!` and exit 101).
#[test]
fn closed_stdout_and_stderr_change_no_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.gov");
    let changed = dir.path().join("changed.gov");
    let broken = dir.path().join("broken.gov");
    let messy = dir.path().join("messy.gov");
    std::fs::write(&good, FORMATTED).unwrap();
    std::fs::write(&changed, FORMATTED.replace("/slow", "/slower")).unwrap();
    std::fs::write(&broken, BROKEN).unwrap();
    std::fs::write(&messy, UNFORMATTED).unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let commands: Vec<Vec<String>> = vec![
        vec!["check".into(), path(&broken)],
        vec!["compile".into(), path(&good)],
        vec!["compile".into(), path(&broken)],
        vec!["fmt".into(), path(&messy)],
        vec!["fmt".into(), "--check".into(), path(&messy)],
        vec![
            "plan".into(),
            path(&good),
            "--against".into(),
            path(&changed),
        ],
        vec![
            "plan".into(),
            path(&good),
            "--against".into(),
            path(&changed),
            "-o".into(),
            "json".into(),
        ],
        // Nothing listens on port 1: the error goes to stderr.
        vec![
            "status".into(),
            "--control-plane".into(),
            "http://127.0.0.1:1".into(),
        ],
        vec!["--help".into()],
        vec!["nosuch".into()],
    ];
    for args in commands {
        let open = std::process::Command::new(env!("CARGO_BIN_EXE_govc"))
            .args(&args)
            .output()
            .unwrap();
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let closed = std::process::Command::new(env!("CARGO_BIN_EXE_govc"))
            .args(&args)
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .status()
            .unwrap();
        assert_ne!(closed.code(), Some(101), "govc {args:?} panicked");
        assert_eq!(closed.code(), open.status.code(), "govc {args:?}");
    }
}

/// govc will not send a token over `http://` to a host that is not
/// loopback: it says so at once, before any connection (10.255.255.1
/// answers nothing, so a connection attempt would wait out its timeout).
#[test]
fn a_token_is_not_sent_in_clear_to_a_remote_host() {
    let (_dir, token) = file_with("me.token", "secret-token\n");
    let out = govc()
        .env_remove("GOV_TOKEN")
        .env_remove("GOV_ALLOW_CLEARTEXT_TOKEN")
        .env_remove("GOV_TLS_CA")
        .args(["status", "--control-plane", "http://10.255.255.1:7070"])
        .arg("--token-file")
        .arg(&token)
        .assert()
        .failure()
        .stderr(predicate::str::contains("gov::govc::cleartext_token"))
        .stderr(predicate::str::contains("https://"))
        .stderr(predicate::str::contains("--allow-cleartext-token"))
        .stderr(predicate::str::contains("secret-token").not());
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    // Refused before any connection: no `gov::govc::unreachable`.
    assert!(!stderr.contains("unreachable"), "{stderr}");
}

/// `govc completions SHELL` prints a script generated from the same command
/// definitions (every subcommand in it); an unknown shell is a usage error.
#[test]
fn completions_cover_every_subcommand() {
    let out = govc().args(["completions", "bash"]).assert().success();
    let script = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(script.contains("_govc()"), "{script}");
    for sub in [
        "check", "fmt", "compile", "plan", "apply", "status", "release", "audit", "demo", "tui",
        "lsp",
    ] {
        assert!(script.contains(sub), "no `{sub}` in the bash completions");
    }
    for shell in ["zsh", "fish"] {
        govc()
            .args(["completions", shell])
            .assert()
            .success()
            .stdout(predicate::str::contains("apply"));
    }
    govc()
        .args(["completions", "tcsh"])
        .assert()
        .code(64)
        .stderr(predicate::str::contains("invalid value 'tcsh'"));
}
