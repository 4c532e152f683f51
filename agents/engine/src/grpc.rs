//! gRPC over HTTP/2, as governing it needs: which requests are gRPC calls,
//! the deadline a caller sets (`grpc-timeout`), a call's outcome (its
//! `grpc-status`, in the trailers or a trailers-only response), and the
//! text of a rejection's `grpc-message`. Pure functions over headers and
//! bytes (the wire format is grpc/doc/PROTOCOL-HTTP2.md), read by
//! [`crate::Govern`] (which the sidecar's hyper path runs through) and by
//! [`crate::GovBody`]. Malformed values are
//! ignored (a deadline) or read as `UNKNOWN` (a status), as gRPC clients do;
//! nothing here panics on what a peer sends.

use std::time::Duration;

use gov_proto::v1::GrpcCode;
use http::{HeaderMap, HeaderName, Request, StatusCode, Version, header};

use crate::outcome::Outcome;

/// `grpc-status`: a call's status code, in the trailers (or the headers of
/// a trailers-only response).
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`: the status's text, percent-encoded.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-timeout`: the caller's deadline for the call.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A request that is a gRPC call: HTTP/2 with `content-type:
/// application/grpc` (or `application/grpc+proto`, `;...`). gRPC-Web
/// (`application/grpc-web`, trailers in the body) and HTTP/1 requests are
/// plain HTTP to the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcCall {
    /// The caller's `grpc-timeout`, when it is well formed.
    pub deadline: Option<Duration>,
}

impl GrpcCall {
    /// The gRPC call `req` is, if it is one.
    pub fn of<B>(req: &Request<B>) -> Option<Self> {
        Self::from_parts(req.version(), req.headers())
    }

    /// Whether a request of `version` with `headers` is a gRPC call (without
    /// reading its deadline).
    pub fn is(version: Version, headers: &HeaderMap) -> bool {
        version == Version::HTTP_2
            && headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| is_grpc_content_type(v.as_bytes()))
    }

    /// The gRPC call a request of `version` with `headers` is, if it is one.
    pub fn from_parts(version: Version, headers: &HeaderMap) -> Option<Self> {
        if !Self::is(version, headers) {
            return None;
        }
        let deadline = headers
            .get(GRPC_TIMEOUT)
            .and_then(|v| parse_timeout(v.as_bytes()));
        Some(GrpcCall { deadline })
    }
}

/// `application/grpc`, `application/grpc+FORMAT` or either with
/// parameters, case-insensitively; not `application/grpc-web`.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let Some(head) = value.get(..GRPC.len()) else {
        return false;
    };
    head.eq_ignore_ascii_case(GRPC) && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// The duration of a `grpc-timeout` value: at most 8 ASCII digits and one
/// unit (`H M S m u n`). `None` for anything else (no digits, more than 8, a
/// sign, another unit, spaces), which the caller then ignores: the rule's
/// own timeout still holds.
pub fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 99,999,999: no overflow in u64, nor below in any unit.
    let n = digits
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The code of a `grpc-status` value: a decimal number of a known code,
/// else `UNKNOWN` (what gRPC clients make of a status they cannot read).
pub fn parse_status(value: &[u8]) -> GrpcCode {
    let number = std::str::from_utf8(value)
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u32>().ok());
    number
        .and_then(gov_proto::grpc::from_number)
        .unwrap_or(GrpcCode::Unknown)
}

/// The outcome of a gRPC call known from its response head: its HTTP
/// status when that is not 200, its `grpc-status` when the response is
/// trailers-only; `None` when the status comes in the trailers.
pub fn head_outcome(status: StatusCode, headers: &HeaderMap) -> Option<Outcome> {
    if status != StatusCode::OK {
        return Some(Outcome::from(status));
    }
    headers
        .get(GRPC_STATUS)
        .map(|v| Outcome::Grpc(parse_status(v.as_bytes())))
}

/// The outcome a gRPC call's trailers carry, if they carry a status.
pub fn trailers_outcome(trailers: &HeaderMap) -> Option<Outcome> {
    trailers
        .get(GRPC_STATUS)
        .map(|v| Outcome::Grpc(parse_status(v.as_bytes())))
}

/// `grpc-message` text: percent-encodes every byte outside `0x20..=0x7e`
/// and `%` (PROTOCOL-HTTP2.md, "Responses").
pub fn encode_message(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_timeout(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_timeout(b"1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_timeout(b"7n"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_timeout(b"0m"), Some(Duration::ZERO));
        // The largest a caller may send, in the largest unit.
        assert_eq!(
            parse_timeout(b"99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
    }

    #[test]
    fn malformed_grpc_timeouts_are_ignored() {
        for bad in [
            &b""[..],
            b"m",
            b"100",
            b"100x",
            b"100 m",
            b" 100m",
            b"-100m",
            b"+100m",
            b"1.5S",
            b"123456789S",
            b"99999999999999999999999999H",
            b"\xff\xfem",
            b"1e3m",
        ] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn grpc_status_values() {
        assert_eq!(parse_status(b"0"), GrpcCode::Ok);
        assert_eq!(parse_status(b"14"), GrpcCode::Unavailable);
        assert_eq!(parse_status(b"16"), GrpcCode::Unauthenticated);
        for bad in [
            &b""[..],
            b"17",
            b"-1",
            b"UNAVAILABLE",
            b"14 ",
            b"0x0e",
            b"99999999999",
            b"\xff",
        ] {
            assert_eq!(parse_status(bad), GrpcCode::Unknown, "{bad:?}");
        }
    }

    #[test]
    fn grpc_content_types() {
        for ok in [
            &b"application/grpc"[..],
            b"application/grpc+proto",
            b"Application/GRPC;x=y",
        ] {
            assert!(is_grpc_content_type(ok));
        }
        for not in [
            &b"application/grpc-web"[..],
            b"application/grpcx",
            b"application/json",
            b"",
            b"app",
        ] {
            assert!(!is_grpc_content_type(not));
        }
    }

    #[test]
    fn only_http2_requests_are_grpc_calls() {
        let req = |version| {
            Request::builder()
                .version(version)
                .header("content-type", "application/grpc")
                .header("grpc-timeout", "250m")
                .body(())
                .unwrap()
        };
        assert_eq!(
            GrpcCall::of(&req(Version::HTTP_2)),
            Some(GrpcCall {
                deadline: Some(Duration::from_millis(250))
            })
        );
        assert_eq!(GrpcCall::of(&req(Version::HTTP_11)), None);
        // `is` says the same without the deadline.
        let h2 = req(Version::HTTP_2);
        assert!(GrpcCall::is(h2.version(), h2.headers()));
        let h1 = req(Version::HTTP_11);
        assert!(!GrpcCall::is(h1.version(), h1.headers()));
        let mut web = req(Version::HTTP_2);
        web.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc-web"),
        );
        assert!(!GrpcCall::is(web.version(), web.headers()));
        web.headers_mut().remove(http::header::CONTENT_TYPE);
        assert!(!GrpcCall::is(web.version(), web.headers()));
    }

    #[test]
    fn outcomes_from_heads_and_trailers() {
        let mut h = HeaderMap::new();
        assert_eq!(head_outcome(StatusCode::OK, &h), None);
        assert_eq!(
            head_outcome(StatusCode::BAD_GATEWAY, &h),
            Some(Outcome::Status(502))
        );
        h.insert(GRPC_STATUS, "5".parse().unwrap());
        assert_eq!(
            head_outcome(StatusCode::OK, &h),
            Some(Outcome::Grpc(GrpcCode::NotFound))
        );
        h.insert(GRPC_STATUS, "not a number".parse().unwrap());
        assert_eq!(trailers_outcome(&h), Some(Outcome::Grpc(GrpcCode::Unknown)));
        assert_eq!(trailers_outcome(&HeaderMap::new()), None);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(encode_message("rejected by a/b"), "rejected by a/b");
        assert_eq!(encode_message("50% é\n"), "50%25 %C3%A9%0A");
    }
}
