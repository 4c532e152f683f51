//! The headers a decision reads (the consumer header, and every header a rule
//! matches on: `header "x" = "v"`) must reach the upstream exactly as the
//! engine judged them. [`check`] refuses the spellings the engine and an
//! upstream would read differently (issue 29):
//!
//! - the header twice: the engine reads the first copy, an upstream may read
//!   the last or both joined (RFC 9110 section 5.3);
//! - a value with leading or trailing whitespace (malformed in HTTP/2, RFC
//!   9113 section 8.2.1): `"crm "` is another consumer to the engine, but
//!   `crm` to an HTTP/1.1 upstream, which trims it (RFC 9110 section 5.5);
//! - the name spelled with `_` for `-` (`x_gov_consumer`): CGI-style servers
//!   (WSGI, PHP, some Rack set-ups) read both as the same variable;
//! - `connection` naming it: the proxy would remove it as hop-by-hop (RFC
//!   9110 section 7.6.1), and the upstream would get no identity at all.
//!
//! The proxy answers each with 400 on both of its paths.

use http::{HeaderName, header};

use crate::route::Headers;

/// Why a request's judged headers cannot reach the upstream as judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum JudgedHeaderError {
    #[error("a header the policy judges appears more than once")]
    #[diagnostic(
        code(gov::agent::judged_header_twice),
        help("send the consumer header, and each header a rule matches on, once")
    )]
    Twice,
    #[error("a header the policy judges has leading or trailing whitespace")]
    #[diagnostic(
        code(gov::agent::judged_header_whitespace),
        help("send the value without surrounding spaces or tabs")
    )]
    Whitespace,
    #[error("a header the policy judges is spelled with `_` for `-`")]
    #[diagnostic(
        code(gov::agent::judged_header_underscore),
        help("spell the header name with `-`")
    )]
    Underscore,
    #[error("`connection` names a header the policy judges")]
    #[diagnostic(
        code(gov::agent::judged_header_connection),
        help(
            "the consumer header and the headers rules match on are end-to-end: do not list them in `connection`"
        )
    )]
    Connection,
}

impl JudgedHeaderError {
    /// The body of the 400 the proxy answers with.
    pub fn body(self) -> &'static str {
        match self {
            Self::Twice => {
                "gov-agent: the consumer header, or a header a rule matches on, appears more than once\n"
            }
            Self::Whitespace => {
                "gov-agent: the consumer header, or a header a rule matches on, has leading or trailing whitespace\n"
            }
            Self::Underscore => {
                "gov-agent: the consumer header, or a header a rule matches on, is spelled with `_`\n"
            }
            Self::Connection => {
                "gov-agent: `connection` names the consumer header or a header a rule matches on\n"
            }
        }
    }
}

/// Checks `headers` against `judged` (lower-case names, each once).
pub fn check(headers: Headers<'_>, judged: &[HeaderName]) -> Result<(), JudgedHeaderError> {
    match headers {
        Headers::Raw(raw) => {
            let mut seen = [false; 8];
            let mut seen_more: Vec<usize> = Vec::new();
            for h in raw {
                let name = h.name;
                if name.eq_ignore_ascii_case(header::CONNECTION.as_str()) {
                    connection(h.value, judged)?;
                    continue;
                }
                if name.contains('_') && judged.iter().any(|j| dashed_eq(name, j)) {
                    return Err(JudgedHeaderError::Underscore);
                }
                let Some(i) = judged
                    .iter()
                    .position(|j| name.eq_ignore_ascii_case(j.as_str()))
                else {
                    continue;
                };
                let first = match seen.get_mut(i) {
                    Some(s) => !std::mem::replace(s, true),
                    None if seen_more.contains(&i) => false,
                    None => {
                        seen_more.push(i);
                        true
                    }
                };
                if !first {
                    return Err(JudgedHeaderError::Twice);
                }
                value(h.value)?;
            }
        }
        Headers::Map(map) => {
            for v in map.get_all(header::CONNECTION) {
                connection(v.as_bytes(), judged)?;
            }
            for name in judged {
                let mut all = map.get_all(name).iter();
                if let Some(v) = all.next() {
                    value(v.as_bytes())?;
                }
                if all.next().is_some() {
                    return Err(JudgedHeaderError::Twice);
                }
            }
            if map.keys().any(|k| {
                k.as_str().contains('_') && judged.iter().any(|j| dashed_eq(k.as_str(), j))
            }) {
                return Err(JudgedHeaderError::Underscore);
            }
        }
    }
    Ok(())
}

fn value(v: &[u8]) -> Result<(), JudgedHeaderError> {
    let ws = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    if ws(v.first()) || ws(v.last()) {
        return Err(JudgedHeaderError::Whitespace);
    }
    Ok(())
}

fn connection(v: &[u8], judged: &[HeaderName]) -> Result<(), JudgedHeaderError> {
    let named = v.split(|&b| b == b',').map(|t| t.trim_ascii());
    for token in named {
        if judged
            .iter()
            .any(|j| token.eq_ignore_ascii_case(j.as_str().as_bytes()) || dashed_eq_b(token, j))
        {
            return Err(JudgedHeaderError::Connection);
        }
    }
    Ok(())
}

/// Whether `name` is `judged` with some `-` spelled `_`.
fn dashed_eq(name: &str, judged: &HeaderName) -> bool {
    dashed_eq_b(name.as_bytes(), judged)
}

fn dashed_eq_b(name: &[u8], judged: &HeaderName) -> bool {
    let j = judged.as_str().as_bytes();
    name.len() == j.len()
        && name.iter().zip(j).all(|(&a, &b)| {
            let a = if a == b'_' {
                b'-'
            } else {
                a.to_ascii_lowercase()
            };
            a == b
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn judged() -> Vec<HeaderName> {
        vec![
            HeaderName::from_static("x-gov-consumer"),
            HeaderName::from_static("x-tier"),
        ]
    }

    fn raw(pairs: &[(&'static str, &'static [u8])]) -> Result<(), JudgedHeaderError> {
        let headers: Vec<httparse::Header<'static>> = pairs
            .iter()
            .map(|&(name, value)| httparse::Header { name, value })
            .collect();
        check(Headers::Raw(&headers), &judged())
    }

    fn map(pairs: &[(&'static str, &'static [u8])]) -> Result<(), JudgedHeaderError> {
        let mut m = HeaderMap::new();
        for &(name, value) in pairs {
            m.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        check(Headers::Map(&m), &judged())
    }

    #[test]
    fn both_forms_agree() {
        use JudgedHeaderError::*;
        type Case<'a> = (&'a [(&'a str, &'a [u8])], Result<(), JudgedHeaderError>);
        let cases: &[Case<'_>] = &[
            (&[("X-Gov-Consumer", b"crm"), ("x-tier", b"gold")], Ok(())),
            (&[("x-other", b"a"), ("x-other", b"b")], Ok(())),
            (&[("x-other", b" a ")], Ok(())),
            (&[("connection", b"close, x-other")], Ok(())),
            (
                &[("x-gov-consumer", b"crm"), ("X-GOV-CONSUMER", b"web")],
                Err(Twice),
            ),
            (&[("x-tier", b"gold"), ("x-tier", b"gold")], Err(Twice)),
            (&[("x-gov-consumer", b"\tcrm")], Err(Whitespace)),
            (&[("x-gov-consumer", b"crm ")], Err(Whitespace)),
            (&[("x-tier", b" gold")], Err(Whitespace)),
            (&[("x_gov_consumer", b"web")], Err(Underscore)),
            (&[("x-gov_consumer", b"web")], Err(Underscore)),
            (
                &[("connection", b"keep-alive, X-Gov-Consumer")],
                Err(Connection),
            ),
            (&[("connection", b"x_tier")], Err(Connection)),
        ];
        for (pairs, want) in cases {
            let pairs: Vec<(&'static str, &'static [u8])> = pairs
                .iter()
                .map(|&(n, v)| -> (&'static str, &'static [u8]) {
                    (n.to_owned().leak(), v.to_vec().leak())
                })
                .collect();
            assert_eq!(raw(&pairs), *want, "raw {pairs:?}");
            assert_eq!(map(&pairs), *want, "map {pairs:?}");
        }
    }

    #[test]
    fn many_judged_headers_count_each() {
        let judged: Vec<HeaderName> = (0..12)
            .map(|i| HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap())
            .collect();
        let one = [httparse::Header {
            name: "x-h11",
            value: b"a",
        }];
        assert_eq!(check(Headers::Raw(&one), &judged), Ok(()));
        let two = [one[0], one[0]];
        assert_eq!(
            check(Headers::Raw(&two), &judged),
            Err(JudgedHeaderError::Twice)
        );
    }
}
