//! Header handling of the proxy: hop-by-hop headers and `x-forwarded-for`.
//!
//! Hop-by-hop headers describe one connection, not the message, so a proxy must not
//! forward them (RFC 9110 section 7.6.1): the fixed list below plus every header the
//! `connection` header names.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// `x-forwarded-for`, which `http` has no constant for.
pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The headers that are hop-by-hop whatever `connection` says.
pub(crate) static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The headers that frame or route a message: the agent writes these itself, and
/// `connection` can neither remove nor add them (both proxy paths).
pub(crate) static FRAMING: [HeaderName; 3] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::HOST,
];

/// Removes the hop-by-hop headers from `headers`. `te` is kept only as `te: trailers`,
/// the one value that must reach an HTTP/2 (gRPC) upstream.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // The common message has none of them: one pass over its names tells,
    // where a look-up per listed name hashes each (about 1,500 instructions
    // a call in issue 37's fixed-rate profile, request and response). A gRPC
    // request has `te` alone: only its value is checked (about 1,000 more).
    let mut te = false;
    for name in headers.keys() {
        match listed(name) {
            Listed::No => {}
            Listed::Te => te = true,
            Listed::HopByHop => {
                strip_listed(headers);
                return;
            }
        }
    }
    if te {
        strip_te(headers);
    }
}

/// Removes the fields `connection` names (but not [`FRAMING`]), those of
/// [`HOP_BY_HOP`], and `te` unless it is `te: trailers`.
fn strip_listed(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            if !FRAMING.contains(&name) {
                headers.remove(name);
            }
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    strip_te(headers);
}

/// Removes each `te` field that does not name `trailers` (as the HTTP/1
/// path does, a field at a time: a second `te: gzip` behind a
/// `te: trailers` is not forwarded with it).
fn strip_te(headers: &mut HeaderMap) {
    let keeps = |v: &HeaderValue| v.to_str().is_ok() && keeps_te(v.as_bytes());
    if headers.get_all(header::TE).iter().all(keeps) {
        return;
    }
    let kept: Vec<HeaderValue> = headers
        .get_all(header::TE)
        .iter()
        .filter(|v| keeps(v))
        .cloned()
        .collect();
    headers.remove(header::TE);
    for value in kept {
        headers.append(header::TE, value);
    }
}

/// Whether a field name is one [`strip_hop_by_hop`] looks at.
enum Listed {
    No,
    Te,
    HopByHop,
}

/// Which of `te` and [`HOP_BY_HOP`] `name` is: compared only when its length
/// is one of theirs (2, 7, 10, 16, 17, 18, 19), which most names' is not.
fn listed(name: &HeaderName) -> Listed {
    if !matches!(name.as_str().len(), 2 | 7 | 10 | 16..=19) {
        Listed::No
    } else if *name == header::TE {
        Listed::Te
    } else if HOP_BY_HOP.contains(name) {
        Listed::HopByHop
    } else {
        Listed::No
    }
}

/// Whether a `te` field with `value` is forwarded (both proxy paths): only
/// when it names `trailers`, the one value that must reach an HTTP/2 (gRPC)
/// upstream; it is then forwarded as sent.
pub(crate) fn keeps_te(value: &[u8]) -> bool {
    // What every gRPC client sends, checked before the general split.
    if value == b"trailers" {
        return true;
    }
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    value.split(|&b| b == b',').any(|t| {
        let start = t.iter().position(|b| !blank(b)).unwrap_or(t.len());
        let end = t.iter().rposition(|b| !blank(b)).map_or(start, |i| i + 1);
        t[start..end].eq_ignore_ascii_case(b"trailers")
    })
}

/// Appends the client address to `x-forwarded-for` (`peer` is the address already
/// rendered as a header value, once per connection).
pub(crate) fn append_forwarded_for(headers: &mut HeaderMap, peer: &HeaderValue) {
    match headers.get_mut(&X_FORWARDED_FOR) {
        None => {
            headers.insert(X_FORWARDED_FOR.clone(), peer.clone());
        }
        Some(existing) => {
            let mut joined = Vec::with_capacity(existing.len() + 2 + peer.len());
            joined.extend_from_slice(existing.as_bytes());
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(peer.as_bytes());
            if let Ok(value) = HeaderValue::from_bytes(&joined) {
                *existing = value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn strips_fixed_and_connection_named_headers() {
        let mut headers = map(&[
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "gzip"),
            ("host", "a"),
            ("x-kept", "2"),
        ]);
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "x-kept"]);
    }

    #[test]
    fn each_hop_by_hop_header_alone_among_end_to_end_ones_is_stripped() {
        // The one-pass test before any look-up must see every listed name.
        for name in HOP_BY_HOP.iter().map(HeaderName::as_str).chain(["te"]) {
            let mut headers = map(&[("host", "a"), (name, "gzip"), ("x-kept", "2")]);
            strip_hop_by_hop(&mut headers);
            let mut left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
            left.sort_unstable();
            assert_eq!(left, ["host", "x-kept"], "{name} was forwarded");
        }
        let mut plain = map(&[("host", "a"), ("accept", "*/*")]);
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain.len(), 2);
    }

    #[test]
    fn connection_cannot_remove_host_or_the_length() {
        let mut headers = map(&[
            ("connection", "host, content-length, x-a"),
            ("host", "a"),
            ("content-length", "3"),
            ("x-a", "1"),
        ]);
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "host"]);
    }

    #[test]
    fn keeps_te_trailers() {
        let mut headers = map(&[("te", "trailers")]);
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.get("te").unwrap(), "trailers");
    }

    #[test]
    fn te_found_before_a_hop_by_hop_field_does_not_end_the_look() {
        // `te` first (the map keeps insertion order): the pass must still
        // see the hop-by-hop fields after it, whatever `te` says.
        for (te, kept) in [("trailers", true), ("gzip", false)] {
            let mut headers = map(&[
                ("te", te),
                ("content-type", "application/grpc"),
                ("upgrade", "websocket"),
                ("keep-alive", "timeout=5"),
            ]);
            strip_hop_by_hop(&mut headers);
            let mut left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
            left.sort_unstable();
            let expected: &[&str] = if kept {
                &["content-type", "te"]
            } else {
                &["content-type"]
            };
            assert_eq!(left, expected, "te: {te}");
        }
    }

    #[test]
    fn a_grpc_request_keeps_te_trailers_and_its_fields() {
        let mut headers = map(&[
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", "1S"),
            ("user-agent", "grpc-python/1.85"),
        ]);
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 4);
        let mut headers = map(&[("te", " Trailers , deflate")]);
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.get("te").unwrap(), " Trailers , deflate");
    }

    #[test]
    fn each_te_field_is_judged_alone() {
        for fields in [["trailers", "gzip"], ["gzip", "trailers"]] {
            let mut headers = HeaderMap::new();
            for value in fields {
                headers.append(header::TE, HeaderValue::from_static(value));
            }
            headers.insert(header::HOST, HeaderValue::from_static("a"));
            strip_hop_by_hop(&mut headers);
            let te: Vec<_> = headers.get_all(header::TE).iter().collect();
            assert_eq!(te, ["trailers"], "{fields:?}");
            assert_eq!(headers.len(), 2);
        }
        let mut headers = HeaderMap::new();
        headers.append(header::TE, HeaderValue::from_static("gzip"));
        headers.append(header::TE, HeaderValue::from_static("deflate"));
        strip_hop_by_hop(&mut headers);
        assert!(headers.is_empty());
    }

    #[test]
    fn forwarded_for_is_set_then_appended() {
        let peer = HeaderValue::from_static("127.0.0.1");
        let mut headers = HeaderMap::new();
        append_forwarded_for(&mut headers, &peer);
        assert_eq!(headers.get(&X_FORWARDED_FOR).unwrap(), "127.0.0.1");
        let mut headers = map(&[("x-forwarded-for", "10.0.0.1")]);
        append_forwarded_for(&mut headers, &peer);
        assert_eq!(
            headers.get(&X_FORWARDED_FOR).unwrap(),
            "10.0.0.1, 127.0.0.1"
        );
    }
}
