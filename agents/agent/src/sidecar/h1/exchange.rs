//! One exchange with an upstream on the HTTP/1 path, and how a request's
//! exchanges end for the client: the parts of [`Conn::forward`] that the
//! built-in second attempts and a declared retry rule ([`super::retry`])
//! share.

use std::pin::pin;
use std::sync::atomic::Ordering;

use http::uri::Authority;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::codec::Framing;
use super::conn::{Conn, Exchange, Head, Io};
use super::local::say_keep_alive;
use super::pool::{Upstream, connect};
use super::relay::Retry;
use super::relay::{Broke, Leg, Received, receive, relay};
use super::{left, split};
use crate::sidecar::listener::Failure;
use crate::sidecar::upstream::Pick;
use gov_engine::{Admission, Outcome};

/// Keep-alive upstream connections one client connection keeps.
const MAX_UPSTREAMS: usize = 4;

impl Conn<'_> {
    /// Answers the client after the last exchange of a request: the response
    /// went already, or a failure or a timeout is told now; a client that
    /// left inside its body leaves the upstream connection `left` to finish.
    /// Whether the client connection stays open.
    pub(super) async fn conclude(
        &mut self,
        client: &mut impl Io,
        head: &Head,
        exchange: Exchange,
        admission: Admission,
        left: Option<Upstream>,
    ) -> bool {
        if let Some(upstream) = left {
            let (hold, conns) = (self.cx.shared.client_gone_hold, self.cx.conns.clone());
            left::hold(upstream, admission, hold, conns);
            return false;
        }
        match exchange {
            Exchange::Done { keep_client } => {
                drop(admission);
                keep_client && !head.close && !self.cx.stopping()
            }
            // `Stale` and `Retry` were turned into an attempt or a failure.
            Exchange::Broken | Exchange::Stale | Exchange::ClientLeft | Exchange::Retry => false,
            Exchange::Failed(failure, outcome) => {
                match outcome {
                    Some(outcome) => admission.finish(outcome),
                    None => drop(admission),
                }
                // Without a request body nothing of the request is left unread.
                let keep = head.framing == Framing::Empty && !head.close && !self.cx.stopping();
                self.out.clear();
                failure.write_http1(&mut self.out, !keep);
                say_keep_alive(&mut self.out, head.http10 && keep);
                client.write_all(&self.out).await.is_ok() && keep
            }
            Exchange::TimedOut { keep_client } => {
                let close = !keep_client || head.close || self.cx.stopping();
                self.out.clear();
                admission.timed_out().write_http1(&mut self.out, close);
                say_keep_alive(&mut self.out, head.http10 && !close);
                client.write_all(&self.out).await.is_ok() && !close
            }
        }
    }

    /// A kept-alive connection to `authority` (this client connection's own, else
    /// one from the listener's idle pool), or a new one. `Ok((conn, reused))`.
    pub(super) async fn take_upstream(
        &mut self,
        authority: &Authority,
    ) -> Result<(Upstream, bool), ()> {
        // Authorities come from the config: compare bytes, not case-insensitively.
        while let Some(i) = self
            .upstreams
            .iter()
            .position(|u| u.authority.as_str() == authority.as_str())
        {
            let mut upstream = self.upstreams.swap_remove(i);
            if upstream.alive() {
                return Ok((upstream, true));
            }
        }
        if let Some(upstream) = self.cx.idle.take(authority) {
            return Ok((upstream, true));
        }
        connect(authority, &self.cx.shared)
            .await
            .map(|upstream| (upstream, false))
    }

    pub(super) fn put_upstream(&mut self, upstream: Upstream) {
        if self.upstreams.len() >= MAX_UPSTREAMS {
            let oldest = self.upstreams.remove(0);
            self.cx.idle.put(oldest);
        }
        self.upstreams.push(upstream);
    }

    /// One request/response exchange on `upstream`: the request body goes up while
    /// the response comes back. Returns how it ended and whether `upstream` can be
    /// used again.
    pub(super) async fn exchange(
        &mut self,
        client: &mut impl Io,
        upstream: &mut Upstream,
        head: &Head,
        (admission, pick, retry): (&mut Admission, Option<&Pick>, Retry<'_>),
        deadline: Option<Instant>,
    ) -> (Exchange, bool) {
        // A meter holds the snapshot and the limit's cells: only worth taking for
        // a request that has a body to count.
        let meter = if admission.counts_bytes() && head.framing != Framing::Empty {
            admission.byte_meter()
        } else {
            None
        };
        let client = std::sync::Mutex::new(client);
        let (mut client_rd, mut client_wr) = split::split(&client);
        let up = std::sync::Mutex::new(&mut upstream.stream);
        let (mut up_rd, mut up_wr) = split::split(&up);
        let replayable = head.framing == Framing::Empty;
        let out = &mut self.out;
        let client_buf = &mut self.buf;
        let client_timeout = self.cx.client_timeout;
        let send = async {
            if replayable {
                // Keep the head for a second attempt.
                return up_wr
                    .write_all(out.as_slice())
                    .await
                    .map_err(|_| Broke::Write);
            }
            let leg = Leg {
                framing: head.framing,
                request: true,
                dechunk: false,
                read_timeout: client_timeout,
                write_timeout: None,
            };
            relay(leg, client_buf, &mut client_rd, &mut up_wr, out, |n| {
                if let Some(m) = &meter {
                    m.add(n);
                }
            })
            .await
        };
        let route = &mut self.route;
        let stopping = &self.cx.stopping;
        let recv = receive(
            &mut up_rd,
            &mut upstream.buf,
            &mut client_wr,
            &mut self.back,
            (&head.method, head.http10, || {
                head.close || stopping.load(Ordering::Relaxed)
            }),
            (admission, pick, retry),
            (deadline.map(|d| (route, d)), client_timeout),
        );
        let mut send = pin!(send);
        let mut recv = pin!(recv);
        let mut sent: Option<Result<(), Broke>> = None;
        let received = loop {
            tokio::select! {
                biased;
                received = &mut recv => break received,
                result = &mut send, if sent.is_none() => {
                    match result {
                        // The client broke off its request body.
                        Err(Broke::Read | Broke::Eof) => return (Exchange::ClientLeft, false),
                        // Nothing of the response has reached the client yet.
                        Err(Broke::Chunking) => {
                            return (
                                Exchange::Failed(
                                    Failure::BadRequest("gov-agent: malformed chunked request body\n"),
                                    None,
                                ),
                                false,
                            );
                        }
                        result => sent = Some(result),
                    }
                }
            }
        };
        let body_sent = matches!(sent, Some(Ok(())));
        match received {
            Received::Done {
                keep_upstream,
                keep_client,
            } => (
                Exchange::Done {
                    // A request body the upstream did not wait for leaves the client
                    // stream somewhere inside it.
                    keep_client: keep_client && body_sent,
                },
                keep_upstream && body_sent,
            ),
            Received::NoHead => (Exchange::Stale, false),
            Received::BadHead => (
                Exchange::Failed(Failure::Upstream, Some(Outcome::Reset)),
                false,
            ),
            Received::TimedOut => (
                Exchange::TimedOut {
                    keep_client: body_sent,
                },
                false,
            ),
            Received::Broken => (Exchange::Broken, false),
            Received::Retry => (Exchange::Retry, false),
        }
    }
}
