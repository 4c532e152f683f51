//! The policy the demo applies: `examples/shop.gov` (built in, so `govc demo`
//! works from any directory) or the files given with `--policy`.
//!
//! gov-agent has no shared counter store yet, so it refuses (NACKs) configs
//! with `scope cluster` limits. The demo runs one agent per service, where a
//! cluster-wide counter and a local one count the same calls, so it rewrites
//! such limits to `scope local` and says so, instead of showing a NACK as if
//! it were normal.

/// `examples/shop.gov`, as built into `govc`.
pub const SHOP: &str = include_str!("../../../examples/shop.gov");

/// The file name the built-in policy is applied under.
pub const SHOP_NAME: &str = "examples/shop.gov";

/// Rewrites every `scope cluster ...` clause to `scope local`, keeping the
/// rest of each line (indentation, trailing comment). Returns the new text
/// and the names of the limits whose scope changed.
pub fn local_scope(text: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(text.len());
    let mut changed = Vec::new();
    let mut limit = None::<String>;
    for line in text.split_inclusive('\n') {
        let code = line.split('#').next().unwrap_or_default();
        let mut words = code.split_whitespace();
        if words.next() == Some("limit") {
            limit = words.next().map(str::to_owned);
        }
        match code.find("scope cluster") {
            Some(at) if code[..at].trim().is_empty() || code[..at].ends_with(['{', ';', ' ']) => {
                let end = clause_end(code, at);
                out.push_str(&line[..at]);
                out.push_str("scope local");
                out.push_str(&line[end..]);
                changed.push(limit.clone().unwrap_or_else(|| "?".into()));
            }
            _ => out.push_str(line),
        }
    }
    (out, changed)
}

/// Where `scope cluster [sync exact | sync batch DURATION]` starting at `at` ends.
fn clause_end(code: &str, at: usize) -> usize {
    let rest = &code[at..];
    let mut end = at + "scope cluster".len();
    let mut words = rest["scope cluster".len()..].split_whitespace();
    if words.next() == Some("sync") {
        let after_sync = rest.find("sync").map_or(end, |i| at + i + "sync".len());
        end = after_sync;
        match words.next() {
            Some("exact") => end = find_after(code, end, "exact"),
            Some("batch") => {
                end = find_after(code, end, "batch");
                if let Some(d) = words.next() {
                    end = find_after(code, end, d);
                }
            }
            _ => {}
        }
    }
    end
}

/// The end of the first `word` in `code` at or after `from`.
fn find_after(code: &str, from: usize, word: &str) -> usize {
    code[from..]
        .find(word)
        .map_or(from, |i| from + i + word.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shop_cluster_limit_becomes_local() {
        let (text, changed) = local_scope(SHOP);
        assert_eq!(changed, ["crm_supplier"]);
        assert!(!text.contains("scope cluster"));
        assert!(text.contains("    scope local\n"));
        assert_eq!(text.lines().count(), SHOP.lines().count());
    }

    #[test]
    fn keeps_comments_and_other_lines() {
        let src = "limit a on x {\n  calls 1 per 1s\n  scope cluster sync exact # shared\n}\nlimit b on y {\n  scope cluster\n}\n";
        let (text, changed) = local_scope(src);
        assert_eq!(changed, ["a", "b"]);
        assert_eq!(
            text,
            "limit a on x {\n  calls 1 per 1s\n  scope local # shared\n}\nlimit b on y {\n  scope local\n}\n"
        );
    }

    #[test]
    fn leaves_local_and_comments_alone() {
        let src = "# scope cluster is explained here\nlimit a on x {\n  scope local\n}\n";
        let (text, changed) = local_scope(src);
        assert!(changed.is_empty());
        assert_eq!(text, src);
    }
}
