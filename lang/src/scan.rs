//! What the parser, the diagnostics and the formatter share: the input
//! limits, and a scan of a source's code bytes and comments that knows
//! strings and comments without parsing.

use crate::ast::{Comment, Span};

/// Larger sources are refused before parsing.
pub const MAX_SOURCE_BYTES: usize = 4 * 1024 * 1024;

/// The deepest nesting of parentheses in a match expression.
pub const MAX_NESTING: usize = 64;

/// The most atoms (`path ...`, `method ...`, names) one match expression may
/// hold. The tree of a longer `a or b or ...` chain would be deep enough to
/// make recursive walks (drop, equality, the formatter) a stack risk.
pub const MAX_EXPR_TERMS: usize = 256;

/// The most syntax errors [`parse_all`](crate::parse_all) reports for one file.
pub const MAX_SYNTAX_ERRORS: usize = 20;

/// The bytes of `src` that are code: outside strings and comments. A string
/// ends at its closing quote or at the end of its line (strings cannot span
/// lines), a comment at the end of its line.
pub(crate) fn code_bytes(src: &str) -> impl Iterator<Item = (usize, u8)> + '_ {
    let bytes = src.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while let Some(&b) = bytes.get(i) {
            match b {
                b'"' => i = skip_string(bytes, i),
                b'#' => i = skip_line(bytes, i),
                _ => {
                    i += 1;
                    return Some((i - 1, b));
                }
            }
        }
        None
    })
}

/// Every comment in `src`, in order. Only meaningful for a source that parsed.
pub(crate) fn comments(src: &str) -> Vec<Comment> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => i = skip_string(bytes, i),
            b'#' => {
                let end = skip_line(bytes, i);
                let text = src.get(i + 1..end).unwrap_or("").trim_end();
                out.push(Comment {
                    text: text.to_owned(),
                    span: Span::new(i, i + 1 + text.len()),
                });
                i = end;
            }
            _ => i += 1,
        }
    }
    out
}

/// From the opening quote at `i` to just past the closing quote, or to the
/// line end of an unterminated string.
fn skip_string(bytes: &[u8], mut i: usize) -> usize {
    i += 1;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return i + 1,
            b'\n' => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// From `i` to the next `\n` (not included).
fn skip_line(bytes: &[u8], mut i: usize) -> usize {
    while let Some(&b) = bytes.get(i) {
        if b == b'\n' {
            return i;
        }
        i += 1;
    }
    bytes.len()
}
