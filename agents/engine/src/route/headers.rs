//! Where the engine reads request headers from, and the header tests
//! routing makes: a name's value, whether any of a gate's names is present,
//! whether a name may have one of a set of lengths.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The bit of a length in a set of lengths: `len % 64` (lengths 64 apart
/// share one; the sets are filters, a shared bit only costs a comparison).
#[inline]
pub(super) fn len_bit(len: usize) -> u64 {
    1 << (len % 64)
}

/// Up to this many header names, a name is looked for by comparing them
/// before hashing it (a miss costs no hash).
const SCANNED_NAMES: usize = 16;

/// Where the engine reads request headers from: an `http::HeaderMap`, or the
/// headers of a head parsed in place by `httparse` (no map is built).
#[derive(Clone, Copy, Debug)]
pub enum Headers<'a> {
    Map(&'a HeaderMap),
    Raw(&'a [httparse::Header<'a>]),
}

impl<'a> Headers<'a> {
    /// The first value of `name`, as bytes.
    #[inline]
    pub fn get(&self, name: &HeaderName) -> Option<&'a [u8]> {
        match *self {
            Headers::Map(map) => {
                // Most requests lack the headers rules look for (`x-admin`),
                // and comparing a few names costs less than hashing one.
                if map.keys_len() <= SCANNED_NAMES && !map.keys().any(|k| k == name) {
                    return None;
                }
                map.get(name).map(HeaderValue::as_bytes)
            }
            Headers::Raw(raw) => raw
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name.as_str()))
                .map(|h| h.value),
        }
    }

    /// Whether any of `names` is present (`lens`: the [`len_bit`] of each
    /// name's length, so most request headers are passed over on their
    /// length alone).
    #[inline]
    pub(super) fn has_any(&self, names: &[HeaderName], lens: u64) -> bool {
        match *self {
            Headers::Map(map) if map.keys_len() <= SCANNED_NAMES => map
                .keys()
                .any(|k| lens & len_bit(k.as_str().len()) != 0 && names.contains(k)),
            Headers::Map(map) => names.iter().any(|n| map.contains_key(n)),
            Headers::Raw(raw) => raw.iter().any(|h| {
                lens & len_bit(h.name.len()) != 0
                    && names
                        .iter()
                        .any(|n| h.name.eq_ignore_ascii_case(n.as_str()))
            }),
        }
    }

    /// Whether a name may be one of those whose lengths' bits are set in
    /// `lens` ([`super::Router::miss_word`]'s upper half, in both halves: bit
    /// `len % 64` is then bit `len % 32` of the half): some name has such a
    /// length, or there are too many names to scan.
    #[inline]
    pub(crate) fn may_have(&self, lens: u64) -> bool {
        let has = |len: usize| lens >> (len % 64) & 1 != 0;
        match *self {
            Headers::Map(map) if map.keys_len() <= SCANNED_NAMES => {
                map.keys().any(|k| has(k.as_str().len()))
            }
            Headers::Map(_) => true,
            Headers::Raw(raw) => raw.iter().any(|h| has(h.name.len())),
        }
    }

    /// The first value of `name` when it is visible ASCII (as
    /// `HeaderValue::to_str` accepts), else `None`.
    pub fn get_str(&self, name: &HeaderName) -> Option<&'a str> {
        let value = self.get(name)?;
        if value.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
            std::str::from_utf8(value).ok()
        } else {
            None
        }
    }
}
