//! Upstream connections of the HTTP/1 path: where a request goes ([`Dest`]),
//! new connections ([`connect`]), and the idle pool a listener keeps once
//! their client connection ended.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::BytesMut;
use http::uri::Authority;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::relay::READ_CHUNK;
use crate::sidecar::listener::Shared;
use crate::sidecar::mtls::{Alpn, Stream};
use crate::sidecar::upstream::Pick;

/// Idle upstream connections a listener keeps once their client connection ended,
/// and for how long (as the pooled client's idle timeout).
const MAX_IDLE: usize = 256;
const IDLE_FOR: Duration = Duration::from_secs(90);

/// Idle keep-alive upstream connections whose client connection has ended, shared by
/// a listener's connections (a client that closes after every request still reuses
/// upstream connections). A client connection takes from here only for its first
/// request to an upstream; after that it keeps its own.
#[derive(Debug, Default)]
pub(crate) struct IdlePool {
    /// Each with the worker thread that drives it (`sidecar::workers`: 0
    /// without workers) and since when it is idle.
    conns: Mutex<Vec<(Upstream, usize, Instant)>>,
}

impl IdlePool {
    /// A live idle connection to `authority`, most recent first.
    /// Only one the calling worker drives: its reads and writes stay on it.
    pub(crate) fn take(&self, authority: &Authority) -> Option<Upstream> {
        let worker = crate::sidecar::workers::index();
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        conns.retain(|(_, _, since)| now.saturating_duration_since(*since) < IDLE_FOR);
        while let Some(i) = conns
            .iter()
            .rposition(|(u, w, _)| *w == worker && u.authority.as_str() == authority.as_str())
        {
            let (mut upstream, _, _) = conns.swap_remove(i);
            if upstream.alive() {
                return Some(upstream);
            }
        }
        None
    }

    pub(crate) fn put(&self, mut upstream: Upstream) {
        if !upstream.alive() {
            return;
        }
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= MAX_IDLE {
            conns.remove(0);
        }
        conns.push((upstream, crate::sidecar::workers::index(), Instant::now()));
    }
}

/// One keep-alive connection to an upstream.
#[derive(Debug)]
pub(crate) struct Upstream {
    pub(crate) authority: Authority,
    /// Plain, or mutual TLS to another agent.
    pub(crate) stream: Stream,
    pub(crate) buf: BytesMut,
}

impl Upstream {
    /// Whether the connection can carry a request: nothing unread, and the upstream
    /// has not closed it. Costs no system call unless the socket became readable
    /// (tokio keeps its readiness), which an idle HTTP/1 connection only does when
    /// the upstream closes it.
    pub(crate) fn alive(&mut self) -> bool {
        self.buf.is_empty() && self.stream.idle_and_open()
    }
}

/// Where a request goes: the local service (inbound), or the endpoint the balancer
/// picked (outbound), held until the response has ended.
pub(super) enum Dest {
    Local(Authority),
    Endpoint(Pick),
}

impl Dest {
    pub(super) fn authority(&self) -> &Authority {
        match self {
            Dest::Local(authority) => authority,
            Dest::Endpoint(pick) => &pick.endpoint().authority,
        }
    }

    pub(super) fn pick(&self) -> Option<&Pick> {
        match self {
            Dest::Local(_) => None,
            Dest::Endpoint(pick) => Some(pick),
        }
    }

    /// The connection failed or was reset before a response (passive health).
    pub(super) fn failed(&self) {
        if let Some(pick) = self.pick() {
            pick.failed();
        }
    }

    pub(super) fn timed_out(&self) {
        if let Some(pick) = self.pick() {
            pick.timed_out();
        }
    }
}

/// How long connecting to an upstream may take (as the pooled client's connector).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A new connection to `authority`: an address connects at once, a name is
/// looked up first (on tokio's blocking pool). An endpoint of another agent
/// that takes mutual TLS is called over it (`mtls`).
pub(super) async fn connect(authority: &Authority, shared: &Shared) -> Result<Upstream, ()> {
    let connect = async {
        match authority.as_str().parse::<SocketAddr>() {
            Ok(addr) => TcpStream::connect(addr).await,
            Err(_) => TcpStream::connect(authority.as_str()).await,
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            let service = shared
                .mtls
                .target(shared.directory.mtls_targets(), authority);
            let stream = shared
                .mtls
                .connect(stream, authority, service.as_deref(), Alpn::Http1)
                .await
                .map_err(drop)?;
            Ok(Upstream {
                authority: authority.clone(),
                stream,
                buf: BytesMut::with_capacity(READ_CHUNK),
            })
        }
        Ok(Err(error)) => {
            tracing::debug!(%authority, %error, "upstream connect failed");
            Err(())
        }
        Err(_) => {
            tracing::debug!(%authority, "upstream connect timed out");
            Err(())
        }
    }
}
