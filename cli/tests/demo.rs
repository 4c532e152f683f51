//! `govc demo --no-tui --duration N`: the whole system in one process, run
//! for a bounded time by the real binary.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `govc args`, killing it if it takes longer than `limit`. Output is
/// read by threads as it comes, so a full pipe never blocks the demo.
fn run_bounded(args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_govc"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("govc starts: {e}"));
    let reader = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as _));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = |h: std::thread::JoinHandle<String>| h.join().unwrap_or_default();
    (status.and_then(|s| s.code()), text(out), text(err))
}

/// The number after `word ` in `line`.
fn number_after(line: &str, word: &str) -> Option<u64> {
    let rest = &line[line.find(&format!("{word} "))? + word.len() + 1..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn bounded_demo_prints_synced_agents_and_rejections_and_cleans_up() {
    let (code, out, err) = run_bounded(
        &["demo", "--no-tui", "--duration", "20s"],
        Duration::from_secs(60),
    );
    let all = format!("--- stdout\n{out}\n--- stderr\n{err}");
    assert_eq!(code, Some(0), "govc demo did not exit 0 in time\n{all}");

    // The cluster-scope limit is made local and said so, never NACKed.
    assert!(out.contains("note: limit `crm_supplier`"), "{all}");
    assert!(!out.contains("NACKED"), "{all}");

    // Summaries every 5s: both agents SYNCED in each.
    let summaries = out.matches("\n--- ").count();
    assert!(
        summaries >= 3,
        "expected 3 summaries, got {summaries}\n{all}"
    );
    for agent in ["agent order/order-1", "agent inventory/inventory-1"] {
        let last = out.lines().rfind(|l| l.starts_with(agent));
        assert!(
            last.is_some_and(|l| l.contains("SYNCED")),
            "{agent} not SYNCED\n{all}"
        );
    }

    // The slow endpoint's bulkhead sheds part of the load, and admits most.
    let slow = out
        .lines()
        .rfind(|l| l.starts_with("rule  order/slow_calls"))
        .unwrap_or_else(|| panic!("no order/slow_calls line\n{all}"));
    let admitted = number_after(slow, "admitted").unwrap_or(0);
    let rejected = number_after(slow, "rejected").unwrap_or(0);
    assert!(admitted > 100, "{slow}\n{all}");
    assert!(rejected > 0, "{slow}\n{all}");
    assert!(rejected < admitted, "{slow}\n{all}");

    // Stopped in order, and the temporary state directory is gone.
    let state = out
        .split("(state in ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no state directory printed\n{all}"));
    assert!(out.contains(&format!("removed {state}")), "{all}");
    assert!(!Path::new(state).exists(), "{state} still exists\n{all}");
}

#[test]
fn demo_without_a_terminal_asks_for_no_tui() {
    let (code, _out, err) = run_bounded(&["demo"], Duration::from_secs(20));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--no-tui"), "{err}");
}
