//! A declared retry rule on the HTTP/1 path: the attempts of one outbound
//! call under its one admission (so the rules above the retry see one call:
//! one bulkhead permit, one count, the final outcome).
//!
//! An attempt is retried when it ended with one of the rule's outcomes
//! before anything of its response reached the client (a connect failure,
//! a connection closed or broken before a whole response head, a per-try
//! timeout, or a response head whose status the rule names, which is then
//! not relayed), attempts are left, the call's deadline has not passed, and
//! the budget pays. Each retry waits its backoff and goes to another
//! endpoint of the service when there is one. A request body is sent again
//! only when held whole: an empty body, or a declared length of at most
//! [`gov_proto::v1::Retry::MAX_BUFFERED_BODY`], read before the first
//! attempt; any other call under the rule gets the built-in attempts.

use bytes::Buf;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::codec::Framing;
use super::conn::{Conn, Exchange, Head, Io};
use super::pool::Dest;
use super::relay::within;
use crate::sidecar::front::{retries, retry_rule};
use crate::sidecar::listener::Failure;
use gov_engine::{Admission, Outcome, RetryPolicy};

/// The retry rule that may send this call again: an outbound call whose
/// method the rule retries and whose body the agent can hold.
pub(super) fn policy(head: &Head, to: &Dest, admission: &Admission) -> Option<RetryPolicy> {
    let len = match head.framing {
        Framing::Empty => Some(0),
        Framing::Length(n) => Some(n),
        Framing::Chunked | Framing::UntilClose => None,
    };
    let picked = matches!(to, Dest::Endpoint(_));
    retry_rule(|| admission.retry(), picked, &head.method, len)
}

/// The rule's decision ([`retries`]), with the call's own deadline: this
/// path runs the attempts and the deadline itself.
fn decide(policy: &RetryPolicy, attempt: u32, deadline: Option<Instant>, outcome: Outcome) -> bool {
    retries(policy, attempt, deadline, outcome)
}

impl Conn<'_> {
    /// [`Conn::forward`] under a retry rule. Whether the client connection
    /// stays open.
    pub(super) async fn forward_retried(
        &mut self,
        client: &mut impl Io,
        head: &Head,
        mut to: Dest,
        mut admission: Admission,
        policy: RetryPolicy,
    ) -> bool {
        let deadline = admission.timeout().map(|t| Instant::now() + t);
        let mut head = head.clone();
        if let Framing::Length(n) = head.framing {
            if !self.hold_body(client, n, &admission).await {
                return false;
            }
            // The body follows the head in `self.out`: sent whole each time.
            head.framing = Framing::Empty;
        }
        let head = &head;
        let mut attempt = 1;
        // A kept-alive connection found closed is no attempt: sent again once.
        let mut resent = false;
        let mut left = None;
        let exchange = loop {
            let per_try = policy.per_try_timeout().map(|t| Instant::now() + t);
            let at = match (deadline, per_try) {
                (Some(d), Some(p)) => Some(d.min(p)),
                (d, p) => d.or(p),
            };
            if let Some(at) = at {
                self.route.arm_before(at);
            }
            let outcome = match self.take_upstream(to.authority()).await {
                Err(()) => {
                    to.failed();
                    Exchange::Failed(Failure::Connect, Some(Outcome::ConnectFailure))
                }
                Ok((mut upstream, reused)) => {
                    let mut decider = |o| decide(&policy, attempt, deadline, o);
                    let hook: &mut (dyn FnMut(Outcome) -> bool + Send) = &mut decider;
                    let exchange = self
                        .exchange(
                            client,
                            &mut upstream,
                            head,
                            (&mut admission, to.pick(), Some(hook)),
                            at,
                        )
                        .await;
                    match exchange {
                        (Exchange::Stale, _) if reused && !resent => {
                            resent = true;
                            continue;
                        }
                        (Exchange::Stale, _) => {
                            to.failed();
                            Exchange::Failed(Failure::Upstream, Some(Outcome::Reset))
                        }
                        (Exchange::ClientLeft, _) => {
                            left = Some(upstream);
                            break Exchange::Broken;
                        }
                        (exchange, reusable) => {
                            match &exchange {
                                Exchange::Failed(_, Some(Outcome::Reset)) => to.failed(),
                                Exchange::TimedOut { .. } => to.timed_out(),
                                _ => {}
                            }
                            if reusable {
                                self.put_upstream(upstream);
                            }
                            exchange
                        }
                    }
                }
            };
            // The call's own deadline ends it; a per-try timeout is an
            // attempt's outcome.
            let per_try_passed = deadline.is_none_or(|d| Instant::now() < d);
            let retried = match &outcome {
                // The budget paid when the status was seen.
                Exchange::Retry => true,
                Exchange::Failed(_, Some(o @ (Outcome::ConnectFailure | Outcome::Reset))) => {
                    decide(&policy, attempt, deadline, *o)
                }
                Exchange::TimedOut { .. } if per_try_passed => {
                    decide(&policy, attempt, deadline, Outcome::Timeout)
                }
                _ => false,
            };
            if !retried {
                break outcome;
            }
            attempt += 1;
            let mut wait = policy.backoff(attempt - 1);
            if let Some(d) = deadline {
                wait = wait.min(d.saturating_duration_since(Instant::now()));
            }
            tokio::time::sleep(wait).await;
            if let Dest::Endpoint(pick) = &to {
                let next = pick.retry().unwrap_or_else(|| pick.clone());
                tracing::debug!(
                    rule = %policy.rule(),
                    attempt,
                    to = %next.endpoint().authority,
                    "retrying"
                );
                to = Dest::Endpoint(next);
            }
            resent = false;
        };
        self.conclude(client, head, exchange, admission, left).await
    }

    /// Reads the request body of declared length `n` (at most the retry
    /// bound) from the client and appends it to the head in `self.out`,
    /// counting it for byte limits. `false` when the client did not send it.
    async fn hold_body(&mut self, client: &mut impl Io, n: u64, admission: &Admission) -> bool {
        let Ok(n) = usize::try_from(n) else {
            return false;
        };
        while self.buf.len() < n {
            self.buf.reserve(n - self.buf.len());
            match within(self.cx.client_timeout, client.read_buf(&mut self.buf)).await {
                Some(Ok(read)) if read > 0 => {}
                _ => return false,
            }
        }
        self.out.extend_from_slice(&self.buf[..n]);
        self.buf.advance(n);
        if let Some(meter) = admission.byte_meter() {
            meter.add(n as u64);
        }
        true
    }
}
