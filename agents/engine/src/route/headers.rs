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
            Headers::Map(map) => value_in(map, name).map(HeaderValue::as_bytes),
            Headers::Raw(raw) => raw
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name.as_str()))
                .map(|h| h.value),
        }
    }

    /// Whether `name` is present (a gate of one name: issue 39, its test
    /// neither passes over names by their length nor tells apart how many
    /// names it has).
    #[inline]
    pub(super) fn has(&self, name: &HeaderName) -> bool {
        match *self {
            // `name` on the left: see `has_any`.
            Headers::Map(map) if map.keys_len() <= SCANNED_NAMES => map.keys().any(|k| name == k),
            Headers::Map(map) => map.contains_key(name),
            Headers::Raw(raw) => raw
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case(name.as_str())),
        }
    }

    /// Whether any of `names` is present (`lens`: the [`len_bit`] of each
    /// name's length, so that with more than two names most request
    /// headers are passed over on their length alone).
    #[inline]
    pub(super) fn has_any(&self, names: &[HeaderName], lens: u64) -> bool {
        match *self {
            // Up to two names, each header's name is compared with them
            // whole (issue 39: a `HeaderName` compares its kind, then its
            // length, for less than reading a standard name's length costs).
            // The gate's name on the left: the compiler then tests its kind
            // once, not for every header.
            Headers::Map(map) if map.keys_len() <= SCANNED_NAMES => match names {
                [n] => map.keys().any(|k| n == k),
                [n, m] => map.keys().any(|k| n == k || m == k),
                _ => map
                    .keys()
                    .any(|k| lens & len_bit(k.as_str().len()) != 0 && names.contains(k)),
            },
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
        // A map's value is checked by `to_str`, which accepts the same
        // bytes (issue 39: once, not checked, then read again by
        // `from_utf8`).
        let value = match *self {
            Headers::Map(map) => return value_in(map, name)?.to_str().ok(),
            Headers::Raw(_) => self.get(name)?,
        };
        if value.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
            std::str::from_utf8(value).ok()
        } else {
            None
        }
    }
}

/// The first value of `name` in `map`.
#[inline]
fn value_in<'a>(map: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if map.len() > SCANNED_NAMES {
        return map.get(name);
    }
    // Comparing a few names costs less than hashing one, and the scan that
    // finds the name gives its value (issue 39: no hash for a consumer or a
    // header a rule matches on). The first value of a name is the first
    // the map yields with it. (`name` on the left: its kind is tested
    // once, see `has_any`.) Bounded by the values, not the names: the scan
    // visits each value, and a client may repeat one name hundreds of
    // times.
    map.iter().find(|&(k, _)| name == k).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// A name's first value, found by the scan of a few names or, with
    /// many, by the map's own lookup: the value `HeaderMap::get` gives, the
    /// first of several (issue 39).
    #[test]
    fn a_name_gives_its_first_value_scanned_or_looked_up() {
        for extra in [0, 20] {
            let mut map = HeaderMap::new();
            map.append("x-tenant", HeaderValue::from_static("gold"));
            for i in 0..extra {
                let name = HeaderName::from_bytes(format!("x-h{i:02}").as_bytes()).unwrap();
                map.insert(name, HeaderValue::from_static("1"));
            }
            map.append("accept", HeaderValue::from_static("*/*"));
            map.append("x-tenant", HeaderValue::from_static("silver"));
            map.append("x-gov-consumer", HeaderValue::from_static("crm"));
            let headers = Headers::Map(&map);
            for name in ["x-tenant", "accept", "x-gov-consumer", "x-admin", "cookie"] {
                let name = HeaderName::from_static(name);
                let want = map.get(&name).map(HeaderValue::as_bytes);
                assert_eq!(headers.get(&name), want, "{name} {extra}");
            }
            let tenant = HeaderName::from_static("x-tenant");
            assert_eq!(headers.get(&tenant), Some(&b"gold"[..]));
        }
        // One name repeated past the scan's bound: looked up, the first.
        let mut map = HeaderMap::new();
        map.append("x-tenant", HeaderValue::from_static("gold"));
        for _ in 0..30 {
            map.append("x-tenant", HeaderValue::from_static("silver"));
        }
        let tenant = HeaderName::from_static("x-tenant");
        assert_eq!(Headers::Map(&map).get(&tenant), Some(&b"gold"[..]));
        assert_eq!(
            Headers::Map(&map).get(&HeaderName::from_static("x-admin")),
            None
        );
    }

    /// A value as a string: visible ASCII (and tabs) only, from a map (by
    /// `to_str`) or a raw head alike.
    #[test]
    fn a_value_is_a_string_when_it_is_visible_ascii() {
        let name = HeaderName::from_static("x-gov-consumer");
        let values: [(&[u8], Option<&str>); 5] = [
            (b"crm", Some("crm")),
            (b"a\tb ~", Some("a\tb ~")),
            (b"", Some("")),
            ("caf\u{e9}".as_bytes(), None),
            (b"x\xff", None),
        ];
        for (value, want) in values {
            for extra in [0, 20] {
                let mut map = HeaderMap::new();
                for i in 0..extra {
                    let name = HeaderName::from_bytes(format!("x-h{i:02}").as_bytes()).unwrap();
                    map.insert(name, HeaderValue::from_static("1"));
                }
                map.insert(&name, HeaderValue::from_bytes(value).unwrap());
                assert_eq!(Headers::Map(&map).get_str(&name), want, "{value:?}");
            }
            let raw = [httparse::Header {
                name: "X-Gov-Consumer",
                value,
            }];
            assert_eq!(Headers::Raw(&raw).get_str(&name), want, "{value:?}");
        }
        assert_eq!(Headers::Map(&HeaderMap::new()).get_str(&name), None);
    }

    /// A gate of one name finds it in a scanned map, in a map with more
    /// names than are scanned and among raw headers in any case, standard
    /// names and custom ones alike, and no other name of its length
    /// (issue 39: tested apart from a gate of several names).
    #[test]
    fn a_gate_of_one_name_finds_exactly_it_however_the_headers_come() {
        let names = ["accept", "user-agent", "x-gov-consumer", "x-admim"];
        for extra in [0, 20] {
            let mut map = HeaderMap::new();
            for i in 0..extra {
                let name = HeaderName::from_bytes(format!("x-h{i:02}").as_bytes()).unwrap();
                map.insert(name, HeaderValue::from_static("1"));
            }
            for name in names {
                map.insert(HeaderName::from_static(name), HeaderValue::from_static("v"));
            }
            let raw: Vec<httparse::Header<'_>> = (names.iter())
                .map(|n| httparse::Header {
                    name: n,
                    value: b"v",
                })
                .collect();
            let upper: Vec<String> = names.iter().map(|n| n.to_ascii_uppercase()).collect();
            let raw_upper: Vec<httparse::Header<'_>> = (upper.iter())
                .map(|n| httparse::Header {
                    name: n,
                    value: b"v",
                })
                .collect();
            for (name, present) in [
                ("accept", true),
                ("x-gov-consumer", true),
                ("x-admim", true),
                ("x-admin", false),
                ("cookie", false),
                ("accept-encoding", false),
                ("x-gov-consumers", false),
            ] {
                let name = HeaderName::from_static(name);
                assert_eq!(Headers::Map(&map).has(&name), present, "{name} {extra}");
                assert_eq!(Headers::Raw(&raw).has(&name), present, "{name}");
                assert_eq!(Headers::Raw(&raw_upper).has(&name), present, "{name}");
            }
        }
    }

    /// A gate of one, two or more names finds any of them in a scanned
    /// map, standard names (a table entry) and custom ones alike, and
    /// nothing else: the names are compared whole, not by length alone.
    #[test]
    fn a_gate_finds_exactly_its_names_however_many() {
        let mut map = HeaderMap::new();
        for name in ["accept", "user-agent", "x-gov-consumer", "x-admim"] {
            map.insert(HeaderName::from_static(name), HeaderValue::from_static("v"));
        }
        let headers = Headers::Map(&map);
        let gate = |names: &[&'static str]| {
            let names: Vec<HeaderName> = names.iter().map(|n| HeaderName::from_static(n)).collect();
            let lens = names.iter().fold(0, |m, n| m | len_bit(n.as_str().len()));
            headers.has_any(&names, lens)
        };
        for names in [
            &["x-admin"][..],
            &["x-admin", "x-tenant"],
            &["x-admin", "x-tenant", "cookie"],
            &["accept-encoding", "x-gov-consumers"],
        ] {
            assert!(!gate(names), "{names:?}");
        }
        for names in [
            &["accept"][..],
            &["x-admin", "x-gov-consumer"],
            &["user-agent", "x-tenant"],
            &["x-admin", "x-tenant", "x-admim"],
        ] {
            assert!(gate(names), "{names:?}");
        }
    }
}
