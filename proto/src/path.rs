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
//! The query is not part of the path and is never touched.

use std::borrow::Cow;

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
        }
    }
}

/// The normal form of `path` (without its query). Borrowed when `path` is already
/// normal, which is the common case and costs one pass over its bytes.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
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
    let segments = decoded.split('/').skip(1);
    let mut trailing = false;
    for segment in segments {
        trailing = false;
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
    Ok(Cow::Owned(out))
}

/// Whether `path` (starting with `/`) is already normal: no escape, no empty,
/// `.` or `..` segment. A `\` is an error (and [`decode_unreserved`] refuses
/// one after an early `false` too).
fn is_normal(path: &[u8]) -> Result<bool, PathError> {
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'\\' => return Err(PathError::Backslash),
            b'%' => return Ok(false),
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
/// others upper-cased.
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
    // Only ASCII was decoded and every other byte was copied: still UTF-8 when the
    // input was.
    String::from_utf8(out).map_err(|_| PathError::BadEscape)
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_paths_are_borrowed() {
        for p in ["/", "/lim", "/a/b/", "/a.b/c..d/.e", "/a/b;c", "/~x"] {
            assert!(
                matches!(normalize(p), Ok(Cow::Borrowed(q)) if q == p),
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
            assert_eq!(normalize(p).as_deref(), Ok("/lim"), "{p}");
        }
    }

    #[test]
    fn trailing_slashes_and_dots_keep_a_directory() {
        assert_eq!(normalize("/a/b/.").as_deref(), Ok("/a/b/"));
        assert_eq!(normalize("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(normalize("/a//").as_deref(), Ok("/a/"));
        assert_eq!(normalize("/.").as_deref(), Ok("/"));
        assert_eq!(normalize("//").as_deref(), Ok("/"));
        assert_eq!(normalize("/a/..").as_deref(), Ok("/"));
    }

    #[test]
    fn other_escapes_stay_encoded_with_upper_case_hex() {
        assert_eq!(normalize("/a%20b").as_deref(), Ok("/a%20b"));
        assert_eq!(normalize("/a%3fb%c3%a9").as_deref(), Ok("/a%3Fb%C3%A9"));
        // A decoded `%` stays a `%25`: no double decoding.
        assert_eq!(normalize("/%2541").as_deref(), Ok("/%2541"));
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        assert_eq!(normalize("/a%2fb"), Err(PathError::EncodedSlash));
        assert_eq!(normalize("/a%5Cb"), Err(PathError::EncodedSlash));
        assert_eq!(normalize("/a%2"), Err(PathError::BadEscape));
        assert_eq!(normalize("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(normalize("/x\\..\\lim"), Err(PathError::Backslash));
        assert_eq!(normalize("/x/..\\lim"), Err(PathError::Backslash));
        // A backslash after what makes the path not normal is still seen.
        assert_eq!(normalize("/%41/x\\y"), Err(PathError::Backslash));
        assert_eq!(normalize("//x\\y"), Err(PathError::Backslash));
        assert_eq!(normalize("/../lim"), Err(PathError::AboveRoot));
        assert_eq!(normalize("/a/../../lim"), Err(PathError::AboveRoot));
        assert_eq!(normalize("/%2e%2e/lim"), Err(PathError::AboveRoot));
        assert_eq!(normalize("lim"), Err(PathError::NotAbsolute));
        assert_eq!(normalize(""), Err(PathError::NotAbsolute));
    }

    #[test]
    fn normalizing_is_idempotent() {
        for p in ["//a/./b/../c%41%20", "/a/b/..", "/x//y/", "/%7e"] {
            let once = normalize(p).unwrap().into_owned();
            assert_eq!(normalize(&once).as_deref(), Ok(once.as_str()), "{p}");
        }
    }
}
