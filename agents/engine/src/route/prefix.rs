//! The prefixes of one router, grouped by their second byte (issue 39: a
//! path is compared only with the prefixes that share it, as a prefix of
//! at least 2 bytes that a path starts with has the path's second byte),
//! each group longest first, then those shorter than 2 bytes (`/`), which
//! every path may meet.

/// A router's prefixes.
#[derive(Debug)]
pub(super) struct Prefixes {
    // INVARIANT: the prefixes of each second byte together, longest first
    // (then by text), then those shorter than 2 bytes, longest first.
    list: Vec<Prefix>,
    /// Where each second byte's prefixes are in `list` (start, end).
    groups: Box<[(u32, u32); 256]>,
    /// Where the prefixes shorter than 2 bytes start in `list`.
    short: usize,
}

impl Default for Prefixes {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Prefixes {
    pub(super) fn new(mut list: Vec<Prefix>) -> Self {
        // The short ones last: key 256.
        let second = |p: &Prefix| p.text.as_bytes().get(1).map_or(256, |&b| usize::from(b));
        list.sort_by(|a, b| {
            second(a)
                .cmp(&second(b))
                .then_with(|| b.text.len().cmp(&a.text.len()))
                .then_with(|| a.text.cmp(&b.text))
        });
        let short = list
            .iter()
            .position(|p| p.text.len() < 2)
            .unwrap_or(list.len());
        let mut groups = Box::new([(0u32, 0u32); 256]);
        for (i, p) in list[..short].iter().enumerate() {
            // At most MAX_RULES prefixes, so the index fits.
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            let g = &mut groups[second(p)];
            if g.1 == 0 {
                g.0 = i;
            }
            g.1 = i + 1;
        }
        Self {
            list,
            groups,
            short,
        }
    }

    /// The node of the longest prefix `path` starts with: the first met
    /// holds every rule of the shorter ones the path meets.
    #[inline]
    pub(super) fn find(&self, path: &[u8]) -> Option<u32> {
        let head = head8(path);
        let (start, end) = match path.get(1) {
            Some(&b) => self.groups[usize::from(b)],
            None => (0, 0),
        };
        let group = &self.list[start as usize..end as usize];
        if let Some(p) = group.iter().find(|p| p.holds(path, head)) {
            return Some(p.node);
        }
        self.list[self.short..]
            .iter()
            .find(|p| p.holds(path, head))
            .map(|p| p.node)
    }

    /// The prefixes' lengths in the order they are tried in.
    #[cfg(test)]
    pub(super) fn lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.list.iter().map(|p| p.text.len())
    }
}

/// A path prefix and the rules it indexes.
#[derive(Debug)]
pub(super) struct Prefix {
    text: Box<str>,
    /// The first 8 bytes of `text` and the mask of those present: most
    /// prefixes are told apart by one word comparison.
    head: u64,
    mask: u64,
    /// The rules of this prefix and of every shorter one it starts with
    /// (its node in the router's `nodes`).
    node: u32,
}

impl Prefix {
    pub(super) fn new(text: &str, node: u32) -> Self {
        let n = text.len().min(8);
        Self {
            head: head8(text.as_bytes()),
            mask: if n == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * n)) - 1
            },
            text: text.into(),
            node,
        }
    }

    /// Whether `path` (whose `head8` is `path_head`) starts with this prefix.
    #[inline]
    fn holds(&self, path: &[u8], path_head: u64) -> bool {
        path_head & self.mask == self.head
            && path.len() >= self.text.len()
            && (self.text.len() <= 8 || path.starts_with(self.text.as_bytes()))
    }
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
                .map(|(t, i)| Prefix::new(t, i))
                .collect(),
        )
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
        let met = |path: &str| p.find(path.as_bytes()).map(|i| texts[i as usize]);
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
        assert_eq!(api.find(b"/static"), None);
        assert_eq!(api.find(b"/"), None);
        assert_eq!(api.find(b"/api"), Some(0));
    }
}
