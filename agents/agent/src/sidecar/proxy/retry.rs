//! A declared retry rule on hyper's side: the attempts of one outbound call
//! inside [`super::Forward`], under the call's one admission (the rules above
//! the retry see one call: one permit, one count, the final outcome, which
//! [`gov_engine::Govern`] records from the response head it is given).
//!
//! An attempt is retried when it ended with one of the rule's outcomes
//! before its response went anywhere (a connect failure, a connection that
//! broke before a response head, a per-try timeout, or a head whose status
//! or trailers-only `grpc-status` the rule names, which is then dropped),
//! attempts are left and the budget pays. Each retry waits its backoff and
//! goes to another endpoint of the service when there is one. The request
//! body is held whole first (empty, or a declared length of at most
//! [`gov_proto::v1::Retry::MAX_BUFFERED_BODY`]:
//! [`crate::sidecar::front::retry_rule`]); the call's
//! deadline is [`gov_engine::Govern`]'s, which drops this future.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;

use super::again::{Again, Awaiting};
use crate::sidecar::drain::Draining;
use crate::sidecar::front::retries;
use crate::sidecar::headers::strip_hop_by_hop;
use crate::sidecar::upstream::{Pick, PickedBody, UpstreamBody};
use gov_engine::{CallError, GovBody, MeteredBody, Outcome, RetryPolicy};

/// The length of a request body when it is known before it ends, for
/// [`crate::sidecar::front::retry_rule`].
pub(super) fn known_len(body: &MeteredBody<Draining>) -> Option<u64> {
    if http_body::Body::is_end_stream(body) {
        Some(0)
    } else {
        http_body::Body::size_hint(body).exact()
    }
}

/// The rule's decision ([`retries`]) without a deadline: the engine's
/// `Govern` owns the call's and drops these attempts when it passes.
fn decide(policy: &RetryPolicy, attempt: u32, outcome: Outcome) -> bool {
    retries(policy, attempt, None, outcome)
}

/// The attempts of one call: its first to `pick`, the rest as the rule says.
pub(super) async fn attempts(
    policy: RetryPolicy,
    again: Again,
    body: MeteredBody<Draining>,
    mut pick: Pick,
    grpc: bool,
) -> Result<Response<PickedBody>, CallError> {
    let body = if http_body::Body::is_end_stream(&body) {
        Bytes::new()
    } else {
        body.collect()
            .await
            .map_err(|e| CallError::unsent(format!("gov-agent: the request body broke: {e}")))?
            .to_bytes()
    };
    let mut attempt = 1;
    loop {
        let to = pick.endpoint().authority.clone();
        let Some(uri) = again.uri(to.clone()) else {
            return Err(CallError::unsent("gov-agent: bad request target"));
        };
        let mut req = Request::new(UpstreamBody::client(
            GovBody::local(body.clone()),
            Duration::ZERO,
        ));
        *req.method_mut() = again.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = again.version;
        *req.headers_mut() = again.headers.clone();
        let sent = again.client.request(to, req);
        // Dropped at the call's deadline: the endpoint's latency sample.
        let mut waiting = Awaiting(Some(pick));
        let result = match policy.per_try_timeout() {
            Some(t) => tokio::time::timeout(t, sent).await.ok(),
            None => Some(sent.await),
        };
        let Some(current) = waiting.0.take() else {
            return Err(CallError::unsent("gov-agent: the endpoint's pick was lost"));
        };
        let (outcome, error) = match result {
            None => {
                current.timed_out();
                let why = "gov-agent: the attempt's per_try_timeout passed";
                (Outcome::Timeout, CallError::failed(Outcome::Timeout, why))
            }
            Some(Err(error)) => {
                current.failed();
                let outcome = if error.connect {
                    Outcome::ConnectFailure
                } else {
                    Outcome::Reset
                };
                (outcome, CallError::failed(outcome, error))
            }
            Some(Ok((response, stream))) => {
                let status = response.status();
                let outcome = if grpc {
                    gov_engine::grpc::head_outcome(status, response.headers())
                } else {
                    Some(Outcome::from(status))
                };
                let again = status != StatusCode::SWITCHING_PROTOCOLS
                    && outcome.is_some_and(|o| decide(&policy, attempt, o));
                if !again {
                    current.responded(status.as_u16());
                    if status == StatusCode::SWITCHING_PROTOCOLS {
                        return Err(CallError::failed(
                            Outcome::Reset,
                            "gov-agent: the upstream switched protocols without a WebSocket upgrade",
                        ));
                    }
                    let (mut parts, body) = response.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    return Ok(Response::from_parts(
                        parts,
                        PickedBody::new(body, Some(current), stream),
                    ));
                }
                current.responded(status.as_u16());
                attempt += 1;
                pick = next(&policy, attempt, current).await;
                continue;
            }
        };
        if !decide(&policy, attempt, outcome) {
            return Err(error);
        }
        attempt += 1;
        pick = next(&policy, attempt, current).await;
    }
}

/// Waits the backoff before attempt `attempt`, then picks another endpoint
/// than `last` when the service has one.
async fn next(policy: &RetryPolicy, attempt: u32, last: Pick) -> Pick {
    tokio::time::sleep(policy.backoff(attempt - 1)).await;
    let next = last.retry().unwrap_or_else(|| last.clone());
    tracing::debug!(
        rule = %policy.rule(),
        attempt,
        to = %next.endpoint().authority,
        "retrying"
    );
    next
}
