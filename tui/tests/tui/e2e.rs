//! `govc demo` driven in tmux by `tests/e2e_tmux.sh`: trip, select, confirm
//! (No by default), release, see it closed, quit. Needs tmux and a built
//! `govc`, which this crate cannot build itself:
//!
//! ```text
//! cargo build -j2 -p govc
//! GOVC_BIN=target/debug/govc cargo test -j2 -p gov-tui --test tui -- --ignored e2e
//! ```

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs tmux and GOVC_BIN pointing at a built govc"]
fn e2e_demo_release_in_tmux() {
    let govc = std::env::var("GOVC_BIN").expect("GOVC_BIN=path/to/govc");
    // Relative to the workspace root, where cargo is usually run.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let govc = std::fs::canonicalize(root.join(&govc)).expect("GOVC_BIN exists");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e_tmux.sh");
    let status = Command::new("bash")
        .arg(script)
        .arg(govc)
        .status()
        .expect("bash runs");
    assert!(status.success(), "e2e_tmux.sh failed: {status}");
}
