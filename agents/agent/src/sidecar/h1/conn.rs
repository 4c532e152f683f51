//! The state of one client connection on the HTTP/1 path and what its
//! parts pass each other: the request head kept while its body is relayed,
//! and how an exchange with an upstream ended.

use std::pin::Pin;
use std::sync::Arc;

use bytes::BytesMut;
use http::Method;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::codec::Framing;
use super::context::Listener;
use super::deadline::Deadline;
use super::pool::Upstream;
use crate::sidecar::listener::Failure;
use crate::sidecar::mtls::Caller;
use gov_engine::Outcome;

/// A client stream: TCP in the agent, in-memory in tests.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Io for S {}

/// The owned part of a checked request head, kept while its body is relayed.
#[derive(Clone)]
pub(super) struct Head {
    pub(super) len: usize,
    pub(super) method: Method,
    pub(super) framing: Framing,
    /// The client asked to close after this request.
    pub(super) close: bool,
    pub(super) http10: bool,
    /// `Expect: 100-continue`: the client may be waiting to send its body.
    pub(super) expect: bool,
}

pub(super) struct Conn<'c> {
    pub(super) cx: &'c Listener,
    /// The client address, for `x-forwarded-for`.
    pub(super) peer: String,
    /// The calling agent (the inbound listener's mutual TLS).
    pub(super) caller: Option<Arc<Caller>>,
    /// Bytes read from the client and not yet handled.
    pub(super) buf: BytesMut,
    /// The head being written (to the upstream, or a local answer to the client).
    pub(super) out: Vec<u8>,
    /// The response head being written to the client.
    pub(super) back: Vec<u8>,
    pub(super) upstreams: Vec<Upstream>,
    pub(super) idle: Deadline,
    pub(super) route: Deadline,
    /// The listener's stop, waited on between requests. One future for the whole
    /// connection: a new one per request would join and leave the token's waiter
    /// list (a lock each) every time.
    pub(super) stopped: Pin<Box<WaitForCancellationFutureOwned>>,
    /// No request head has been read on this connection yet.
    pub(super) first: bool,
    /// Set when the stop came while the first request was still awaited: until
    /// when it may come.
    pub(super) grace: Option<Instant>,
}

/// Why an exchange with the upstream ended.
pub(super) enum Exchange {
    /// The response went to the client; whether the client connection may stay open.
    Done { keep_client: bool },
    /// Nothing reached the client; answer with this.
    Failed(Failure, Option<Outcome>),
    /// The upstream closed the connection before a byte of a response.
    Stale,
    /// The route timeout passed before the response head.
    TimedOut { keep_client: bool },
    /// The client went away, or the response broke after its head was sent.
    Broken,
    /// The client left inside its request body: the upstream has the head.
    ClientLeft,
    /// A retry rule sends the call again (nothing reached the client; the
    /// budget paid for the retry).
    Retry,
}
