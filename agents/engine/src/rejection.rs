//! Typed rejections and the one place they become HTTP responses, plain or
//! gRPC.
//!
//! Every rejection names the rule that rejected the call
//! (`gov-rejected-by: service/rule`), so an operator can trace any refused
//! request back to the `.gov` text. A rejected gRPC call is answered as
//! gRPC servers answer a failed one (a trailers-only response: HTTP 200,
//! `grpc-status`, `grpc-message`), so that its client reports the code
//! rather than a transport error.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gov_proto::v1 as proto;
use gov_proto::v1::{GrpcCode, RuleKind};
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// The response header that names the rejecting rule.
pub const REJECTED_BY: &str = "gov-rejected-by";

/// The request header the proxy stamps on a call that rules in mode
/// `shadow stamp` would have rejected (`service/rule`, comma-separated).
/// Only the agent writes it: a client's own is removed.
pub const WOULD_REJECT_BY: &str = "gov-would-reject-by";

/// The response header of an answer that no rule made but the caller's own
/// deadline (`grpc-timeout`, `gov-timeout`): [`DeadlineEnd::as_str`].
pub const DEADLINE_EXCEEDED: &str = "gov-deadline-exceeded";

/// How a caller's own deadline ended a call ([`Rejection::deadline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlineEnd {
    /// Used up before the call was admitted (on arrival, or while it waited
    /// for a permit): refused without taking one (doomed work).
    BeforeAdmission,
    /// Passed while the upstream worked on the admitted call.
    InFlight,
}

impl DeadlineEnd {
    /// The value of [`DEADLINE_EXCEEDED`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BeforeAdmission => "before-admission",
            Self::InFlight => "in-flight",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Self::BeforeAdmission => {
                "deadline exceeded: the caller's deadline was used up before the call was admitted"
            }
            Self::InFlight => "deadline exceeded: the caller's deadline passed before the response",
        }
    }
}

/// Why a call was rejected: the engine's side of the wire's
/// `RejectReason`, without its `Unspecified`. A reason is declared in
/// `control.proto` (gov-proto generates its count's readers from it) and
/// here: its variant, at the wire value minus one, in [`Self::ALL`] and in
/// [`Self::kind`]; the name and the wire form come from gov-proto, and
/// docs/metrics.md lists it under its kind (a test reads the list).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// No permit, and no waiting allowed (no `max_wait`, or the queue is full).
    BulkheadFull = 0,
    /// Waited `max_wait` without a permit.
    BulkheadTimeout = 1,
    /// Too many calls in the window (or the limit is engaged).
    LimitCalls = 2,
    /// Too many bytes in the window.
    LimitBytes = 3,
    /// The fuse is tripped (or half-open with every probe taken).
    FuseOpen = 4,
    /// The admitted call exceeded its timeout.
    Timeout = 5,
}

impl RejectReason {
    /// Number of reasons (array sizes): the wire's.
    pub const COUNT: usize = gov_proto::rejections::REASONS;

    /// Every reason, in index order (a test checks it against the wire's).
    pub const ALL: [RejectReason; Self::COUNT] = [
        RejectReason::BulkheadFull,
        RejectReason::BulkheadTimeout,
        RejectReason::LimitCalls,
        RejectReason::LimitBytes,
        RejectReason::FuseOpen,
        RejectReason::Timeout,
    ];

    /// The kind of rule that rejects for this reason: `/metrics` shows a rule
    /// only the reasons of its kind.
    pub fn kind(self) -> RuleKind {
        match self {
            // `Timeout`: the call outlived its bulkhead's per-call `timeout`.
            RejectReason::BulkheadFull | RejectReason::BulkheadTimeout | RejectReason::Timeout => {
                RuleKind::Bulkhead
            }
            RejectReason::LimitCalls | RejectReason::LimitBytes => RuleKind::Limit,
            RejectReason::FuseOpen => RuleKind::Fuse,
        }
    }

    /// The snake_case name used in metrics labels and the TUI.
    pub fn as_str(self) -> &'static str {
        gov_proto::rejections::NAMES[self as usize]
    }

    /// The wire form.
    pub fn to_proto(self) -> proto::RejectReason {
        proto::RejectReason::ALL[self as usize]
    }
}

/// A call the engine refused (or, for [`RejectReason::Timeout`], cut off).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("rejected by `{rule}`: {}", reason.as_str())]
pub struct Rejection {
    /// `service/rule`.
    pub rule: Arc<str>,
    pub reason: RejectReason,
    /// The configured status (408 bulkheads, 429 limits, 503 fuses, 504 timeouts by default).
    pub status: StatusCode,
    /// When the caller may retry (limits). Sent as `Retry-After` in whole seconds, rounded up.
    pub retry_after: Option<Duration>,
    /// The answer to a gRPC call (RESOURCE_EXHAUSTED limits, UNAVAILABLE
    /// bulkheads and fuses, DEADLINE_EXCEEDED timeouts by default).
    pub grpc: GrpcCode,
    /// The shadow rules that would have refused this call too, in decision
    /// order, among those decided before this rejection (empty without
    /// shadow rules: no allocation).
    pub would_reject: Vec<WouldReject>,
    /// The limit that refused the call, for the `RateLimit-Policy` and
    /// `RateLimit` headers (draft-ietf-httpapi-ratelimit-headers); `None`
    /// for bulkheads, fuses and timeouts.
    pub limit: Option<LimitPolicy>,
    /// Set when no rule ended the call but its caller's own deadline did
    /// (`rule` is empty then).
    pub deadline: Option<DeadlineEnd>,
}

/// What a refusing limit allows: `quota` per `window` (a token bucket's
/// rate), in calls or in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitPolicy {
    pub quota: u64,
    pub window: Duration,
    pub bytes: bool,
}

impl LimitPolicy {
    /// The `RateLimit-Policy` item of the limit `rule` (its window in whole
    /// seconds, a shorter window's quota scaled to one second;
    /// `qu="content-bytes"` for a bytes limit), and its `RateLimit` item
    /// when what is left (`remaining`) is known: `t`, the seconds until a
    /// call fits or the quota is whole again, when known.
    pub(crate) fn items(
        &self,
        rule: &str,
        remaining: Option<u64>,
        t: Option<u64>,
    ) -> (String, Option<String>) {
        let window_ms = u64::try_from(self.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let w = window_ms.div_ceil(1000).max(1);
        let quota = if window_ms % 1000 == 0 {
            self.quota
        } else {
            u64::try_from(u128::from(self.quota) * u128::from(w) * 1000 / u128::from(window_ms))
                .unwrap_or(u64::MAX)
        };
        let name = sf_string(rule);
        let unit = if self.bytes {
            ";qu=\"content-bytes\""
        } else {
            ""
        };
        let policy = format!("{name};q={quota};w={w}{unit}");
        let state = remaining.map(|r| match t {
            Some(t) => format!("{name};r={r};t={t}"),
            None => format!("{name};r={r}"),
        });
        (policy, state)
    }
}

/// `RateLimit-Policy`: the limit's quota per window, in whole seconds.
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";

/// `RateLimit`: what is left of it (nothing: the call was refused) and, when
/// known, the seconds until a call fits (`Retry-After`).
pub const RATELIMIT: &str = "ratelimit";

/// A rule in mode shadow that would have refused a call: the call went on.
/// On [`crate::Admission::would_reject`] and [`Rejection::would_reject`],
/// for logs of what a policy would do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WouldReject {
    /// `service/rule`.
    pub rule: Arc<str>,
    /// What it would have refused it for. A call that the rule would have
    /// made wait (a bulkhead's `max_wait`, a shaping limit) counts as
    /// refused for the reason a failed wait gives (`bulkhead_timeout`,
    /// `limit_calls`): a shadow rule never delays, so it cannot know
    /// whether the wait would have succeeded.
    pub reason: RejectReason,
}

/// `s` as a structured-field string (RFC 8941): `"`, with `\` and `"`
/// escaped and other characters outside printable ASCII dropped.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

impl Rejection {
    /// The answer to a call that its caller's own deadline ended (`end`):
    /// 504 or DEADLINE_EXCEEDED, naming no rule.
    pub fn caller_deadline(end: DeadlineEnd) -> Self {
        Rejection {
            rule: "".into(),
            reason: RejectReason::Timeout,
            status: StatusCode::GATEWAY_TIMEOUT,
            retry_after: None,
            grpc: GrpcCode::DeadlineExceeded,
            would_reject: Vec::new(),
            limit: None,
            deadline: Some(end),
        }
    }

    /// The `RateLimit-Policy` and `RateLimit` values of a limit's refusal:
    /// the policy is named by the rule, its window in whole seconds (a
    /// shorter window's quota scaled to one second); `qu="content-bytes"`
    /// for a bytes limit.
    pub fn ratelimit_headers(&self) -> Option<(String, String)> {
        let limit = self.limit?;
        let (policy, state) = limit.items(&self.rule, Some(0), self.retry_after_secs());
        Some((policy, state.unwrap_or_default()))
    }

    fn insert_ratelimit(&self, headers: &mut http::HeaderMap) {
        if let Some((policy, state)) = self.ratelimit_headers()
            && let (Ok(p), Ok(s)) = (
                HeaderValue::from_str(&policy),
                HeaderValue::from_str(&state),
            )
        {
            headers.insert(RATELIMIT_POLICY, p);
            headers.insert(RATELIMIT, s);
        }
    }

    /// The `Retry-After` value in whole seconds (rounded up, at least 1).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(|d| {
            let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            secs.max(1)
        })
    }

    /// The HTTP response for this rejection: the configured status,
    /// `gov-rejected-by: service/rule`, `Retry-After` when known, and a short
    /// plain-text body. The only place a rejection becomes HTTP.
    pub fn to_response(&self) -> Response<Full<Bytes>> {
        let body = format!("{}\n", self.text());
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        // Rule names come from the compiler (identifiers), but a hand-written
        // config could hold anything: never panic on a bad header value.
        if !self.rule.is_empty()
            && let Ok(value) = HeaderValue::from_str(&self.rule)
        {
            headers.insert(REJECTED_BY, value);
        }
        self.insert_deadline(headers);
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        self.insert_ratelimit(headers);
        response
    }

    fn insert_deadline(&self, headers: &mut http::HeaderMap) {
        if let Some(end) = self.deadline {
            headers.insert(DEADLINE_EXCEEDED, HeaderValue::from_static(end.as_str()));
        }
    }

    /// The response for this rejection of a call that is gRPC (`grpc`, see
    /// [`crate::grpc::GrpcCall`]) or not: [`Rejection::to_grpc_response`] or
    /// [`Rejection::to_response`].
    pub fn respond(&self, grpc: bool) -> Response<Full<Bytes>> {
        if grpc {
            self.to_grpc_response()
        } else {
            self.to_response()
        }
    }

    /// The text of the rejection (the plain body, the `grpc-message`).
    fn text(&self) -> String {
        if let Some(end) = self.deadline {
            return end.text().to_owned();
        }
        format!("rejected by {} ({})", self.rule, self.reason.as_str())
    }

    /// The gRPC form: HTTP 200 with no body (trailers-only), `content-type:
    /// application/grpc`, `grpc-status` the configured code, `grpc-message`
    /// naming the rule, `gov-rejected-by`, and `retry-after` when known.
    pub fn to_grpc_response(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::new()));
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(
            crate::grpc::GRPC_STATUS,
            HeaderValue::from(self.grpc as i32),
        );
        if let Ok(value) = HeaderValue::from_str(&crate::grpc::encode_message(&self.text())) {
            headers.insert(crate::grpc::GRPC_MESSAGE, value);
        }
        if !self.rule.is_empty()
            && let Ok(value) = HeaderValue::from_str(&self.rule)
        {
            headers.insert(REJECTED_BY, value);
        }
        self.insert_deadline(headers);
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        self.insert_ratelimit(headers);
        response
    }

    /// The response of [`Rejection::to_response`], encoded as an HTTP/1.1
    /// message at the end of `out` (the proxy's HTTP/1 path, which writes
    /// heads itself). `close` adds `connection: close`.
    pub fn write_http1(&self, out: &mut Vec<u8>, close: bool) {
        use std::io::Write;
        let text = self.text();
        // Writing to a Vec cannot fail.
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\ncontent-type: text/plain; charset=utf-8\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or("")
        );
        if !self.rule.is_empty() && HeaderValue::from_str(&self.rule).is_ok() {
            let _ = write!(out, "{REJECTED_BY}: {}\r\n", self.rule);
        }
        if let Some(end) = self.deadline {
            let _ = write!(out, "{DEADLINE_EXCEEDED}: {}\r\n", end.as_str());
        }
        if let Some(secs) = self.retry_after_secs() {
            let _ = write!(out, "retry-after: {secs}\r\n");
        }
        if let Some((policy, state)) = self.ratelimit_headers()
            && HeaderValue::from_str(&policy).is_ok()
            && HeaderValue::from_str(&state).is_ok()
        {
            let _ = write!(
                out,
                "{RATELIMIT_POLICY}: {policy}\r\n{RATELIMIT}: {state}\r\n"
            );
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        let _ = write!(out, "content-length: {}\r\n\r\n{text}\n", text.len() + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn every_reason_is_at_its_wire_index() {
        for (i, reason) in RejectReason::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, i, "{reason:?}");
            assert_eq!(reason.to_proto().index(), Some(i), "{reason:?}");
        }
        assert_eq!(RejectReason::FuseOpen.as_str(), "fuse_open");
    }

    /// docs/metrics.md names every reason under its kind, and no other, in
    /// the row of `gov_agent_rule_rejected_total` (`A rule has only the
    /// reasons of its kind: bulkhead `bulkhead_full` (...), ...; limit
    /// ...`): the one list of the reasons a reader of `/metrics` or the
    /// decision log sees, so a new reason is documented with its kind.
    #[test]
    fn the_metrics_doc_lists_every_reason_under_its_kind() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
        let doc = std::fs::read_to_string(path).expect("docs/metrics.md");
        let row = doc
            .lines()
            .find(|l| l.starts_with("| `gov_agent_rule_rejected_total` |"))
            .expect("docs/metrics.md has a row of `gov_agent_rule_rejected_total`");
        let (_, list) = row
            .split_once("the reasons of its kind: ")
            .expect("the row lists the reasons of each kind");
        let list = list.split(" |").next().unwrap_or(list);
        // What is in parentheses explains a reason; it names none.
        let mut plain = String::new();
        let mut depth = 0usize;
        for c in list.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                c if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        let mut listed: Vec<(String, String)> = Vec::new();
        for part in plain.trim_end().trim_end_matches('.').split(';') {
            let part = part.trim();
            let (kind, reasons) = part.split_once(' ').unwrap_or((part, ""));
            for reason in reasons.split('`').skip(1).step_by(2) {
                listed.push((kind.to_owned(), reason.to_owned()));
            }
        }
        listed.sort();
        let mut reasons: Vec<(String, String)> = RejectReason::ALL
            .iter()
            .map(|r| (r.kind().word().to_owned(), r.as_str().to_owned()))
            .collect();
        reasons.sort();
        assert_eq!(
            listed, reasons,
            "docs/metrics.md, `gov_agent_rule_rejected_total`: list each reason after its \
             kind's word (`KIND `reason`, `reason`; KIND ...`)"
        );
    }

    #[tokio::test]
    async fn response_names_the_rule() {
        let r = Rejection {
            rule: "order/crm_supplier".into(),
            reason: RejectReason::LimitCalls,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_millis(1200)),
            grpc: GrpcCode::ResourceExhausted,
            would_reject: Vec::new(),
            limit: None,
            deadline: None,
        };
        let resp = r.to_response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[REJECTED_BY], "order/crm_supplier");
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"rejected by order/crm_supplier (limit_calls)\n");
    }

    #[tokio::test]
    async fn the_http1_encoding_is_the_same_response() {
        let r = Rejection {
            rule: "order/crm_supplier".into(),
            reason: RejectReason::LimitCalls,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_millis(1200)),
            grpc: GrpcCode::ResourceExhausted,
            would_reject: Vec::new(),
            limit: None,
            deadline: None,
        };
        let mut out = Vec::new();
        r.write_http1(&mut out, true);
        let mut headers = [httparse::EMPTY_HEADER; 8];
        let mut parsed = httparse::Response::new(&mut headers);
        let head = match parsed.parse(&out).unwrap() {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("incomplete head"),
        };
        assert_eq!(parsed.code, Some(429));
        let get = |name: &str| {
            parsed
                .headers
                .iter()
                .find(|h| h.name == name)
                .map(|h| std::str::from_utf8(h.value).unwrap())
        };
        let resp = r.to_response();
        assert_eq!(get(REJECTED_BY), Some("order/crm_supplier"));
        assert_eq!(get("retry-after"), Some("2"));
        assert_eq!(get("connection"), Some("close"));
        assert_eq!(
            get("content-type"),
            resp.headers()[header::CONTENT_TYPE].to_str().ok()
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(get("content-length"), Some(&*body.len().to_string()));
        assert_eq!(&out[head..], &body[..]);
    }

    #[test]
    fn retry_after_is_at_least_one_second() {
        let mut r = Rejection {
            rule: "a/b".into(),
            reason: RejectReason::LimitCalls,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_millis(1)),
            grpc: GrpcCode::ResourceExhausted,
            would_reject: Vec::new(),
            limit: None,
            deadline: None,
        };
        assert_eq!(r.retry_after_secs(), Some(1));
        r.retry_after = Some(Duration::from_secs(7200));
        assert_eq!(r.retry_after_secs(), Some(7200));
        r.retry_after = None;
        assert!(r.to_response().headers().get(header::RETRY_AFTER).is_none());
    }

    /// The RateLimit pair names the rule, its quota per window in whole
    /// seconds (a shorter window's quota per second), bytes as
    /// `content-bytes`, and the seconds until a call fits; the same on every
    /// encoding; nothing for a refusal that is not a limit's.
    #[tokio::test]
    async fn a_limit_refusal_carries_the_ratelimit_headers() {
        let mut r = Rejection {
            rule: "order/crm_supplier".into(),
            reason: RejectReason::LimitCalls,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_millis(1200)),
            grpc: GrpcCode::ResourceExhausted,
            would_reject: Vec::new(),
            limit: Some(LimitPolicy {
                quota: 100,
                window: Duration::from_secs(60),
                bytes: false,
            }),
            deadline: None,
        };
        let policy = "\"order/crm_supplier\";q=100;w=60";
        let state = "\"order/crm_supplier\";r=0;t=2";
        for resp in [r.to_response(), r.to_grpc_response()] {
            assert_eq!(resp.headers()[RATELIMIT_POLICY], policy);
            assert_eq!(resp.headers()[RATELIMIT], state);
        }
        let mut out = Vec::new();
        r.write_http1(&mut out, false);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(&format!(
            "ratelimit-policy: {policy}\r\nratelimit: {state}\r\n"
        )));

        r.limit = Some(LimitPolicy {
            quota: 5,
            window: Duration::from_millis(100),
            bytes: true,
        });
        r.retry_after = None;
        assert_eq!(
            r.ratelimit_headers(),
            Some((
                "\"order/crm_supplier\";q=50;w=1;qu=\"content-bytes\"".into(),
                "\"order/crm_supplier\";r=0".into()
            ))
        );
        r.limit = None;
        assert!(r.to_response().headers().get(RATELIMIT).is_none());
        let mut out = Vec::new();
        r.write_http1(&mut out, false);
        assert!(!String::from_utf8(out).unwrap().contains("ratelimit"));
    }
}
