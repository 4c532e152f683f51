//! Keys on request attributes (`per header "x-tenant", consumer`): the key
//! of one call, composed from its parts' values without allocating.
//!
//! The values come from the client, so each is bounded and encoded before
//! it names a counter (and, with `scope cluster`, a Redis key):
//! - a value is read as bytes and written with every byte outside
//!   `A-Z a-z 0-9 - . _ ~ @ + = / ! *` as `%XX` (upper-case hex), so a
//!   key holds no `|` (the separator of parts), no `:`, `{` or `}` (Redis
//!   key and hash-tag syntax), no space or control byte;
//! - a missing or empty value is [`ABSENT`]: every call without it shares
//!   one counter (never a budget of its own per call, never a refusal of a
//!   caller that does not send it);
//! - a value longer than [`MAX_VALUE`] bytes, or a query parameter sent
//!   twice, is [`INVALID`]: one more shared counter. Neither marker can be
//!   the encoding of a value (an encoded `%` is followed by two upper-case
//!   hex digits), so no value counts in a marker's counter.
//!
//! A header is read as the engine reads every header (name case-insensitive,
//! the first copy); a header a key reads is judged ([`crate::judged`]), so
//! a request carrying it twice, or with surrounding whitespace, is refused
//! before the decision. A query parameter is found by its decoded name
//! (`%XX` and `+` decoded, as form decoding does) and keyed by its decoded
//! value; a path segment is read from the normalized path the rules match
//! on ([`crate::path`]).

use http::HeaderName;

use crate::primitive::Keys;

/// The most parts a key has.
pub const MAX_KEY_PARTS: usize = 4;

/// The longest value (in bytes, decoded) a part keys on; a longer one is
/// [`INVALID`].
pub const MAX_VALUE: usize = 128;

/// The key value of a call without the attribute (missing or empty).
pub const ABSENT: &str = "%absent";

/// The key value of a call whose attribute is too long, or ambiguous (a
/// query parameter sent twice).
pub const INVALID: &str = "%invalid";

/// Room for the longest key: every part encoded at 3 bytes a byte, and the
/// separators.
const BUF: usize = MAX_KEY_PARTS * 3 * MAX_VALUE + MAX_KEY_PARTS;

/// One part of a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// The called service (outbound) or this one.
    Service,
    /// The consumer header's value.
    Consumer,
    /// A request header (gRPC metadata is a header too).
    Header(HeaderName),
    /// A query parameter, by its decoded name.
    Query(Box<str>),
    /// The segment after the longest of `prefixes` the path starts with.
    Segment {
        name: Box<str>,
        prefixes: Box<[Box<str>]>,
    },
    /// A string claim of the caller's verified token (`consumer from jwt`):
    /// the agent hands the verified claims to the engine
    /// ([`crate::request::RequestInfo::claims`]), never a client's header.
    Claim(Box<str>),
}

impl KeyPart {
    /// The part as the policy wrote it (`header "x-tenant"`).
    pub fn describe(&self) -> String {
        match self {
            KeyPart::Service => "service".into(),
            KeyPart::Consumer => "consumer".into(),
            KeyPart::Header(h) => format!("header \"{h}\""),
            KeyPart::Query(q) => format!("query \"{q}\""),
            KeyPart::Segment { name, .. } => format!("segment \"{name}\""),
            KeyPart::Claim(c) => format!("claim \"{c}\""),
        }
    }
}

/// A key being composed, on the stack.
pub(crate) struct KeyBuf {
    buf: [u8; BUF],
    len: usize,
}

impl KeyBuf {
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; BUF],
            len: 0,
        }
    }

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    fn push_str(&mut self, s: &str) {
        s.bytes().for_each(|b| self.push(b));
    }

    /// The key: ASCII by construction.
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or(INVALID)
    }
}

/// Whether `b` stands for itself in a key.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~@+=/!*".contains(&b)
}

/// Writes `bytes` encoded, or the marker it stands for.
fn value(out: &mut KeyBuf, bytes: Option<&[u8]>) {
    match bytes {
        None | Some([]) => out.push_str(ABSENT),
        Some(v) if v.len() > MAX_VALUE => out.push_str(INVALID),
        Some(v) => encode(out, v.iter().copied()),
    }
}

fn encode(out: &mut KeyBuf, bytes: impl Iterator<Item = u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in bytes {
        if plain(b) {
            out.push(b);
        } else {
            out.push(b'%');
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 15)]);
        }
    }
}

/// The key of a call with `keys`, written into `out`.
pub(crate) fn compose(parts: &[KeyPart], keys: &Keys<'_>, out: &mut KeyBuf) {
    out.len = 0;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b'|');
        }
        match part {
            KeyPart::Service => value(out, keys.target.map(str::as_bytes)),
            KeyPart::Consumer => value(out, keys.consumer.map(str::as_bytes)),
            KeyPart::Header(name) => value(out, keys.headers.get(name)),
            KeyPart::Segment { prefixes, .. } => value(out, segment(prefixes, keys.path)),
            KeyPart::Query(name) => query(out, keys.query, name.as_bytes()),
            KeyPart::Claim(name) => value(
                out,
                keys.claims
                    .iter()
                    .find(|(n, _)| n == &**name)
                    .map(|(_, v)| v.as_bytes()),
            ),
        }
    }
}

/// The segment of `path` after the longest of `prefixes` (sorted longest
/// first) it starts with, up to the next `/`.
fn segment<'a>(prefixes: &[Box<str>], path: &'a str) -> Option<&'a [u8]> {
    let prefix = prefixes.iter().find(|p| path.starts_with(&***p))?;
    let rest = &path.as_bytes()[prefix.len()..];
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Form decoding of one name or value: `+` is a space, `%XX` a byte; a `%`
/// not followed by two hex digits stands for itself.
fn decoded(raw: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let b = *raw.get(i)?;
        i += 1;
        Some(match b {
            b'+' => b' ',
            b'%' => match (
                raw.get(i).and_then(|&h| hex(h)),
                raw.get(i + 1).and_then(|&l| hex(l)),
            ) {
                (Some(h), Some(l)) => {
                    i += 2;
                    h << 4 | l
                }
                _ => b'%',
            },
            b => b,
        })
    })
}

fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Writes the value of the query parameter `name` of `query` (the part of
/// the target after `?`): [`ABSENT`] without one (or an empty value),
/// [`INVALID`] when it is sent twice (the upstream might read either copy)
/// or is longer than [`MAX_VALUE`] decoded.
fn query(out: &mut KeyBuf, query: &str, name: &[u8]) {
    let mut found: Option<&[u8]> = None;
    for pair in query.as_bytes().split(|&b| b == b'&') {
        let (n, v) = match pair.iter().position(|&b| b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        if !decoded(n).eq(name.iter().copied()) {
            continue;
        }
        if found.is_some() {
            out.push_str(INVALID);
            return;
        }
        found = Some(v);
    }
    match found {
        None => out.push_str(ABSENT),
        Some(v) => match decoded(v).count() {
            0 => out.push_str(ABSENT),
            n if n > MAX_VALUE => out.push_str(INVALID),
            _ => encode(out, decoded(v)),
        },
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::*;
    use crate::route::Headers;

    fn key(parts: &[KeyPart], headers: &HeaderMap, path: &str, query: &str) -> String {
        let claims = [("tenant".to_string(), "acme|eu".to_string())];
        let keys = Keys {
            claims: &claims,
            class: Default::default(),
            target: Some("orders"),
            consumer: Some("web"),
            instance: None,
            path,
            query,
            headers: Headers::Map(headers),
        };
        let mut out = KeyBuf::new();
        compose(parts, &keys, &mut out);
        out.as_str().to_string()
    }

    fn tenant() -> KeyPart {
        KeyPart::Header(HeaderName::from_static("x-tenant"))
    }

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn parts_compose_in_order_with_separators_no_value_can_forge() {
        let h = headers(&[("x-tenant", b"acme")]);
        let parts = [tenant(), KeyPart::Consumer, KeyPart::Service];
        assert_eq!(key(&parts, &h, "/", ""), "acme|web|orders");
        // A value holding the separator, Redis key syntax or a marker's
        // spelling is encoded: it cannot be another combination's key.
        let h = headers(&[("x-tenant", b"acme|web")]);
        assert_eq!(key(&[tenant()], &h, "/", ""), "acme%7Cweb");
        let h = headers(&[("x-tenant", b"a}:b{c %absent")]);
        assert_eq!(key(&[tenant()], &h, "/", ""), "a%7D%3Ab%7Bc%20%25absent");
        let h = headers(&[("x-tenant", b"caf\xc3\xa9\t")]);
        assert_eq!(key(&[tenant()], &h, "/", ""), "caf%C3%A9%09");
    }

    #[test]
    fn a_missing_empty_or_oversized_value_is_one_shared_marker() {
        let none = HeaderMap::new();
        assert_eq!(key(&[tenant()], &none, "/", ""), ABSENT);
        let empty = headers(&[("x-tenant", b"")]);
        assert_eq!(key(&[tenant()], &empty, "/", ""), ABSENT);
        let at_bound = vec![b'a'; MAX_VALUE];
        let h = headers(&[("x-tenant", &at_bound)]);
        assert_eq!(key(&[tenant()], &h, "/", "").len(), MAX_VALUE);
        let over = vec![b'a'; MAX_VALUE + 1];
        let h = headers(&[("x-tenant", &over)]);
        assert_eq!(key(&[tenant()], &h, "/", ""), INVALID);
        let huge = vec![b'x'; 60_000];
        let h = headers(&[("x-tenant", &huge)]);
        assert_eq!(
            key(&[tenant(), KeyPart::Consumer], &h, "/", ""),
            "%invalid|web"
        );
        // The longest key of the most parts fits the buffer.
        let worst = vec![b'}'; MAX_VALUE];
        let h = headers(&[("x-tenant", &worst)]);
        let k = key(&[tenant(), tenant(), tenant(), tenant()], &h, "/", "");
        assert_eq!(k.len(), 4 * 3 * MAX_VALUE + 3);
    }

    #[test]
    fn header_names_are_case_insensitive() {
        let mut h = HeaderMap::new();
        h.insert("X-Tenant", HeaderValue::from_static("acme"));
        assert_eq!(key(&[tenant()], &h, "/", ""), "acme");
        let raw = [httparse::Header {
            name: "X-TENANT",
            value: b"acme",
        }];
        let keys = Keys {
            target: None,
            consumer: None,
            instance: None,
            path: "/",
            query: "",
            headers: Headers::Raw(&raw),
            claims: &[],
            class: Default::default(),
        };
        let mut out = KeyBuf::new();
        compose(&[tenant()], &keys, &mut out);
        assert_eq!(out.as_str(), "acme");
    }

    #[test]
    fn query_parameters_are_found_and_keyed_decoded() {
        let q = |query: &str| {
            key(
                &[KeyPart::Query("api_key".into())],
                &HeaderMap::new(),
                "/",
                query,
            )
        };
        assert_eq!(q("a=1&api_key=k1&b=2"), "k1");
        // Percent-encoded and `+` spellings are the same parameter and value.
        assert_eq!(q("%61pi%5Fkey=k%31"), "k1");
        assert_eq!(q("api_key=a+b"), q("api_key=a%20b"));
        assert_eq!(q("api_key=a+b"), "a%20b");
        // A literal `%` that starts no escape stands for itself.
        assert_eq!(q("api_key=%zz"), q("api_key=%25zz"));
        // Not the parameter: a longer name, a prefix, another case.
        assert_eq!(q("api_key2=k1&xapi_key=k2&API_KEY=k3"), ABSENT);
        assert_eq!(q(""), ABSENT);
        assert_eq!(q("api_key"), ABSENT);
        assert_eq!(q("api_key="), ABSENT);
        // Twice, in any spelling: the upstream may read either, so neither.
        assert_eq!(q("api_key=victim&api_key=mine"), INVALID);
        assert_eq!(q("api_key=victim&api%5Fkey=mine"), INVALID);
        // Decoded length counts.
        let long = "%41".repeat(MAX_VALUE + 1);
        assert_eq!(q(&format!("api_key={long}")), INVALID);
        let fits = "%41".repeat(MAX_VALUE);
        assert_eq!(q(&format!("api_key={fits}")), "A".repeat(MAX_VALUE));
        // Separator and Redis syntax in a decoded value are encoded again.
        assert_eq!(q("api_key=a%7Cb%7D"), "a%7Cb%7D");
    }

    #[test]
    fn claims_are_read_from_the_verified_claims_only() {
        let h = headers(&[("tenant", b"forged")]);
        let c = |name: &str| key(&[KeyPart::Claim(name.into())], &h, "/", "");
        assert_eq!(c("tenant"), "acme%7Ceu");
        assert_eq!(c("region"), ABSENT);
    }

    #[test]
    fn segments_follow_the_longest_declared_prefix() {
        let part = KeyPart::Segment {
            name: "tenant".into(),
            prefixes: vec!["/t/admin/".into(), "/t/".into()].into(),
        };
        let s = |path: &str| key(std::slice::from_ref(&part), &HeaderMap::new(), path, "");
        assert_eq!(s("/t/acme/orders/1"), "acme");
        assert_eq!(s("/t/acme"), "acme");
        assert_eq!(s("/t/admin/zeta/x"), "zeta");
        assert_eq!(s("/t/"), ABSENT);
        assert_eq!(s("/t//x"), ABSENT);
        assert_eq!(s("/other/acme"), ABSENT);
        assert_eq!(s("/t/a%2Fb/x"), "a%252Fb");
    }
}
