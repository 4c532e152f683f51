//! A router's first test of a request's path: whether it can meet any of
//! the router's exact paths or prefixes at all, by one bit, before the
//! hash lookup and the prefix scan (issue 39: most requests of a service
//! with a few governed routes meet none, and pay only this).

/// The second byte of every exact path and prefix of one router, as a set:
/// a path meets an exact path or a prefix only when they have the same
/// second byte (the first is `/` for almost every one of them).
#[derive(Debug, Default)]
pub(crate) struct PathFilter {
    /// Bit `b` of the 256: some exact path or prefix has `b` as its second
    /// byte. An ASCII letter is set in both cases: a case-insensitive
    /// service's paths are compared folded to lower case, after this test.
    seconds: [u64; 4],
    /// Some exact path or prefix is shorter than 2 bytes (`/`): every path
    /// may meet it (every bit is set then too).
    short: bool,
}

impl PathFilter {
    /// Adds an exact path or a prefix of the router.
    pub(crate) fn add(&mut self, text: &str) {
        match text.as_bytes().get(1) {
            Some(&b) => {
                self.set(b.to_ascii_lowercase());
                self.set(b.to_ascii_uppercase());
            }
            None => {
                self.short = true;
                self.seconds = [u64::MAX; 4];
            }
        }
    }

    fn set(&mut self, b: u8) {
        self.seconds[usize::from(b >> 6)] |= 1 << (b & 63);
    }

    /// The set of second bytes as four words (bit `b & 63` of word `b >> 6`;
    /// every bit set when an entry is shorter than 2 bytes).
    pub(crate) fn words(&self) -> [u64; 4] {
        self.seconds
    }

    /// Whether `path` may meet an exact path or a prefix that was added
    /// (`false`: it meets none of them).
    #[inline]
    pub(crate) fn may_meet(&self, path: &[u8]) -> bool {
        match path.get(1) {
            Some(&b) => self.seconds[usize::from(b >> 6)] >> (b & 63) & 1 != 0,
            // A path shorter than 2 bytes meets only what is as short.
            None => self.short,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(texts: &[&str]) -> PathFilter {
        let mut f = PathFilter::default();
        for t in texts {
            f.add(t);
        }
        f
    }

    #[test]
    fn a_path_may_meet_only_what_has_its_second_byte() {
        let f = filter(&["/api", "/export", "/mdm/supplier"]);
        for path in [
            "/api",
            "/api/orders/7",
            "/apx",
            "/a",
            "/export",
            "/e",
            "/mdm",
            "/m",
        ] {
            assert!(f.may_meet(path.as_bytes()), "{path}");
        }
        for path in ["/static/app.js", "/", "", "/Zed", "/\u{e9}", "api", "x"] {
            assert!(!f.may_meet(path.as_bytes()), "{path}");
        }
    }

    #[test]
    fn letters_in_both_cases_other_bytes_as_they_are() {
        let f = filter(&["/api", "/_x", "/9"]);
        for path in ["/API", "/Api", "/_x", "/9"] {
            assert!(f.may_meet(path.as_bytes()), "{path}");
        }
        assert!(!f.may_meet(b"/-x"));
        assert!(!f.may_meet(b"/8"));
    }

    #[test]
    fn a_short_entry_lets_every_path_through() {
        for short in ["/", ""] {
            let f = filter(&["/api", short]);
            for path in ["/", "", "/static/app.js", "x", "/\u{ff}"] {
                assert!(f.may_meet(path.as_bytes()), "{short:?} {path:?}");
            }
        }
    }

    #[test]
    fn every_byte_value_is_its_own_bit() {
        for b in 0..=255u8 {
            let text = [b'/', b];
            let Ok(text) = std::str::from_utf8(&text) else {
                continue;
            };
            let f = filter(&[text]);
            for other in 0..=255u8 {
                let same = other.eq_ignore_ascii_case(&b);
                assert_eq!(f.may_meet(&[b'/', other]), same, "{b} {other}");
            }
        }
    }
}
