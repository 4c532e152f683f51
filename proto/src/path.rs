//! Path normalization before matching (RFC 3986 section 6.2.2), as Envoy's
//! `normalize_path` and `merge_slashes` do.
//!
//! Part of the wire contract: a path in a `TargetConfig` match is compared with
//! the request's normalized path. The agent normalizes requests with it, and the
//! compiler refuses a match path that is not in normal form (it could never
//! match).
//!
//! A rule on `/lim` must see every spelling of `/lim` that an upstream would serve
//! as `/lim`: `//lim`, `/./lim`, `/x/../lim` and `/%6Cim` among them. Matching on
//! raw bytes lets a client walk around the rule. So the proxy normalizes the path
//! once, matches on the result, and sends the result upstream: the upstream serves
//! exactly the path the engine judged.
//!
//! The steps, in order:
//! 1. percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded
//!    (section 6.2.2.2), other escapes get upper-case hex digits (6.2.2.1);
//! 2. runs of `/` become one `/`;
//! 3. `.` and `..` segments are removed (section 5.2.4).
//!
//! A path that cannot be normalized without guessing is refused: a `\`, literal or
//! encoded, or an encoded `/` (upstreams disagree on whether they separate
//! segments), a broken escape, a `..` that climbs above the root, or a path that
//! does not start with `/`.
//!
//! **Path parameters** (`;` in a segment, RFC 3986 section 3.3). A Servlet
//! container (Tomcat, Jetty, Undertow, so Spring) removes each segment's
//! parameters before it removes dot segments, so `/x/..;/admin/`, `/.;/admin/`
//! and `/;x/admin/` are `/admin/` to it, and `/api;x/admin` is `/api/admin`
//! (which does not start with `/api/admin`). Without a declaration of how the
//! upstream reads them, a `;` is kept only where no reading moves a rule's
//! boundary, and refused elsewhere ([`PathError::Parameters`], [`Dialect::Strict`]):
//! - refused: a `;` in any segment but the last (`/a;jsessionid=1/b`), and a
//!   segment that is empty, `.` or `..` before its `;` (`/..;/`, `/.;x`, `/;x`);
//! - kept: a `;` in the last segment after a name (`/cart;jsessionid=1`): a
//!   `path prefix` rule that matches the path without the parameters matches
//!   it with them too. A `path exact` rule does not, so an upstream that
//!   strips them serves `/lim;x` as `/lim`: declare `paths servlet` there.
//!
//! With `paths servlet` ([`Dialect::Servlet`]) the path is read as a Servlet
//! container reads it (Jakarta Servlet 6.0 section 3.5.2, "URI Path
//! Canonicalization"; Servlet 4.0 and 5.0 section 3.5): each segment's
//! parameters are removed (from its first `;` on) before dot segments are, the
//! rules match the result and the upstream receives it, without parameters
//! (so `;jsessionid=` URL rewriting needs cookies instead).
//!
//! A percent-encoded `;` (`%3B`) is data, not a delimiter, as in Servlet
//! containers (which remove parameters before decoding), and stays encoded.
//!
//! **Double encoding**: `%25` (an encoded `%`) followed by two hex digits
//! (`/%252e%252e/admin`) is refused ([`PathError::DoubleEncoding`]): an upstream
//! that decodes twice would read a path the rules never saw (`/../admin`).
//!
//! **Case**: a path is case-sensitive (`/ADMIN` is not `/admin`) unless the
//! service declares `paths case-insensitive` (IIS; [`Reading`]). Then the rules
//! match [`fold_case`] of the normal form (ASCII letters in lower case, in the
//! rules too), and the upstream receives the normal form with its case as
//! sent, which it reads as the rules did. A letter outside ASCII whose case
//! mapping is an ASCII letter (`ı`, `ſ`, `K`, `İ`) is refused there
//! ([`PathError::CaseFold`]): an upstream folding with Unicode's tables would
//! read `/adm%C4%B1n` as `/ADMIN`.
//!
//! The query is not part of the path and is never touched.

use std::borrow::Cow;

use crate::v1::PathDialect;

/// How the upstream reads the `;` parameters of a path (`paths WORD`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// No declaration: a `;` that could change what the path names is refused.
    #[default]
    Strict,
    /// `paths servlet`: parameters removed from every segment, then dot segments.
    Servlet,
}

impl Dialect {
    /// Every dialect with its word in `paths WORD`.
    pub const WORDS: [(&'static str, Dialect); 2] =
        [("strict", Dialect::Strict), ("servlet", Dialect::Servlet)];

    /// Its word in `paths WORD`.
    pub fn word(self) -> &'static str {
        match self {
            Dialect::Strict => "strict",
            Dialect::Servlet => "servlet",
        }
    }

    /// The dialect `paths WORD` names.
    pub fn from_word(word: &str) -> Option<Self> {
        Self::WORDS
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, d)| *d)
    }
}

/// How a service reads request paths, all its `paths` words together
/// (`paths servlet case-insensitive`): the dialect of its `;` parameters, and
/// whether it reads letters case-insensitively (IIS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reading {
    /// How the `;` parameters are read.
    pub dialect: Dialect,
    /// `case-insensitive`: rules match the path with its ASCII letters folded
    /// to lower case ([`fold_case`]).
    pub case_insensitive: bool,
}

/// The `paths` word of a case-insensitive service.
pub const CASE_INSENSITIVE: &str = "case-insensitive";

impl From<Dialect> for Reading {
    fn from(dialect: Dialect) -> Self {
        Reading {
            dialect,
            case_insensitive: false,
        }
    }
}

impl Reading {
    /// Every word `paths` accepts.
    pub const WORDS: [&'static str; 3] = ["strict", "servlet", CASE_INSENSITIVE];

    /// Its words in `paths WORD...`; empty for the default.
    pub fn words(self) -> Vec<&'static str> {
        let mut words = Vec::new();
        if self.dialect != Dialect::Strict {
            words.push(self.dialect.word());
        }
        if self.case_insensitive {
            words.push(CASE_INSENSITIVE);
        }
        words
    }

    /// The wire value.
    pub fn to_wire(self) -> PathDialect {
        match (self.dialect, self.case_insensitive) {
            (Dialect::Strict, false) => PathDialect::Strict,
            (Dialect::Servlet, false) => PathDialect::Servlet,
            (Dialect::Strict, true) => PathDialect::StrictCaseInsensitive,
            (Dialect::Servlet, true) => PathDialect::ServletCaseInsensitive,
        }
    }

    /// The reading of a wire value; `None` for a value this build does not know.
    pub fn from_wire(value: i32) -> Option<Self> {
        let (dialect, case_insensitive) = match PathDialect::try_from(value).ok()? {
            PathDialect::Strict => (Dialect::Strict, false),
            PathDialect::Servlet => (Dialect::Servlet, false),
            PathDialect::StrictCaseInsensitive => (Dialect::Strict, true),
            PathDialect::ServletCaseInsensitive => (Dialect::Servlet, true),
        };
        Some(Reading {
            dialect,
            case_insensitive,
        })
    }
}

/// `path` with its ASCII letters in lower case, what the rules of a
/// case-insensitive service match (borrowed when it has no upper-case letter).
/// The letters of escapes fold too (`%C3` is `%c3`), in the request and in
/// the rules alike.
pub fn fold_case(path: &str) -> Cow<'_, str> {
    if path.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(path.to_ascii_lowercase())
    } else {
        Cow::Borrowed(path)
    }
}

/// The letters outside ASCII whose Unicode case mapping is an ASCII letter, in
/// the spellings a normal path has them (UTF-8, raw or percent-encoded): `İ`
/// (lower case `i`), `ı` (upper case `I`), `ſ` (upper case `S`), `K` (the
/// Kelvin sign, lower case `k`). A case-insensitive upstream that folds with
/// Unicode's tables may read `/adm%C4%B1n` as `/ADMIN`.
const FOLDS_TO_ASCII: [&str; 8] = [
    "%C4%B0",
    "%C4%B1",
    "%C5%BF",
    "%E2%84%AA",
    "\u{130}",
    "\u{131}",
    "\u{17f}",
    "\u{212a}",
];

/// Why a path cannot be normalized; the proxy answers 400.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum PathError {
    /// `%2F` or `%5C`: upstreams disagree on whether it separates segments.
    #[error("the path has an encoded `/` or `\\`")]
    #[diagnostic(code(gov::path::encoded_slash))]
    EncodedSlash,
    /// `%` not followed by two hex digits.
    #[error("the path has a `%` that is not followed by two hex digits")]
    #[diagnostic(code(gov::path::bad_escape))]
    BadEscape,
    /// A `..` segment above the root.
    #[error("the path climbs above the root with `..`")]
    #[diagnostic(code(gov::path::above_root))]
    AboveRoot,
    /// The path does not start with `/`.
    #[error("the path does not start with `/`")]
    #[diagnostic(code(gov::path::not_absolute))]
    NotAbsolute,
    /// A literal `\`: some upstreams read it as `/` (so `/x\..\lim` is `/lim`).
    #[error("the path has a `\\`")]
    #[diagnostic(code(gov::path::backslash))]
    Backslash,
    /// A `;` where an upstream that strips path parameters reads another path
    /// than the rules would (`/x/..;/admin`, `/;x/admin`, `/api;x/admin`).
    #[error("the path has a `;` parameter that changes what the path names")]
    #[diagnostic(
        code(gov::path::parameters),
        help(
            "declare how the service reads them (`paths servlet`), or send the path without them"
        )
    )]
    Parameters,
    /// `%25` followed by two hex digits: another path to an upstream that
    /// decodes twice.
    #[error("the path has a double-encoded escape (`%25` followed by two hex digits)")]
    #[diagnostic(code(gov::path::double_encoding))]
    DoubleEncoding,
    /// In a case-insensitive service (`paths case-insensitive`), a letter
    /// outside ASCII whose case mapping is an ASCII letter (`ı` is `I` upper
    /// case): the rules fold ASCII only, an upstream may fold more.
    #[error(
        "the path has a letter whose upper or lower case is an ASCII letter (`ı`, `ſ`, `K`, `İ`)"
    )]
    #[diagnostic(code(gov::path::case_fold), help("spell the path with ASCII letters"))]
    CaseFold,
}

impl PathError {
    /// A short plain-text body for the 400 answer.
    pub fn body(self) -> &'static str {
        match self {
            PathError::EncodedSlash => "gov-agent: the path has an encoded `/` or `\\`\n",
            PathError::BadEscape => "gov-agent: the path has a broken percent-escape\n",
            PathError::AboveRoot => "gov-agent: the path climbs above the root with `..`\n",
            PathError::NotAbsolute => "gov-agent: the path does not start with `/`\n",
            PathError::Backslash => "gov-agent: the path has a `\\`\n",
            PathError::Parameters => {
                "gov-agent: the path has a `;` parameter that changes what the path names\n"
            }
            PathError::DoubleEncoding => "gov-agent: the path has a double-encoded escape\n",
            PathError::CaseFold => {
                "gov-agent: the path has a letter whose case is an ASCII letter (`ı`, `ſ`, `K`, `İ`)\n"
            }
        }
    }
}

/// The normal form of `path` (without its query) for an upstream that reads
/// paths as `reading` says (a [`Dialect`] alone: case-sensitive). Borrowed when
/// `path` is already normal, which is the common case and costs one pass over
/// its bytes. The case is kept: a case-insensitive service's rules match
/// [`fold_case`] of the result.
pub fn normalize(path: &str, reading: impl Into<Reading>) -> Result<Cow<'_, str>, PathError> {
    let reading = reading.into();
    let normal = normalize_dialect(path, reading.dialect)?;
    if reading.case_insensitive
        && normal.bytes().any(|b| b == b'%' || !b.is_ascii())
        && FOLDS_TO_ASCII.iter().any(|s| normal.contains(s))
    {
        return Err(PathError::CaseFold);
    }
    Ok(normal)
}

fn normalize_dialect(path: &str, dialect: Dialect) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    if is_normal(bytes)? {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(bytes)?;
    let mut out = String::with_capacity(decoded.len());
    // The segments kept so far, as end offsets into `out` of each `/` that starts one.
    let mut starts: Vec<usize> = Vec::new();
    let mut segments = decoded.split('/').skip(1).peekable();
    let mut trailing = false;
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        trailing = false;
        let segment = match (segment.split_once(';'), dialect) {
            (None, _) => segment,
            // Servlet section 3.5.2 step 4: the parameters go, then dot segments.
            (Some((name, _)), Dialect::Servlet) => name,
            // Parameters are kept only on a named last segment (module doc).
            (Some((name, _)), Dialect::Strict) => {
                if !last || matches!(name, "" | "." | "..") {
                    return Err(PathError::Parameters);
                }
                segment
            }
        };
        match segment {
            // Merged slashes; a `/` at the very end keeps the trailing slash.
            "" => trailing = true,
            "." => trailing = true,
            ".." => {
                let start = starts.pop().ok_or(PathError::AboveRoot)?;
                out.truncate(start);
                trailing = true;
            }
            _ => {
                starts.push(out.len());
                out.push('/');
                out.push_str(segment);
            }
        }
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    if out == path {
        return Ok(Cow::Borrowed(path));
    }
    Ok(Cow::Owned(out))
}

/// Whether `path` (starting with `/`) is already normal: no escape, no `;`, no
/// empty, `.` or `..` segment. A `\` is an error (and [`decode_unreserved`]
/// refuses one after an early `false` too).
fn is_normal(path: &[u8]) -> Result<bool, PathError> {
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'\\' => return Err(PathError::Backslash),
            // The rare `;` is judged segment by segment in `normalize`.
            b'%' | b';' => return Ok(false),
            b'/' => {
                // What follows this `/` up to the next one.
                let rest = &path[i + 1..];
                let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
                let segment = &rest[..end];
                let last = end == rest.len();
                if (segment.is_empty() && !last) || segment == b"." || segment == b".." {
                    return Ok(false);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(true)
}

/// `path` with escapes of unreserved characters decoded and the hex digits of the
/// others upper-cased. An encoded `%` followed by two hex digits, once decoded
/// (`%2541`, `%25%34%31`), is refused.
fn decode_unreserved(path: &[u8]) -> Result<String, PathError> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'\\' {
            return Err(PathError::Backslash);
        }
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            path.get(i + 1).and_then(|&h| hex(h)),
            path.get(i + 2).and_then(|&l| hex(l)),
        ) else {
            return Err(PathError::BadEscape);
        };
        let c = hi << 4 | lo;
        if c == b'/' || c == b'\\' {
            return Err(PathError::EncodedSlash);
        }
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c);
        } else {
            out.push(b'%');
            out.push(path[i + 1].to_ascii_uppercase());
            out.push(path[i + 2].to_ascii_uppercase());
        }
        i += 3;
    }
    if out
        .windows(5)
        .any(|w| w.starts_with(b"%25") && hex(w[3]).is_some() && hex(w[4]).is_some())
    {
        return Err(PathError::DoubleEncoding);
    }
    // Only ASCII was decoded and every other byte was copied: still UTF-8 when the
    // input was.
    String::from_utf8(out).map_err(|_| PathError::BadEscape)
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::Dialect::{Servlet, Strict};
    use super::*;

    #[test]
    fn normal_paths_are_borrowed() {
        for p in ["/", "/lim", "/a/b/", "/a.b/c..d/.e", "/a/b;c", "/~x"] {
            assert!(
                matches!(normalize(p, Strict), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
    }

    #[test]
    fn every_spelling_of_a_path_normalizes_to_it() {
        for p in [
            "//lim",
            "/./lim",
            "/%6cim",
            "/%6Cim",
            "/x/../lim",
            "///x//..//lim",
            "/%2e/lim",
            "/x/%2E%2E/lim",
            "/x/./../lim",
        ] {
            assert_eq!(normalize(p, Strict).as_deref(), Ok("/lim"), "{p}");
        }
    }

    #[test]
    fn trailing_slashes_and_dots_keep_a_directory() {
        assert_eq!(normalize("/a/b/.", Strict).as_deref(), Ok("/a/b/"));
        assert_eq!(normalize("/a/b/..", Strict).as_deref(), Ok("/a/"));
        assert_eq!(normalize("/a//", Strict).as_deref(), Ok("/a/"));
        assert_eq!(normalize("/.", Strict).as_deref(), Ok("/"));
        assert_eq!(normalize("//", Strict).as_deref(), Ok("/"));
        assert_eq!(normalize("/a/..", Strict).as_deref(), Ok("/"));
    }

    #[test]
    fn other_escapes_stay_encoded_with_upper_case_hex() {
        assert_eq!(normalize("/a%20b", Strict).as_deref(), Ok("/a%20b"));
        assert_eq!(
            normalize("/a%3fb%c3%a9", Strict).as_deref(),
            Ok("/a%3Fb%C3%A9")
        );
        // A decoded `%` stays a `%25` when no hex digits follow it.
        assert_eq!(normalize("/%25zz", Strict).as_deref(), Ok("/%25zz"));
        assert_eq!(normalize("/%25", Strict).as_deref(), Ok("/%25"));
        assert_eq!(normalize("/%25%3F", Strict).as_deref(), Ok("/%25%3F"));
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        assert_eq!(normalize("/a%2fb", Strict), Err(PathError::EncodedSlash));
        assert_eq!(normalize("/a%5Cb", Strict), Err(PathError::EncodedSlash));
        assert_eq!(normalize("/a%2", Strict), Err(PathError::BadEscape));
        assert_eq!(normalize("/a%zz", Strict), Err(PathError::BadEscape));
        assert_eq!(normalize("/x\\..\\lim", Strict), Err(PathError::Backslash));
        assert_eq!(normalize("/x/..\\lim", Strict), Err(PathError::Backslash));
        // A backslash after what makes the path not normal is still seen.
        assert_eq!(normalize("/%41/x\\y", Strict), Err(PathError::Backslash));
        assert_eq!(normalize("//x\\y", Strict), Err(PathError::Backslash));
        assert_eq!(normalize("/../lim", Strict), Err(PathError::AboveRoot));
        assert_eq!(normalize("/a/../../lim", Strict), Err(PathError::AboveRoot));
        assert_eq!(normalize("/%2e%2e/lim", Strict), Err(PathError::AboveRoot));
        assert_eq!(normalize("lim", Strict), Err(PathError::NotAbsolute));
        assert_eq!(normalize("", Strict), Err(PathError::NotAbsolute));
    }

    #[test]
    fn parameters_that_change_what_a_path_names_are_refused() {
        for p in [
            // Dot segments with parameters: `/admin/` to a Servlet container.
            "/x/..;/admin/",
            "/x/..;x=1/admin/",
            "/.;/admin/",
            "/.;x/admin",
            "/x/%2e%2e;/admin/",
            "/x/.%2E;/admin/",
            // An empty segment with parameters.
            "/;x/admin/",
            "/;/admin",
            "//;x/admin",
            // Parameters on a segment before the last move a prefix boundary.
            "/api;x/admin",
            "/a;jsessionid=1/b",
            "/admin;x/",
            "/a;b/..",
            // A last segment that is only a dot segment with parameters.
            "/admin/..;",
            "/admin/.;x",
            "/admin/;x",
        ] {
            assert_eq!(normalize(p, Strict), Err(PathError::Parameters), "{p}");
        }
    }

    #[test]
    fn parameters_on_a_named_last_segment_are_kept() {
        for p in [
            "/cart;jsessionid=A1",
            "/a/b;c",
            "/lim;",
            "/a/b;c;d=e",
            "/a/b;..",
        ] {
            assert!(
                matches!(normalize(p, Strict), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
        assert_eq!(normalize("//a/%62;x", Strict).as_deref(), Ok("/a/b;x"));
        // An encoded `;` is data: it stays encoded and delimits nothing.
        assert_eq!(normalize("/..%3B/a", Strict).as_deref(), Ok("/..%3B/a"));
        assert_eq!(normalize("/a%3bx/b", Strict).as_deref(), Ok("/a%3Bx/b"));
    }

    #[test]
    fn a_servlet_upstream_has_the_parameters_removed_before_the_dot_segments() {
        // Jakarta Servlet 6.0 section 3.5.2, steps 4 and 7.
        for (p, normal) in [
            ("/x/..;/admin/", "/admin/"),
            ("/x/..;x=1/admin/", "/admin/"),
            ("/.;/admin/", "/admin/"),
            ("/;x/admin/", "/admin/"),
            ("/api;x/admin", "/api/admin"),
            ("/a;jsessionid=1/b", "/a/b"),
            ("/cart;jsessionid=A1", "/cart"),
            ("/admin;x/", "/admin/"),
            ("/admin/..;", "/"),
            ("/x/%2e%2e;/admin", "/admin"),
            ("/a/b;..", "/a/b"),
            ("/lim;", "/lim"),
        ] {
            assert_eq!(normalize(p, Servlet).as_deref(), Ok(normal), "{p}");
        }
        // A `..` with parameters still cannot climb above the root, an encoded
        // `;` is data, and the other refusals hold.
        assert_eq!(normalize("/..;/admin", Servlet), Err(PathError::AboveRoot));
        assert_eq!(normalize("/a%3Bx/b", Servlet).as_deref(), Ok("/a%3Bx/b"));
        assert_eq!(
            normalize("/%2541;x", Servlet),
            Err(PathError::DoubleEncoding)
        );
        assert_eq!(
            normalize("/a;x%2F/b", Servlet),
            Err(PathError::EncodedSlash)
        );
        assert_eq!(normalize("/lim", Servlet), Ok(Cow::Borrowed("/lim")));
    }

    #[test]
    fn dialects_have_one_word_and_readings_one_wire_value_each() {
        for (word, dialect) in Dialect::WORDS {
            assert_eq!(Dialect::from_word(word), Some(dialect));
            assert_eq!(dialect.word(), word);
        }
        assert_eq!(Dialect::from_word("tomcat"), None);
        let mut wire = std::collections::HashSet::new();
        for (_, dialect) in Dialect::WORDS {
            for case_insensitive in [false, true] {
                let reading = Reading {
                    dialect,
                    case_insensitive,
                };
                assert!(wire.insert(reading.to_wire()));
                assert_eq!(Reading::from_wire(reading.to_wire() as i32), Some(reading));
                assert!(reading.words().iter().all(|w| Reading::WORDS.contains(w)));
            }
        }
        assert_eq!(Reading::default().words(), Vec::<&str>::new());
        assert_eq!(Reading::from_wire(99), None);
    }

    #[test]
    fn a_case_insensitive_reading_keeps_the_case_and_refuses_letters_that_fold_to_ascii() {
        let ci = |dialect| Reading {
            dialect,
            case_insensitive: true,
        };
        // Normalized as before, case kept: the rules match the folded form.
        assert_eq!(normalize("/%41dmin/", ci(Strict)).as_deref(), Ok("/Admin/"));
        assert_eq!(
            normalize("/x/..;/ADMIN/", ci(Servlet)).as_deref(),
            Ok("/ADMIN/")
        );
        assert_eq!(
            normalize("/ADMIN;x/", ci(Strict)),
            Err(PathError::Parameters)
        );
        assert_eq!(
            normalize("/%2561dmin", ci(Strict)),
            Err(PathError::DoubleEncoding)
        );
        assert_eq!(fold_case("/ADMIN/%C3%A9"), "/admin/%c3%a9");
        assert!(matches!(fold_case("/admin"), Cow::Borrowed(_)));
        for p in [
            "/adm%C4%B1n",
            "/adm%c4%b1n/",
            "/adm\u{131}n",
            "/%E2%84%AAey",
            "/ba%C5%BFket",
            "/%C4%B0ndex",
        ] {
            assert_eq!(normalize(p, ci(Strict)), Err(PathError::CaseFold), "{p}");
            assert_eq!(normalize(p, ci(Servlet)), Err(PathError::CaseFold), "{p}");
            assert!(normalize(p, Strict).is_ok(), "{p}");
        }
        // Other letters outside ASCII pass.
        assert!(normalize("/caf%C3%A9", ci(Strict)).is_ok());
    }

    #[test]
    fn double_encoded_escapes_are_refused() {
        for p in [
            "/%2541",
            "/%252e%252e/admin",
            "/%252F",
            "/a/%25%34%31",
            "/%25%32%35%34%31",
            "/x%25ff",
        ] {
            assert_eq!(normalize(p, Strict), Err(PathError::DoubleEncoding), "{p}");
        }
    }

    #[test]
    fn normalizing_is_idempotent() {
        for dialect in [Strict, Servlet] {
            for p in ["//a/./b/../c%41%20", "/a/b/..", "/x//y/", "/%7e", "/a/b;c"] {
                let once = normalize(p, dialect).unwrap().into_owned();
                assert_eq!(
                    normalize(&once, dialect).as_deref(),
                    Ok(once.as_str()),
                    "{p}"
                );
            }
        }
    }
}
