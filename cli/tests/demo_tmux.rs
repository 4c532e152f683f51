//! End to end in a real terminal: `govc demo` in tmux, wait for the `mdm`
//! fuse to trip, select it, release it, confirm, and see it closed; then quit
//! and see the demo stop cleanly.
//!
//! Requires tmux (CI installs it). Each run uses its own tmux server
//! (`tmux -L <unique>`), killed at the end whatever happens.

use std::process::Command;
use std::time::{Duration, Instant};

/// A private tmux server, killed on drop.
struct Tmux {
    socket: String,
    session: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn send(&self, keys: &[&str]) {
        let status = self
            .cmd()
            .args(["send-keys", "-t", &self.session])
            .args(keys)
            .status()
            .unwrap_or_else(|e| panic!("tmux send-keys: {e}"));
        assert!(status.success(), "tmux send-keys {keys:?} failed");
    }

    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .unwrap_or_else(|e| panic!("tmux capture-pane: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls the screen every 500ms until `pred` holds or `limit` passes.
    fn wait_for(&self, what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited {limit:?} for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

/// Lines of `screen` that show the fuse `order/mdm` tripped.
fn mdm_open(screen: &str) -> bool {
    screen
        .lines()
        .any(|l| l.contains("order/mdm") && l.contains("OPEN"))
}

#[test]
fn release_the_tripped_fuse_in_the_tui() {
    let tmux_ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        tmux_ok,
        "this test drives `govc demo` in tmux, and tmux is not installed (apt-get install tmux)"
    );
    let unique = format!(
        "gov-demo-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let tmux = Tmux {
        socket: unique.clone(),
        session: unique,
    };
    // --duration bounds the demo even if the test dies before its guard runs;
    // the trailing sleep keeps the pane to read the exit lines.
    let command = format!(
        "'{}' demo --duration 150s; echo demo-exit=$?; sleep 60",
        env!("CARGO_BIN_EXE_govc")
    );
    let status = tmux
        .cmd()
        .args([
            "new-session",
            "-d",
            "-x",
            "140",
            "-y",
            "40",
            "-s",
            &tmux.session,
        ])
        .arg(command)
        .status()
        .unwrap_or_else(|e| panic!("tmux new-session: {e}"));
    assert!(status.success(), "tmux new-session failed");

    tmux.wait_for(
        "the TUI with both agents SYNCED",
        Duration::from_secs(30),
        |s| s.matches("SYNCED").count() >= 2,
    );
    tmux.wait_for(
        "the `order/mdm` fuse to trip",
        Duration::from_secs(90),
        mdm_open,
    );
    // The demo's supplier backend recovers 3s after the fuse shields it; a
    // release before that would (rightly) trip the fuse again.
    std::thread::sleep(Duration::from_secs(4));

    // Agents -> Rules -> Trips, then release the selected trip.
    tmux.send(&["Tab"]);
    tmux.send(&["Tab"]);
    tmux.send(&["r"]);
    let dialog = tmux.wait_for("the confirmation dialog", Duration::from_secs(5), |s| {
        s.contains("Release fuse order/mdm")
    });
    assert!(
        dialog.contains("[y/N]"),
        "the confirmation must default to No:\n{dialog}"
    );
    tmux.send(&["y"]);
    tmux.wait_for("the release result", Duration::from_secs(15), |s| {
        s.contains("released fuse order/mdm")
    });
    // Any key closes the result; the fuse stays closed (the backend recovered).
    // Wait for the popup to go before the next key: an Escape and a `q` that
    // reach the terminal together read as one Alt-q, which closes the popup
    // and quits nothing (seen once in three runs under load).
    tmux.send(&["Escape"]);
    let screen = tmux.wait_for("no tripped fuse", Duration::from_secs(10), |s| {
        !mdm_open(s) && s.contains("every fuse is closed") && !s.contains("any key closes")
    });
    assert!(!screen.contains("NACKED"), "{screen}");

    // `q` quits; everything stops and the terminal is back to normal.
    tmux.send(&["q"]);
    let end = tmux.wait_for("the demo to exit", Duration::from_secs(30), |s| {
        s.contains("demo-exit=")
    });
    assert!(end.contains("demo-exit=0"), "{end}");
    assert!(end.contains("stopped after"), "{end}");
    assert!(end.contains("removed /"), "{end}");
}
