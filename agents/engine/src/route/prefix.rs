//! The exact paths and prefixes of one router, grouped by their second
//! byte (issue 39: a path is compared only with the entries that share it,
//! as an exact path or a prefix of at least 2 bytes that a path equals or
//! starts with has the path's second byte), each group longest first (an
//! exact path before a prefix of its length), a slice per byte, then those
//! shorter than 2 bytes (`/`), which every path may meet. One scan finds the entry a path
//! meets, exact or prefix, with no hash of the path; a router with more
//! exact paths than [`SCANNED_EXACT`] keeps them in a hash map instead.

/// Up to this many exact paths, a router keeps them in its lists beside the
/// prefixes (a miss costs a word comparison each, less than a hash).
pub(super) const SCANNED_EXACT: usize = 16;

/// A router's exact paths (up to [`SCANNED_EXACT`]) and prefixes.
#[derive(Debug)]
pub(super) struct Prefixes {
    // INVARIANT: each group longest first (an exact path before a prefix of
    // its length, then by text).
    /// The entries of each second byte (a slice each, so that a path's
    /// group is two loads, no bounds to test).
    groups: Box<[Box<[Prefix]>; 256]>,
    /// The entries shorter than 2 bytes.
    short: Box<[Prefix]>,
}

impl Default for Prefixes {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Prefixes {
    pub(super) fn new(mut list: Vec<Prefix>) -> Self {
        list.sort_by(|a, b| {
            b.text
                .len()
                .cmp(&a.text.len())
                .then_with(|| b.exact().cmp(&a.exact()))
                .then_with(|| a.text.cmp(&b.text))
        });
        let mut groups: Box<[Vec<Prefix>; 256]> = Box::new(std::array::from_fn(|_| Vec::new()));
        let mut short = Vec::new();
        for p in list {
            match p.text.as_bytes().get(1) {
                Some(&b) => groups[usize::from(b)].push(p),
                None => short.push(p),
            }
        }
        Self {
            groups: Box::new(groups.map(Vec::into_boxed_slice)),
            short: short.into_boxed_slice(),
        }
    }

    /// The entry `path` meets: the exact path it equals, else the longest
    /// prefix it starts with (the first met holds every rule of the
    /// shorter ones the path meets); its node and whether it is plain, by
    /// reference (issue 39: one register, no flag to decode).
    #[inline]
    pub(super) fn find(&self, path: &[u8]) -> Option<&Met> {
        let head = head8(path);
        let group: &[Prefix] = match path.get(1) {
            Some(&b) => &self.groups[usize::from(b)],
            None => &[],
        };
        // The scan tests heads and lengths alone, and hands an entry longer
        // than its head on to `find_long` (issue 39: so it keeps no
        // register past its arguments, and its callers save none).
        let mut rest = group;
        while let [p, tail @ ..] = rest {
            if p.holds_head(path, head) {
                if p.text.len() <= 8 {
                    return Some(&p.met);
                }
                return self.find_long(rest, path);
            }
            rest = tail;
        }
        // Shorter than 2 bytes: the head is the whole text.
        (self.short.iter().find(|p| p.holds_head(path, head))).map(|p| &p.met)
    }

    /// [`Prefixes::find`] from `rest` (the tail of `path`'s group) on, its
    /// first entry's head met: each text compared whole. (Its head read
    /// again: five arguments, all in registers, so that `find` calls it in
    /// tail position.)
    #[inline(never)]
    fn find_long<'a>(&'a self, rest: &'a [Prefix], path: &[u8]) -> Option<&'a Met> {
        let head = head8(path);
        (rest.iter().chain(self.short.iter()))
            .find(|p| p.holds(path, head))
            .map(|p| &p.met)
    }

    /// The entries' lengths in the order they are tried in (by second byte).
    #[cfg(test)]
    pub(super) fn lens(&self) -> impl Iterator<Item = usize> + '_ {
        (self.groups.iter().flatten())
            .chain(self.short.iter())
            .map(|p| p.text.len())
    }
}

/// An exact path or a path prefix, and the rules it indexes.
#[derive(Debug)]
#[repr(C)]
pub(super) struct Prefix {
    /// Its node and whether the node is plain. First (issue 39: the scan's
    /// reference to it is the entry's own address, no offset added).
    met: Met,
    text: Box<str>,
    /// The first 8 bytes of `text` and the mask of those present: most
    /// entries are told apart by one word comparison.
    head: u64,
    mask: u64,
    /// How much longer than `text` a path that meets it may be: 0 for an
    /// exact path (issue 39: one comparison tests both lengths).
    span: usize,
}

/// What a request that meets an index entry meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Met {
    /// The rules of the entry and of every shorter prefix it starts with
    /// (its node in the router's `nodes`).
    pub(super) node: u32,
    /// Whether its node is plain (`Node::plain`): its plan is then the
    /// plan of every request that meets it.
    pub(super) plain: bool,
}

impl Prefix {
    /// The prefix `text`, or the exact path when `exact`.
    pub(super) fn new(text: &str, exact: bool, node: u32, plain: bool) -> Self {
        let n = text.len().min(8);
        Self {
            head: head8(text.as_bytes()),
            mask: if n == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * n)) - 1
            },
            span: if exact { 0 } else { usize::MAX - text.len() },
            met: Met { node, plain },
            text: text.into(),
        }
    }

    fn exact(&self) -> bool {
        self.span == 0
    }

    /// Whether `path` (whose `head8` is `path_head`) equals this exact path
    /// or starts with this prefix.
    #[inline]
    fn holds(&self, path: &[u8], path_head: u64) -> bool {
        self.holds_head(path, path_head)
            && (self.text.len() <= 8 || same_words(self.text.as_bytes(), path))
    }

    /// [`Prefix::holds`] by the head and the length alone: the whole test
    /// for a text of up to 8 bytes.
    #[inline]
    fn holds_head(&self, path: &[u8], path_head: u64) -> bool {
        // A path shorter than `text` wraps to more than any span.
        path_head & self.mask == self.head && path.len().wrapping_sub(self.text.len()) <= self.span
    }
}

/// Whether `path` starts with `text`, a text of at least 8 bytes,
/// compared a word at a time (the last word overlapping the one before)
/// rather than by `memcmp` (issue 39: a call would make the router's scan
/// keep registers for it).
#[inline]
fn same_words(text: &[u8], path: &[u8]) -> bool {
    let word = |s: &[u8], at: usize| {
        s.get(at..)
            .and_then(|s| s.first_chunk::<8>())
            .map(|w| u64::from_ne_bytes(*w))
    };
    let n = text.len();
    if path.len() < n || n < 8 {
        return false;
    }
    let mut at = 0;
    while at + 8 < n {
        if word(text, at) != word(path, at) {
            return false;
        }
        at += 8;
    }
    word(text, n - 8) == word(path, n - 8)
}

/// The first 8 bytes of `s`, zero-padded, as one word.
#[inline]
fn head8(s: &[u8]) -> u64 {
    if let Some(head) = s.first_chunk::<8>() {
        return u64::from_le_bytes(*head);
    }
    let mut word = 0u64;
    for (i, &b) in s.iter().enumerate() {
        word |= u64::from(b) << (8 * i);
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes(texts: &[&str]) -> Prefixes {
        Prefixes::new(
            texts
                .iter()
                .zip(0..)
                .map(|(t, i)| match t.strip_prefix('=') {
                    Some(exact) => Prefix::new(exact, true, i, true),
                    None => Prefix::new(t, false, i, true),
                })
                .collect(),
        )
    }

    /// The scan by heads and lengths meets what a plain search says (the
    /// exact path a path equals, else the longest prefix it starts with),
    /// over random texts of a few letters that share heads, are longer than
    /// 8 bytes and differ past their 8th byte, exact and prefix of one text
    /// alike, and paths made of their pieces (issue 39).
    #[test]
    fn the_scan_meets_what_a_plain_search_says() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..300 {
            let word = |next: &mut dyn FnMut(u64) -> u64| -> String {
                let len = next(14);
                (0..len)
                    .map(|_| ["/", "a", "b", "/a"][next(4) as usize])
                    .collect()
            };
            let mut texts: Vec<String> = Vec::new();
            for _ in 0..1 + next(12) {
                let text = word(&mut next);
                let text = if next(3) == 0 {
                    format!("={text}")
                } else {
                    text
                };
                if !texts.contains(&text) {
                    texts.push(text);
                }
            }
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let p = prefixes(&refs);
            let mut paths: Vec<String> = texts
                .iter()
                .map(|t| t.trim_start_matches('=').to_string())
                .collect();
            for _ in 0..30 {
                let base = &paths[next(paths.len() as u64) as usize];
                let cut = next(base.len() as u64 + 1) as usize;
                let path = format!("{}{}", &base[..cut], word(&mut next));
                paths.push(path);
            }
            for path in &paths {
                let exact = (refs.iter().zip(0..))
                    .find(|(t, _)| t.strip_prefix('=') == Some(path.as_str()));
                let longest = (refs.iter().zip(0..))
                    .filter(|(t, _)| !t.starts_with('=') && path.starts_with(**t))
                    .max_by_key(|(t, _)| t.len());
                let want = exact.or(longest).map(|(_, i)| i);
                let got = p.find(path.as_bytes()).map(|m| m.node);
                assert_eq!(got, want, "{path:?} in {refs:?}");
            }
        }
    }

    /// Grouped by second byte, a path still meets the longest prefix it
    /// starts with, a prefix shorter than 2 bytes last.
    #[test]
    fn a_path_meets_the_longest_prefix_it_starts_with() {
        let texts = [
            "/api",
            "/api/orders",
            "/b",
            "/",
            "/mdm/supplier/long/er",
            "/mdm",
        ];
        let p = prefixes(&texts);
        let met = |path: &str| p.find(path.as_bytes()).map(|m| texts[m.node as usize]);
        assert_eq!(met("/api/orders/7"), Some("/api/orders"));
        assert_eq!(met("/api/x"), Some("/api"));
        assert_eq!(met("/apx"), Some("/"));
        assert_eq!(
            met("/mdm/supplier/long/er/1"),
            Some("/mdm/supplier/long/er")
        );
        assert_eq!(met("/mdm/s"), Some("/mdm"));
        assert_eq!(met("/b"), Some("/b"));
        assert_eq!(met("/static"), Some("/"));
        assert_eq!(met("/"), Some("/"));
        assert_eq!(met(""), None);
        let api = prefixes(&["/api"]);
        assert!(api.find(b"/static").is_none());
        assert!(api.find(b"/").is_none());
        assert_eq!(
            api.find(b"/api"),
            Some(&Met {
                node: 0,
                plain: true
            })
        );
    }

    #[test]
    fn long_texts_are_compared_whole() {
        let text = b"/mdm/supplier/long/er";
        for n in 8..=text.len() {
            let t = &text[..n];
            assert!(same_words(t, text), "{n}");
            assert!(same_words(t, t), "{n}");
            assert!(!same_words(t, &text[..n - 1]), "{n}");
            for at in 0..n {
                let mut other = text.to_vec();
                other[at] ^= 1;
                assert!(!same_words(t, &other), "{n} {at}");
            }
        }
    }

    /// A longer text whose head a path meets but whose rest it does not
    /// passes the scan on to the shorter entries of its group, then to
    /// those shorter than 2 bytes (issue 39: compared out of line).
    #[test]
    fn a_long_text_met_by_its_head_alone_is_passed_over() {
        let texts = ["/mdm/supplier/long/er", "/mdm/supplier/x", "/mdm", "/"];
        let p = prefixes(&texts);
        let met = |path: &str| p.find(path.as_bytes()).map(|m| texts[m.node as usize]);
        assert_eq!(met("/mdm/supplier/long/eR"), Some("/mdm"));
        assert_eq!(met("/mdm/supplier/x/1"), Some("/mdm/supplier/x"));
        assert_eq!(met("/mdm/supplier/long/er"), Some("/mdm/supplier/long/er"));
        let p = prefixes(
            &texts[..1]
                .iter()
                .chain(&texts[3..])
                .copied()
                .collect::<Vec<_>>(),
        );
        assert_eq!(
            p.find(b"/mdm/supplier/lonG"),
            Some(&Met {
                node: 1,
                plain: true
            })
        );
        assert_eq!(
            p.find(b"/mdm/supplier/long/er/2"),
            Some(&Met {
                node: 0,
                plain: true
            })
        );
    }

    /// An exact path is met by that path alone, before a prefix of its
    /// length; a longer path goes on to the prefixes.
    #[test]
    fn an_exact_path_is_met_only_by_itself_and_first() {
        let texts = [
            "/api",
            "=/api",
            "=/api/orders/7",
            "=/api/orders/77777",
            "/api/orders",
            "=/",
            "/",
            "=/a",
        ];
        let p = prefixes(&texts);
        let met = |path: &str| p.find(path.as_bytes()).map(|m| texts[m.node as usize]);
        assert_eq!(met("/api"), Some("=/api"));
        assert_eq!(met("/api/"), Some("/api"));
        assert_eq!(met("/api/orders/7"), Some("=/api/orders/7"));
        assert_eq!(met("/api/orders/77777"), Some("=/api/orders/77777"));
        assert_eq!(met("/api/orders/7777"), Some("/api/orders"));
        assert_eq!(met("/api/orders/777777"), Some("/api/orders"));
        assert_eq!(met("/api/order"), Some("/api"));
        assert_eq!(met("/a"), Some("=/a"));
        assert_eq!(met("/ab"), Some("/"));
        assert_eq!(met("/"), Some("=/"));
        assert_eq!(met("/x"), Some("/"));
        assert_eq!(met(""), None);
    }
}
