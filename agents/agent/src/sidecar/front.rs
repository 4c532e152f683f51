//! The request front both proxy paths share: what happens to a request head
//! between its parse and the engine's decision, once.
//!
//! The HTTP/1 path ([`super::h1`]) parses a head in place with `httparse`;
//! hyper's path ([`super::proxy`]) gets an `http::Request`. Both are a
//! [`HeadView`], and [`front`] runs the same steps on either, in order:
//!
//! 1. **refuse** what is ambiguous ([`HeadView::refuse`], with the one set of
//!    refusals below: [`Refusal`] and its messages, [`one_host`],
//!    [`one_framing`], [`underscored_framing`]), then the headers the engine
//!    judges that the upstream would read otherwise
//!    ([`gov_engine::Engine::check_judged`]);
//! 2. **normalize** the path before matching (in the same step: the codec
//!    normalizes while it parses, hyper's side rewrites the request's URI);
//! 3. what the path does not serve ([`HeadView::unserved`]: hyper's upgrade
//!    and `CONNECT` answers; the HTTP/1 path hands those requests to hyper);
//! 4. the **consumer**, as sent or verified by the agent
//!    ([`super::listener::Shared::identify`]);
//! 5. an outbound call's **target service** ([`target_service`]) and its
//!    **instance**, picked before the decision because per-instance rules key
//!    on it;
//! 6. the engine's **request**: [`Front::info`] builds the
//!    [`RequestInfo`] the HTTP/1 path admits; on hyper's path
//!    [`Front::apply`] hands the same parts (claims, [`CallTarget`], the
//!    [`Pick`]) to the engine's `Govern`, which builds it from the request.
//!
//! The retry rule's decisions ([`retries`], [`holds_body`]) are shared here
//! too; the one difference between the paths is a parameter
//! (see [`retries`]).

use http::{Method, StatusCode};

use super::consumer::Identity;
use super::listener::{Failure, Shared, Side, path_reading, target_service};
use super::mtls::Caller;
use super::upstream::Pick;
use gov_engine::engine::Target;
use gov_engine::path::{PathError, Reading};
use gov_engine::{CallTarget, Direction, Headers, Outcome, RequestInfo, RetryPolicy};

/// Most header fields of a request head (more: 431, as Envoy's default), on
/// both paths (an HTTP/2 request over it is one stream refused).
pub(crate) const MAX_HEADERS: usize = 100;

/// Why the agent refuses a request before anything of it goes upstream. The answer
/// closes the connection: after a framing error nothing that follows on it can be
/// trusted to start a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// 400, with a short reason.
    BadRequest(&'static str),
    /// 431: too many header fields or too large a head.
    HeadTooLarge,
    /// 501: a transfer coding other than `chunked`.
    UnknownCoding,
}

impl Refusal {
    /// `content_length` or `transfer_encoding` ([`underscored_framing`]).
    pub(crate) const UNDERSCORED: Refusal =
        Refusal::BadRequest("gov-agent: a framing header is spelled with `_`\n");
    /// HTTP/1.1 without `host` (RFC 9112 section 3.2).
    pub(crate) const NO_HOST: Refusal =
        Refusal::BadRequest("gov-agent: an HTTP/1.1 request needs a `host` header\n");
    /// More than one `host` (RFC 9112 section 3.2).
    pub(crate) const HOSTS: Refusal =
        Refusal::BadRequest("gov-agent: the request has more than one `host` header\n");
    /// A `host` that is no `uri-host [ ":" port ]` ([`valid_authority`]).
    pub(crate) const BAD_HOST: Refusal =
        Refusal::BadRequest("gov-agent: the `host` is malformed\n");
    /// Both framings (RFC 9112 section 6.3 (3)).
    pub(crate) const BOTH_FRAMINGS: Refusal = Refusal::BadRequest(
        "gov-agent: the request has both `content-length` and `transfer-encoding`\n",
    );
    /// Several lengths, even equal (RFC 9112 section 6.3 (5)).
    pub(crate) const LENGTHS: Refusal =
        Refusal::BadRequest("gov-agent: the request has more than one `content-length`\n");
    /// A target that makes no origin-form.
    pub(crate) const BAD_TARGET: Refusal = Refusal::BadRequest("gov-agent: bad request target\n");

    /// The status and short body of the answer.
    pub(crate) fn answer(self) -> (StatusCode, &'static str) {
        match self {
            Refusal::BadRequest(body) => (StatusCode::BAD_REQUEST, body),
            Refusal::HeadTooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "gov-agent: the request head is too large\n",
            ),
            Refusal::UnknownCoding => (
                StatusCode::NOT_IMPLEMENTED,
                "gov-agent: only the `chunked` transfer coding is supported\n",
            ),
        }
    }
}

impl From<PathError> for Refusal {
    fn from(error: PathError) -> Self {
        Refusal::BadRequest(error.body())
    }
}

/// The `host` rule (RFC 9112 section 3.2): at most one, exactly one when
/// `needs_one` (HTTP/1.1), and a valid one (`valid`: the value, and the
/// target's authority when there is one).
pub(crate) fn one_host(count: usize, valid: bool, needs_one: bool) -> Result<(), Refusal> {
    match count {
        0 if needs_one => Err(Refusal::NO_HOST),
        0 | 1 if valid => Ok(()),
        0 | 1 => Err(Refusal::BAD_HOST),
        _ => Err(Refusal::HOSTS),
    }
}

/// The framing rule (RFC 9112 section 6.3): never a transfer coding
/// (`coding`) beside a length, and at most one length (`lengths` fields).
pub(crate) fn one_framing(coding: bool, lengths: usize) -> Result<(), Refusal> {
    if coding && lengths > 0 {
        // Section 6.3 (3) lets a server reject both rather than guess: the
        // classic request smuggling shape.
        return Err(Refusal::BOTH_FRAMINGS);
    }
    if lengths > 1 {
        return Err(Refusal::LENGTHS);
    }
    Ok(())
}

/// Whether `name` is `content-length` or `transfer-encoding` spelled with `_`
/// for `-`: some servers read `_` as `-`, and would frame the body by a field
/// the agent did not.
pub(crate) fn underscored_framing(name: &[u8]) -> bool {
    let dashed = |b: &u8| {
        if *b == b'_' {
            b'-'
        } else {
            b.to_ascii_lowercase()
        }
    };
    (name.len() == 14 || name.len() == 17)
        && name.contains(&b'_')
        && (name
            .iter()
            .map(dashed)
            .eq(b"content-length".iter().copied())
            || name
                .iter()
                .map(dashed)
                .eq(b"transfer-encoding".iter().copied()))
}

/// Whether `host` is a valid `uri-host [ ":" port ]` (RFC 3986 section 3.2.2): no
/// user info, no path, no whitespace or control bytes. May be empty.
pub(crate) fn valid_authority(host: &str) -> bool {
    host.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&b))
}

/// A request head as the front reads it: the HTTP/1 path's checked
/// `httparse` head, or hyper's `http::Request`.
pub(crate) trait HeadView {
    fn method(&self) -> &Method;
    /// The normalized path (what rules match), once [`HeadView::refuse`] passed.
    fn path(&self) -> &str;
    /// The query, after `?` (empty without one).
    fn query(&self) -> &str;
    /// The header fields as the client sent them.
    fn headers(&self) -> Headers<'_>;
    /// The host the request names: the target's authority (absolute form, or
    /// HTTP/2's `:authority`), which replaces `host` (RFC 9112 section
    /// 3.2.2), else `host`.
    fn host(&self) -> Option<&str>;
    /// Steps 1 and 2: refuses what is ambiguous and normalizes the path as
    /// the upstream reads paths (`reading`, asked only by a head that
    /// needs it). The HTTP/1 codec decides both while it parses (one pass
    /// over the bytes), so its head arrives here checked.
    fn refuse(&mut self, reading: impl FnOnce() -> Reading) -> Result<(), Refusal> {
        let _ = reading;
        Ok(())
    }
    /// Step 3: the answer to a request this path does not forward as a call.
    fn unserved(&mut self) -> Result<(), Answer> {
        Ok(())
    }
}

/// An answer the agent makes itself instead of forwarding the request.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A refused head: counted, answered, and the connection closes.
    Refused(Refusal),
    /// `consumer from ... on invalid reject`: 401 with this text.
    Unauthenticated(String),
    /// The request cannot be forwarded.
    Failure(Failure),
}

impl From<Refusal> for Answer {
    fn from(refusal: Refusal) -> Self {
        Answer::Refused(refusal)
    }
}

/// What the front learned of a request: its consumer, and for an outbound
/// call the instance picked.
pub(crate) struct Front {
    pub(crate) identity: Identity,
    pub(crate) pick: Option<Pick>,
}

/// Steps 1 to 5 on `head`, arrived through `side`'s listener from `caller`
/// (the calling agent, inbound mutual TLS).
pub(crate) fn front(
    shared: &Shared,
    side: Side,
    caller: Option<&Caller>,
    head: &mut impl HeadView,
) -> Result<Front, Answer> {
    head.refuse(|| path_reading(shared, side))?;
    // The consumer header and the headers rules match on reach the upstream
    // as the engine judges them, or the request is refused.
    shared
        .engine
        .check_judged(head.headers())
        .map_err(|error| Refusal::BadRequest(error.body()))?;
    head.unserved()?;
    let identity = shared
        .identify(side, caller, head.headers())
        .map_err(Answer::Unauthenticated)?;
    let pick = match side {
        Side::Inbound => None,
        Side::Outbound => Some(pick(shared, head).map_err(Answer::Failure)?),
    };
    Ok(Front { identity, pick })
}

/// The endpoint of an outbound call, picked before the decision (per-instance
/// rules key on it).
fn pick(shared: &Shared, head: &impl HeadView) -> Result<Pick, Failure> {
    let Some(service) = target_service(head.headers(), head.host()) else {
        return Err(Failure::NO_SERVICE);
    };
    let Some(pick) = shared.directory.pick(service) else {
        tracing::debug!(service, "outbound call to an unknown service");
        return Err(Failure::UnknownService);
    };
    tracing::trace!(service, instance = %pick.endpoint().id, "outbound call");
    Ok(pick)
}

impl Front {
    /// Step 6 on the HTTP/1 path: the engine's view of the request, with the
    /// header fields `headers` (the client's, the consumer header as the
    /// agent wrote it).
    pub(crate) fn info<'a>(
        &'a self,
        side: Side,
        head: &'a impl HeadView,
        headers: Headers<'a>,
    ) -> RequestInfo<'a> {
        RequestInfo {
            direction: match side {
                Side::Inbound => Direction::Inbound,
                Side::Outbound => Direction::Outbound,
            },
            method: head.method(),
            path: head.path(),
            query: head.query(),
            claims: self.identity.claims(),
            headers,
            target: self.pick.as_ref().map(|pick| Target {
                service: pick.service(),
                instance: Some(&*pick.endpoint().id),
            }),
        }
    }

    /// Step 6 on hyper's path: writes the consumer into `req` and hands the
    /// engine's `Govern` what it builds the [`RequestInfo`] from that the
    /// HTTP/1 path builds in [`Front::info`] (the claims, the call's
    /// [`CallTarget`]), and the forwarder its [`Pick`].
    pub(crate) fn apply<B>(self, req: &mut http::Request<B>) {
        if self.identity.invalid() {
            req.extensions_mut().insert(gov_engine::CountAsSystemError);
        }
        self.identity.apply(req);
        if let Some(pick) = self.pick {
            let target = CallTarget {
                service: pick.service().clone(),
                instance: Some(pick.endpoint().id.clone()),
            };
            req.extensions_mut().insert(target);
            req.extensions_mut().insert(pick);
        }
    }
}

/// The retry rule that may send a call again, on both paths: `rule`, the
/// one that matched the call (asked only when the rest holds), for an
/// outbound call to an endpoint the balancer picked (`picked`) whose method
/// the rule retries and whose body of `len` bytes the agent can hold
/// ([`holds_body`]).
pub(crate) fn retry_rule(
    rule: impl FnOnce() -> Option<RetryPolicy>,
    picked: bool,
    method: &Method,
    len: Option<u64>,
) -> Option<RetryPolicy> {
    if !picked || !holds_body(len) {
        return None;
    }
    rule().filter(|p| p.retries_method(method))
}

/// Whether a retry rule may hold a request body of `len` bytes (`None`: not
/// known before it ends) to send it again: empty, or a declared length of at
/// most [`gov_proto::v1::Retry::MAX_BUFFERED_BODY`]. Any other call under the
/// rule gets the built-in attempts.
pub(crate) fn holds_body(len: Option<u64>) -> bool {
    len.is_some_and(|n| n <= gov_proto::v1::Retry::MAX_BUFFERED_BODY)
}

/// The retry rule's decision on both paths: whether attempt `attempt`, ended
/// with `outcome`, is sent again. Attempts are left, the call's `deadline`
/// has not passed, the rule retries the outcome, and the budget pays (asked
/// last: a retry it pays is sent).
///
/// The one difference between the paths is `deadline`: the HTTP/1 path
/// passes the call's own (it runs the attempts and the deadline itself);
/// hyper's path passes `None`, because there the engine's `Govern` owns the
/// deadline and drops the attempts when it passes.
///
/// Without a rule, each path has built-in second attempts, at most one of
/// each kind: a call that could not connect goes to another endpoint of the
/// service (both paths; on hyper's only when it has no body, since its first
/// attempt took the body); a body-less idempotent request that got no byte
/// of an answer is sent again (the HTTP/1 path itself; on hyper's path
/// hyper's pool does it for a kept-alive connection found closed).
pub(crate) fn retries(
    policy: &RetryPolicy,
    attempt: u32,
    deadline: Option<tokio::time::Instant>,
    outcome: Outcome,
) -> bool {
    attempt < policy.attempts()
        && deadline.is_none_or(|d| tokio::time::Instant::now() < d)
        && policy.retries(outcome)
        && policy.try_retry()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_refuses_none_in_http11_several_and_malformed() {
        assert_eq!(one_host(0, true, true), Err(Refusal::NO_HOST));
        assert_eq!(one_host(0, true, false), Ok(()));
        assert_eq!(one_host(1, true, true), Ok(()));
        assert_eq!(one_host(1, false, true), Err(Refusal::BAD_HOST));
        // An HTTP/2 request without `host` whose `:authority` is malformed.
        assert_eq!(one_host(0, false, false), Err(Refusal::BAD_HOST));
        assert_eq!(one_host(2, true, true), Err(Refusal::HOSTS));
        assert_eq!(one_host(2, false, false), Err(Refusal::HOSTS));
    }

    #[test]
    fn one_framing_refuses_both_and_several_lengths() {
        assert_eq!(one_framing(false, 0), Ok(()));
        assert_eq!(one_framing(false, 1), Ok(()));
        assert_eq!(one_framing(true, 0), Ok(()));
        assert_eq!(one_framing(true, 1), Err(Refusal::BOTH_FRAMINGS));
        assert_eq!(one_framing(true, 2), Err(Refusal::BOTH_FRAMINGS));
        assert_eq!(one_framing(false, 2), Err(Refusal::LENGTHS));
    }

    #[test]
    fn underscored_framing_names_only_the_two_framing_fields() {
        for name in [
            "content_length",
            "Content_Length",
            "transfer_encoding",
            "TRANSFER_ENCODING",
        ] {
            assert!(underscored_framing(name.as_bytes()), "{name}");
        }
        for name in [
            "content-length",
            "transfer-encoding",
            "x_content_length",
            "content_type",
            "content__length",
            "",
        ] {
            assert!(!underscored_framing(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn holds_a_body_only_of_a_known_length_within_the_bound() {
        let max = gov_proto::v1::Retry::MAX_BUFFERED_BODY;
        assert!(holds_body(Some(0)));
        assert!(holds_body(Some(max)));
        assert!(!holds_body(Some(max + 1)));
        assert!(!holds_body(None));
    }
}
