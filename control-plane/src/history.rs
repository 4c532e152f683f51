//! How much of the applied history govd keeps: a count of versions and a
//! size. `state.json` stores each distinct source text once (by content
//! address, `store.rs`), so the size is that of the distinct texts: a
//! policy applied 50 times unchanged costs one copy, and a history of
//! large, ever-changing policies stops growing at `--history-bytes`.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash as _, Hasher as _};

use crate::store::HistoryEntry;

/// The bounds of the history. The version in force is always kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimit {
    /// Most versions kept (`govd --history`).
    pub entries: usize,
    /// Most bytes of distinct source text kept (`govd --history-bytes`).
    pub bytes: usize,
}

impl Default for HistoryLimit {
    fn default() -> Self {
        Self {
            entries: 50,
            bytes: 64 << 20,
        }
    }
}

/// Drops the oldest versions until `history` is within `limit` (never the
/// newest one).
pub fn bound(history: &mut VecDeque<HistoryEntry>, limit: HistoryLimit) {
    while history.len() > limit.entries.max(1) {
        history.pop_front();
    }
    // Each distinct text: how many sources hold it, and its size.
    let mut texts: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut total = 0usize;
    for entry in history.iter() {
        for s in &entry.sources {
            let (count, len) = texts.entry(key(&s.text)).or_insert((0, s.text.len()));
            if *count == 0 {
                total += *len;
            }
            *count += 1;
        }
    }
    while total > limit.bytes && history.len() > 1 {
        let Some(oldest) = history.pop_front() else {
            break;
        };
        for s in &oldest.sources {
            if let Some((count, len)) = texts.get_mut(&key(&s.text)) {
                *count -= 1;
                if *count == 0 {
                    total -= *len;
                }
            }
        }
    }
}

fn key(text: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// The history entry of `policy`, which changed `changed`.
pub fn entry(policy: &crate::store::AppliedPolicy, changed: &[String]) -> HistoryEntry {
    HistoryEntry {
        version: policy.version.clone(),
        who: policy.who.clone(),
        at_unix_ms: policy.at_unix_ms,
        services: changed.to_vec(),
        sources: policy.sources.clone(),
        source_refs: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Source;

    fn entry(i: usize, texts: &[String]) -> HistoryEntry {
        HistoryEntry {
            version: format!("v{i}"),
            who: "alice".into(),
            at_unix_ms: i as u64,
            services: Vec::new(),
            sources: texts
                .iter()
                .enumerate()
                .map(|(n, t)| Source {
                    name: format!("f{n}.gov"),
                    text: t.clone(),
                })
                .collect(),
            source_refs: Vec::new(),
        }
    }

    fn versions(h: &VecDeque<HistoryEntry>) -> Vec<String> {
        h.iter().map(|e| e.version.clone()).collect()
    }

    #[test]
    fn the_same_text_counts_once_and_new_texts_push_out_the_oldest_versions() {
        let limit = HistoryLimit {
            entries: 50,
            bytes: 1_000,
        };
        let big = "x".repeat(400);
        // 50 applies of one 400-byte text and a small one that alternates:
        // about 400 bytes, all 50 kept.
        let mut h: VecDeque<HistoryEntry> = (0..50)
            .map(|i| entry(i, &[big.clone(), format!("# {}", i % 2)]))
            .collect();
        bound(&mut h, limit);
        assert_eq!(h.len(), 50);
        // Three new 400-byte texts: only the newest versions that fit stay.
        for i in 50..53 {
            h.push_back(entry(i, &[format!("{i}").repeat(200)]));
            bound(&mut h, limit);
        }
        assert_eq!(versions(&h), ["v51", "v52"]);
        // One version larger than the bound alone is still kept.
        h.push_back(entry(53, &["y".repeat(5_000)]));
        bound(&mut h, limit);
        assert_eq!(versions(&h), ["v53"]);
        // The count bound holds too.
        bound(
            &mut h,
            HistoryLimit {
                entries: 0,
                bytes: 0,
            },
        );
        assert_eq!(h.len(), 1);
    }
}
