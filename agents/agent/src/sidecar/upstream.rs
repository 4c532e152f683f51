//! Where the proxy sends requests: the pooled upstream client and the local
//! service; the endpoints of other services and the outbound balancer are in
//! [`balance`] (re-exported here, so their paths do not change).

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::uri::Authority;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rand::Rng;
use tokio::time::Instant;

use super::drain::Draining;
use gov_engine::GovBody;

use super::mtls::{Alpn, PeerTls, Stream};

mod balance;
mod direct;

pub use balance::*;
pub(crate) use direct::{H2Body, OpenStream, SendError};

/// The body the proxy forwards upstream: the client's body, counted as it streams,
/// or none (a second attempt of a request without a body, whose first attempt took
/// the client's empty body).
///
/// When the client's body fails (the client left or reset the stream mid-body),
/// the failure is held back for `stall` before it reaches the upstream
/// connection: the upstream already has the request's head and may be working
/// on it, so the call (and its permits) stays open until the upstream answers
/// or gives up on the body, not cut while it works (`abandoned`).
pub(crate) struct UpstreamBody {
    body: Option<GovBody<Draining>>,
    stall: Duration,
    stalled: Option<Stalled>,
}

/// A client body's failure, held back until `until`.
struct Stalled {
    until: Pin<Box<tokio::time::Sleep>>,
    error: Option<hyper::Error>,
}

impl UpstreamBody {
    /// The client's `body`, its failure held back for `stall`.
    pub(crate) fn client(body: GovBody<Draining>, stall: Duration) -> Self {
        Self {
            body: Some(body),
            stall,
            stalled: None,
        }
    }

    pub(crate) fn empty() -> Self {
        Self {
            body: None,
            stall: Duration::ZERO,
            stalled: None,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.stalled.is_none() {
            match this.body.as_mut().map(|b| Pin::new(b).poll_frame(cx)) {
                None => return Poll::Ready(None),
                Some(Poll::Ready(Some(Err(error)))) => {
                    this.stalled = Some(Stalled {
                        until: Box::pin(tokio::time::sleep(this.stall)),
                        error: Some(error),
                    });
                }
                Some(polled) => return polled,
            }
        }
        match &mut this.stalled {
            Some(stalled) => {
                std::task::ready!(stalled.until.as_mut().poll(cx));
                Poll::Ready(stalled.error.take().map(Err))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stalled.is_none() && self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// The body of an upstream's response: from the pooled (HTTP/1.1) client
/// (`Left`) or from the HTTP/2 client (`Right`).
pub(crate) type ResponseIncoming = http_body_util::Either<Incoming, H2Body>;

pin_project_lite::pin_project! {
    /// The body of an upstream's response, holding the balancer's pick of the
    /// endpoint (`None` for the local service) until it ends, fails, or is
    /// dropped: the endpoint counts the request outstanding until then.
    pub(crate) struct PickedBody {
        #[pin]
        body: ResponseIncoming,
        pick: Option<Pick>,
        // The stream on a connection of the HTTP/2 client, counted open.
        stream: Option<OpenStream>,
    }
}

impl PickedBody {
    pub(crate) fn new(
        body: ResponseIncoming,
        pick: Option<Pick>,
        stream: Option<OpenStream>,
    ) -> Self {
        Self { body, pick, stream }
    }
}

impl Body for PickedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.pick.take();
            this.stream.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A pooled upstream client.
pub(crate) type UpstreamClient = Client<Connector, UpstreamBody>;

/// How the pooled clients connect: TCP (hyper-util's connector), then
/// mutual TLS to an endpoint of another agent that takes it
/// ([`PeerTls::connect`]).
#[derive(Clone)]
pub(crate) struct Connector {
    tcp: HttpConnector,
    mtls: Arc<PeerTls>,
    directory: Arc<Directory>,
    alpn: Alpn,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Uri> for Connector {
    type Response = Connection;
    type Error = BoxError;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Connection, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        tower::Service::poll_ready(&mut self.tcp, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tcp = tower::Service::call(&mut self.tcp, uri.clone());
        let (mtls, directory, alpn) = (self.mtls.clone(), self.directory.clone(), self.alpn);
        Box::pin(async move {
            let tcp = tcp.await?.into_inner();
            let stream = match uri.authority() {
                Some(authority) => {
                    let service = mtls.target(directory.mtls_targets(), authority);
                    mtls.connect(tcp, authority, service.as_deref(), alpn)
                        .await?
                }
                None => Stream::Plain(tcp),
            };
            Ok(Connection(TokioIo::new(stream)))
        })
    }
}

/// A connection of the pooled clients, plain or mutual TLS.
pub(crate) struct Connection(TokioIo<Stream>);

impl hyper::rt::Read for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}

impl hyper_util::client::legacy::connect::Connection for Connection {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        let stream = self.0.inner();
        let connected = stream.tcp().connected();
        if stream.alpn() == Some(b"h2") {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

/// Which protocol the proxy speaks to upstreams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 whatever the client spoke, except gRPC calls, which go over
    /// HTTP/2 (the default: every HTTP server speaks HTTP/1.1, every gRPC
    /// server HTTP/2).
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge (h2c), for upstreams that speak only HTTP/2.
    Http2,
    /// The protocol the client spoke: HTTP/2 clients (gRPC) get an HTTP/2 upstream
    /// connection, with trailers passed through; HTTP/1 clients an HTTP/1.1 one.
    Downstream,
}

impl std::str::FromStr for UpstreamProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "http1" => Ok(Self::Http1),
            "http2" => Ok(Self::Http2),
            "downstream" => Ok(Self::Downstream),
            _ => Err(format!(
                "`{s}` is not an upstream protocol: use `http1`, `http2` or `downstream`"
            )),
        }
    }
}

/// The clients all upstream calls share: HTTP/1.1 keep-alive connections
/// pooled per upstream address (hyper-util's pool), HTTP/2 ones multiplexed per
/// address by [`direct`]'s client; `TCP_NODELAY`, a bounded connect time.
pub(crate) struct Clients {
    protocol: UpstreamProtocol,
    http1: Upstream,
    http2: Upstream,
}

impl Clients {
    pub(crate) fn new(
        protocol: UpstreamProtocol,
        mtls: Arc<PeerTls>,
        directory: Arc<Directory>,
    ) -> Self {
        Self {
            protocol,
            http1: Upstream::Pooled(client(mtls.clone(), directory.clone())),
            http2: Upstream::Direct(direct::Http2Client::new(connector(
                Alpn::Http2,
                mtls,
                directory,
            ))),
        }
    }

    /// The HTTP/1.1 client (a WebSocket upgrade's, whatever the protocol).
    pub(crate) fn http1(&self) -> (&Upstream, http::Version) {
        (&self.http1, http::Version::HTTP_11)
    }

    /// The client for a request that arrived as `version`, and the version to
    /// send. A gRPC call (`grpc`: HTTP/2, `content-type: application/grpc`)
    /// goes over HTTP/2 whatever the protocol: gRPC has no HTTP/1 form.
    pub(crate) fn pick(&self, version: http::Version, grpc: bool) -> (&Upstream, http::Version) {
        let http2 = match self.protocol {
            UpstreamProtocol::Http1 => grpc,
            UpstreamProtocol::Http2 => true,
            UpstreamProtocol::Downstream => version == http::Version::HTTP_2,
        };
        if http2 {
            (&self.http2, http::Version::HTTP_2)
        } else {
            (&self.http1, http::Version::HTTP_11)
        }
    }
}

/// An upstream client: hyper-util's pool (HTTP/1.1) or the HTTP/2 client.
// Two live in `Clients` for the agent's life; a clone (a retry's) copies the
// pool's handles either way, boxed or not.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(crate) enum Upstream {
    Pooled(UpstreamClient),
    Direct(direct::Http2Client<Connector, UpstreamBody>),
}

impl Upstream {
    /// Sends `req` on a connection to `to`. The pool connects to the
    /// authority of `req`'s URI (which must be `to`); the HTTP/2 client
    /// connects to `to` and sends the URI's authority as `:authority`.
    pub(crate) fn request(
        &self,
        to: Authority,
        req: http::Request<UpstreamBody>,
    ) -> UpstreamFuture {
        match self {
            Self::Pooled(client) => UpstreamFuture::Pooled(client.request(req)),
            Self::Direct(client) => UpstreamFuture::Direct(Box::pin(client.clone().send(to, req))),
        }
    }
}

type DirectFuture = Pin<
    Box<
        dyn std::future::Future<Output = Result<(http::Response<H2Body>, OpenStream), SendError>>
            + Send,
    >,
>;

/// The response head of [`Upstream::request`], with the HTTP/2 client's
/// stream, or how the request failed.
pub(crate) enum UpstreamFuture {
    Pooled(hyper_util::client::legacy::ResponseFuture),
    Direct(DirectFuture),
}

impl std::future::Future for UpstreamFuture {
    type Output = Result<(http::Response<ResponseIncoming>, Option<OpenStream>), SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Pooled(fut) => Pin::new(fut).poll(cx).map(|polled| match polled {
                Ok(response) => Ok((response.map(ResponseIncoming::Left), None)),
                Err(error) => Err(SendError {
                    connect: error.is_connect(),
                    source: error.into(),
                }),
            }),
            Self::Direct(fut) => fut.as_mut().poll(cx).map(|polled| {
                polled
                    .map(|(response, stream)| (response.map(ResponseIncoming::Right), Some(stream)))
            }),
        }
    }
}

fn connector(alpn: Alpn, mtls: Arc<PeerTls>, directory: Arc<Directory>) -> Connector {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(Duration::from_secs(2)));
    tcp.set_keepalive(Some(Duration::from_secs(60)));
    tcp.enforce_http(true);
    Connector {
        tcp,
        mtls,
        directory,
        alpn,
    }
}

fn client(mtls: Arc<PeerTls>, directory: Arc<Directory>) -> UpstreamClient {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .timer(TokioTimer::new())
        .build(connector(Alpn::Http1, mtls, directory))
}

// === how the outbound listener is configured ===

const FULL_WEIGHT: u32 = crate::lifecycle::FULL_WEIGHT;

/// How the outbound listener chooses an endpoint of the called service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Balance {
    /// Power of two choices over peak-EWMA cost: the latency estimate times the
    /// requests outstanding plus one, the candidates drawn by slow-start weight
    /// (the default).
    #[default]
    PeakEwma,
    /// Each available endpoint in turn, blind to load (slow-start weights thin an
    /// endpoint's turns): the baseline to compare with.
    RoundRobin,
}

impl std::str::FromStr for Balance {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "peak-ewma" => Ok(Self::PeakEwma),
            "round-robin" => Ok(Self::RoundRobin),
            _ => Err(format!(
                "`{s}` is not a balancer: use `peak-ewma` or `round-robin`"
            )),
        }
    }
}

/// One endpoint of a service as discovery gives it: where it listens and its
/// slow-start weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSpec {
    /// Where it listens.
    pub authority: Authority,
    /// Its share of traffic relative to a full endpoint: 100% is
    /// [`crate::lifecycle::FULL_WEIGHT`]; more counts as 100%, 0 as the least weight.
    pub weight_milli_percent: u32,
}

impl EndpointSpec {
    /// An endpoint at full weight (a static `--instances` entry).
    pub fn full(authority: Authority) -> Self {
        Self {
            authority,
            weight_milli_percent: FULL_WEIGHT,
        }
    }
}
