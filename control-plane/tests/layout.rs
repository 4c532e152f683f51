//! Issue 20: no file under `control-plane/src` has more than 700 lines of
//! non-test code (everything before a `#[cfg(test)] mod tests` block).

#![allow(clippy::expect_used, reason = "a test fails loudly")]

use std::path::Path;

const MAX_LINES: usize = 700;

/// Lines before the file's `#[cfg(test)]` + `mod tests` pair (all of them
/// if it has none).
fn non_test_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len())
}

fn walk(dir: &Path, out: &mut Vec<(String, usize)>) {
    for entry in std::fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("readable source file");
            out.push((path.display().to_string(), non_test_lines(&text)));
        }
    }
}

#[test]
fn no_source_file_has_more_than_700_lines_of_non_test_code() {
    let mut files = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 10, "{files:?}");
    let over: Vec<_> = files.iter().filter(|(_, n)| *n > MAX_LINES).collect();
    assert!(over.is_empty(), "over {MAX_LINES} non-test lines: {over:?}");
}

#[test]
fn the_count_stops_at_the_test_module() {
    let text = "a\nb\n#[cfg(test)]\nfn helper() {}\n#[cfg(test)]\nmod tests {\n  x\n}\n";
    assert_eq!(non_test_lines(text), 4);
    assert_eq!(non_test_lines("a\nb\n"), 2);
}
