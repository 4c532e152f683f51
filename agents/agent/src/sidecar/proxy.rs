//! The forwarding path on hyper's side: inbound (clients -> local service) and
//! outbound (local service -> instances of other services).
//!
//! A request passes the request front both paths share ([`super::front`]:
//! here its refusals are [`check`], the HTTP/1 path's checks that still apply
//! to a request hyper parsed), then goes through the engine's [`Govern`]
//! around [`Forward`]: the engine's one lifecycle of an
//! admitted call (the decision, told to the decision log; the shadow stamps;
//! both bodies counted; the deadline and its 504; the outcome recorded at the
//! head, from a [`CallError`], or by the response body; the admission held
//! until the response body has finished or the client left). A rejection is
//! answered there without touching the upstream. [`Forward`] streams an
//! admitted request to the upstream through an upstream client with its
//! hop-by-hop headers removed and `x-forwarded-for` appended, and reports to
//! the balancer when the endpoint is one it picked. A gRPC call is governed
//! through the engine's [`gov_engine::grpc`]: its rejection is the gRPC form,
//! its `grpc-timeout` its deadline when shorter than its rules', its outcome
//! its `grpc-status`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Uri};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tower::{Layer, Service, ServiceExt};

use super::abandoned::{Budget, Detached, Held, Hold, Inner};
use super::drain::{AfterRequest, Draining};
use super::front::{
    Answer, HeadView, MAX_HEADERS, Refusal, front, one_framing, one_host, retry_rule,
    underscored_framing, valid_authority,
};
use super::headers::{append_forwarded_for, strip_hop_by_hop};
#[cfg(test)]
use super::listener::target_service;
use super::listener::{Failure, Shared, Side};
use super::serve::Connections;
use super::upgrade;
use super::upstream::{Pick, PickedBody, UpstreamBody, UpstreamFuture};
use crate::decision_log::DecisionLog;

mod again;
mod retry;

use self::again::{Again, Awaiting, upstream_uri};
use gov_engine::Headers::Map;
use gov_engine::path::Reading;
use gov_engine::{CallError, GovBody, Govern, GovernLayer, MeteredBody, Outcome, RetryPolicy};

/// The body of every response of the proxy listeners: the upstream's, holding the
/// call's admission (bulkhead permits, in-flight gauges) and its endpoint pick
/// (requests outstanding) until the upstream is done, even if the client left
/// ([`super::abandoned`]); or the agent's own.
pub(crate) type ResponseBody = AfterRequest<Held>;

/// The handler of one client connection on hyper's side (HTTP/2, and what the HTTP/1
/// path hands over): the engine's [`Govern`] around this connection's [`Forward`].
/// Cloned per request; a clone costs two counts no other connection touches.
#[derive(Clone)]
pub(crate) struct Handler(Govern<Forward, Option<DecisionLog>>);

/// Sends an admitted request upstream: the inner service of a connection's
/// [`Handler`].
#[derive(Clone)]
pub(crate) struct Forward(Arc<Conn>);

struct Conn {
    shared: Arc<Shared>,
    side: Side,
    peer: HeaderValue,
    conns: Arc<Connections>,
    /// How a call whose client left is finished.
    hold: Hold,
    /// The HTTP/1 path handed this connection over after checking its request:
    /// hyper serves that one HTTP/1 request, then the connection closes, so that
    /// no HTTP/1 request reaches the upstream without the HTTP/1 path's checks.
    handed_over: bool,
    /// The calling agent (the inbound listener's mutual TLS).
    caller: Option<Arc<super::mtls::Caller>>,
}

// === impl Handler ===

impl Handler {
    pub(crate) fn new(
        shared: Arc<Shared>,
        side: Side,
        peer: std::net::SocketAddr,
        conns: Arc<Connections>,
        handed_over: bool,
        close: tokio_util::sync::CancellationToken,
        caller: Option<Arc<super::mtls::Caller>>,
    ) -> Self {
        let hold = Hold {
            bound: shared.client_gone_hold,
            conns: conns.clone(),
            budget: Arc::new(Budget::new(close)),
        };
        let layer = match side {
            Side::Inbound => GovernLayer::new(shared.engine.clone()),
            Side::Outbound => GovernLayer::outbound(shared.engine.clone()),
        };
        let layer = layer.observe(shared.log.clone());
        Self(layer.layer(Forward(Arc::new(Conn {
            shared,
            side,
            peer: peer_value(peer),
            conns,
            hold,
            handed_over,
            caller,
        }))))
    }

    /// Handles one request so that a client that leaves (hyper then drops this
    /// future) does not end the call at the upstream's expense: the call goes
    /// on by itself ([`super::abandoned`]).
    pub(crate) async fn handle(self, req: Request<Incoming>) -> Response<ResponseBody> {
        // An HTTP/2 response ends once its request has (`drain`); an HTTP/1
        // connection whose request body was not read closes instead.
        let (parts, body) = req.into_parts();
        let (body, request_end) = Draining::new(body, parts.version == http::Version::HTTP_2);
        let req = Request::from_parts(parts, body);
        let hold = self.0.get_ref().0.hold.clone();
        let conns = self.0.get_ref().0.conns.clone();
        let held = hold.clone();
        let response = Detached::new(
            async move {
                self.respond(req).await.map(|body| match body {
                    GovBody::Response { .. } => Held::upstream(body, held),
                    _ => Held::free(body),
                })
            },
            hold,
        )
        .await;
        let mut response = response;
        if let Some(tunnel) = response.extensions_mut().remove::<upgrade::Tunnel>() {
            // The tunnel holds the call's admission (in its body) for its life.
            let (parts, admission) = response.into_parts();
            upgrade::spawn(tunnel, admission, conns);
            let empty = Held::free(GovBody::local(Bytes::new()));
            response = Response::from_parts(parts, empty);
        }
        response.map(|body| AfterRequest::new(body, request_end))
    }

    /// Governs and forwards one request. Every answer on a connection the
    /// HTTP/1 path handed over closes it (hyper serves that one request), so
    /// no later request there skips the HTTP/1 path's checks.
    async fn respond(self, req: Request<Draining>) -> Response<Inner> {
        let handed_over = self.0.get_ref().0.handed_over;
        let close = req.version() <= http::Version::HTTP_11 && handed_over;
        let mut response = self.answer(req).await;
        if close && response.status() != StatusCode::SWITCHING_PROTOCOLS {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    async fn answer(self, mut req: Request<Draining>) -> Response<Inner> {
        let conn = &self.0.get_ref().0;
        match front(&conn.shared, conn.side, conn.caller.as_deref(), &mut req) {
            Ok(front) => front.apply(&mut req),
            Err(Answer::Refused(refusal)) => {
                tracing::debug!(?refusal, "refused a request");
                conn.conns.refused.fetch_add(1, Ordering::Relaxed);
                let mut response = failure_response(Failure::refused(refusal.answer()));
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
            Err(Answer::Unauthenticated(text)) => {
                let grpc = gov_engine::grpc::GrpcCall::is(req.version(), req.headers());
                return super::consumer::response(&text, grpc);
            }
            Err(Answer::Failure(failure)) => return failure_response(failure),
        }
        match self.0.oneshot(req).await {
            Ok(response) => response,
            Err(error) => {
                tracing::debug!(%error, "upstream failed");
                failure_response(match CallError::outcome_of(&error) {
                    Some(Outcome::ConnectFailure) => Failure::Connect,
                    Some(_) => Failure::Upstream,
                    None => Failure::refused(Refusal::BAD_TARGET.answer()),
                })
            }
        }
    }
}

/// hyper's request as the front reads it ([`super::front`]): the checks of
/// the HTTP/1 path that still apply to a request hyper parsed ([`check`]),
/// and the upgrade and `CONNECT` answers of this path.
impl<B> HeadView for Request<B> {
    fn method(&self) -> &http::Method {
        Request::method(self)
    }

    fn path(&self) -> &str {
        self.uri().path()
    }

    fn query(&self) -> &str {
        self.uri().query().unwrap_or_default()
    }

    fn headers(&self) -> gov_engine::Headers<'_> {
        Map(Request::headers(self))
    }

    fn host(&self) -> Option<&str> {
        request_host(self)
    }

    fn refuse(&mut self, reading: impl FnOnce() -> Reading) -> Result<(), Refusal> {
        check(self, reading())
    }

    fn unserved(&mut self) -> Result<(), Answer> {
        let h2_websocket = upgrade::is_h2_websocket(self);
        if upgrade::is_websocket(self) || h2_websocket {
            if upgrade::has_body(Request::headers(self)) {
                return Err(Answer::Refused(Refusal::BadRequest(
                    "gov-agent: an upgrade request cannot have a body\n",
                )));
            }
            if let Some(client) = upgrade::client(self) {
                self.extensions_mut().insert(client);
            }
        }
        // Authority-form (`CONNECT host:port`) has no path: tunnels are not
        // proxied, and such a request is no call of the service's; nor is an
        // extended CONNECT to anything but a WebSocket.
        if Request::method(self) == http::Method::CONNECT {
            return Err(Answer::Failure(Failure::BadRequest(
                "gov-agent: CONNECT is not supported\n",
            )));
        }
        Ok(())
    }
}

/// The checks of the HTTP/1 path ([`super::h1`]) that still apply to a request
/// hyper parsed: one `host` (RFC 9112 section 3.2), never both framings and one
/// length (section 6.3), and the path normalized before matching (RFC 3986 section
/// 6, [`gov_engine::path`], as the upstream reads paths: `reading`); the request
/// then carries the normalized path.
fn check<B>(req: &mut Request<B>, reading: Reading) -> Result<(), Refusal> {
    let headers = req.headers();
    // The HTTP/1 path's bound (431), for HTTP/2 too: one stream refused.
    if headers.len() > MAX_HEADERS {
        return Err(Refusal::HeadTooLarge);
    }
    // `content_length`, `transfer_encoding`: framing to an upstream that reads `_`
    // as `-` (hyper's parser does not).
    if headers
        .keys()
        .any(|name| underscored_framing(name.as_str().as_bytes()))
    {
        return Err(Refusal::UNDERSCORED);
    }
    // RFC 9113 section 8.2.1: a field value with leading or trailing whitespace
    // is malformed in HTTP/2 (h2 lets it through). An HTTP/1.1 upstream would
    // trim what the engine read untrimmed.
    if req.version() == http::Version::HTTP_2
        && headers.values().any(|v| {
            let ws = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
            ws(v.as_bytes().first()) || ws(v.as_bytes().last())
        })
    {
        return Err(Refusal::BadRequest(
            "gov-agent: an HTTP/2 field value has leading or trailing whitespace\n",
        ));
    }
    let host_ok = headers
        .get(header::HOST)
        .is_none_or(|h| h.to_str().is_ok_and(valid_authority));
    let authority_ok = req
        .uri()
        .authority()
        .is_none_or(|a| valid_authority(a.as_str()));
    one_host(
        headers.get_all(header::HOST).iter().count(),
        host_ok && authority_ok,
        req.version() == http::Version::HTTP_11,
    )?;
    one_framing(
        headers.contains_key(header::TRANSFER_ENCODING),
        headers.get_all(header::CONTENT_LENGTH).iter().count(),
    )?;
    // `CONNECT` has no path (refused later; an extended CONNECT has one),
    // `OPTIONS *` none to normalize.
    let path = req.uri().path();
    let extended = req.extensions().get::<hyper::ext::Protocol>().is_some();
    if (req.method() == http::Method::CONNECT && !extended)
        || (path == "*" && req.method() == http::Method::OPTIONS)
    {
        return Ok(());
    }
    let std::borrow::Cow::Owned(normal) = gov_engine::path::normalize(path, reading)? else {
        return Ok(());
    };
    let mut parts = req.uri().clone().into_parts();
    let with_query = match req.uri().query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    parts.path_and_query =
        Some(PathAndQuery::try_from(with_query).map_err(|_| Refusal::BAD_TARGET)?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| Refusal::BAD_TARGET)?;
    Ok(())
}

/// The host a request names: the target's authority (absolute form, or HTTP/2's
/// `:authority`), which replaces `host` (RFC 9112 section 3.2.2), else `host`.
fn request_host<B>(req: &Request<B>) -> Option<&str> {
    match req.uri().authority() {
        Some(authority) => Some(authority.as_str()),
        None => gov_engine::Headers::Map(req.headers()).get_str(&header::HOST),
    }
}

// === impl Forward ===

/// Sends an admitted request to the local service (inbound) or to the endpoint the
/// request's [`Pick`] names (outbound), and streams the response back.
///
/// A call that could not connect to its endpoint goes once to another endpoint of the
/// service if it has no body (any method: nothing was sent); a request with a body
/// cannot be sent again from here, since its first attempt took the body. A retry
/// rule that matched the call replaces this ([`retry`]). hyper's
/// pool (HTTP/1.1) sends a request again by itself when a kept-alive connection
/// turns out to be closed before it was written, and the HTTP/2 client one that
/// a closing connection handed back unsent.
impl Service<Request<MeteredBody<Draining>>> for Forward {
    type Response = Response<PickedBody>;
    type Error = CallError;
    type Future = Sending;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<MeteredBody<Draining>>) -> Sending {
        let conn = &*self.0;
        let pick = req.extensions_mut().remove::<Pick>();
        // A retry rule's attempts (an outbound call whose body can be held).
        let rule = req.extensions_mut().remove::<RetryPolicy>();
        let len = retry::known_len(req.body());
        let policy = retry_rule(|| rule, pick.is_some(), req.method(), len);
        let (mut parts, body) = req.into_parts();
        let to = match &pick {
            Some(pick) => pick.endpoint().authority.clone(),
            None => conn.shared.local.clone(),
        };
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let grpc = gov_engine::grpc::GrpcCall::is(parts.version, &parts.headers);
        let client_upgrade = parts.extensions.remove::<upgrade::ClientUpgrade>();
        let (client, version) = match client_upgrade {
            Some(_) => conn.shared.clients.http1(),
            None => conn.shared.clients.pick(parts.version, grpc),
        };
        let authority = if version == http::Version::HTTP_2 {
            // RFC 9113 8.3.1: `:authority` is the host the client asked for
            // (its `:authority`, else its `host`), and `host` goes: one that
            // differs from `:authority` is malformed (nginx answers 400).
            let authority = parts.uri.authority().cloned().or_else(|| {
                let host = parts.headers.get(header::HOST)?;
                Authority::try_from(host.as_bytes()).ok()
            });
            parts.headers.remove(header::HOST);
            authority
        } else {
            None
        };
        if version != http::Version::HTTP_2
            && let Some(authority) = parts.uri.authority()
            && let Ok(host) = HeaderValue::from_str(authority.as_str())
        {
            // Keep the host the client asked for: the target's authority (HTTP/2's
            // `:authority`, an absolute-form target) replaces `host` (RFC 9112 3.2.2).
            parts.headers.insert(header::HOST, host);
        }
        // What a second attempt needs: kept only for an outbound call without a body.
        let again_path =
            (pick.is_some() && http_body::Body::is_end_stream(&body)).then(|| path.clone());
        let Some(uri) = upstream_uri(authority.clone().unwrap_or_else(|| to.clone()), path) else {
            return Sending::unsent("gov-agent: bad request target", pick);
        };
        parts.uri = uri;
        parts.version = version;
        // The engine stamped the request: a client's `connection` cannot remove that.
        let stamp = if parts.headers.contains_key(header::CONNECTION) {
            parts.headers.remove(gov_engine::WOULD_REJECT_BY)
        } else {
            None
        };
        strip_hop_by_hop(&mut parts.headers);
        if let Some(stamp) = stamp {
            parts.headers.insert(gov_engine::WOULD_REJECT_BY, stamp);
        }
        if let Some(client_upgrade) = &client_upgrade {
            upgrade::restore(&mut parts.headers, client_upgrade.protocol.clone());
            if client_upgrade.h2 {
                upgrade::handshake_fields(&mut parts.headers);
            }
        }
        // hyper answered `100 Continue` itself when the body was read.
        parts.headers.remove(header::EXPECT);
        append_forwarded_for(&mut parts.headers, &conn.peer);
        let pick = match (policy, pick) {
            (Some(policy), Some(pick)) if client_upgrade.is_none() => {
                let again = Again {
                    method: parts.method,
                    version: parts.version,
                    headers: parts.headers,
                    path: parts
                        .uri
                        .path_and_query()
                        .cloned()
                        .unwrap_or_else(|| PathAndQuery::from_static("/")),
                    authority,
                    client: client.clone(),
                };
                let fut = retry::attempts(policy, again, body, pick, grpc);
                return Sending::Retrying { fut: Box::pin(fut) };
            }
            (_, pick) => pick,
        };
        let again = again_path.map(|path| Again {
            method: parts.method.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            path,
            authority,
            client: client.clone(),
        });
        let fut = client.request(
            to,
            Request::from_parts(parts, UpstreamBody::client(body, conn.hold.bound)),
        );
        Sending::Sent {
            fut,
            pick: Awaiting(pick),
            again,
            upgrade: client_upgrade,
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Forward`]: the upstream's response head, or how the call
    /// failed ([`Outcome::ConnectFailure`] or [`Outcome::Reset`]).
    #[project = SendingProj]
    pub(crate) enum Sending {
        Sent {
            #[pin]
            fut: UpstreamFuture,
            pick: Awaiting,
            again: Option<Again>,
            // The client's side of a WebSocket upgrade request.
            upgrade: Option<upgrade::ClientUpgrade>,
        },
        Unsent {
            error: Option<CallError>,
        },
        // A retry rule's attempts ([`retry`]).
        Retrying {
            fut: Pin<Box<dyn Future<Output = Result<Response<PickedBody>, CallError>> + Send>>,
        },
    }
}

impl Sending {
    fn unsent(why: &'static str, pick: Option<Pick>) -> Self {
        // Never sent: the endpoint learns nothing.
        drop(pick);
        Sending::Unsent {
            error: Some(CallError::unsent(why)),
        }
    }
}

impl Future for Sending {
    type Output = Result<Response<PickedBody>, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (mut fut, pick, again, client_upgrade) = match self.project() {
            SendingProj::Sent {
                fut,
                pick,
                again,
                upgrade,
            } => (fut, pick, again, upgrade),
            SendingProj::Unsent { error } => {
                return Poll::Ready(Err(error
                    .take()
                    .unwrap_or_else(|| CallError::unsent("polled after completion"))));
            }
            SendingProj::Retrying { fut } => return fut.as_mut().poll(cx),
        };
        loop {
            let error = match ready!(fut.as_mut().poll(cx)) {
                Ok((mut response, stream)) => {
                    let pick = pick.0.take();
                    if let Some(pick) = &pick {
                        pick.responded(response.status().as_u16());
                    }
                    let tunnel = match client_upgrade.take() {
                        Some(client) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                            upgrade::accept(&mut response, client)
                        }
                        _ => None,
                    };
                    if response.status() == StatusCode::SWITCHING_PROTOCOLS && tunnel.is_none() {
                        // Never a tunnel the client did not ask for.
                        return Poll::Ready(Err(CallError::failed(
                            Outcome::Reset,
                            "gov-agent: the upstream switched protocols without a WebSocket upgrade",
                        )));
                    }
                    let (mut parts, body) = response.into_parts();
                    if tunnel.is_none() {
                        strip_hop_by_hop(&mut parts.headers);
                    }
                    if let Some(tunnel) = tunnel {
                        parts.extensions.insert(tunnel);
                    }
                    return Poll::Ready(Ok(Response::from_parts(
                        parts,
                        PickedBody::new(body, pick, stream),
                    )));
                }
                Err(error) => error,
            };
            let connect = error.connect;
            let Some(first) = pick.0.take() else {
                let outcome = if connect {
                    Outcome::ConnectFailure
                } else {
                    Outcome::Reset
                };
                return Poll::Ready(Err(CallError::failed(outcome, error)));
            };
            first.failed();
            if !connect {
                return Poll::Ready(Err(CallError::failed(Outcome::Reset, error)));
            }
            tracing::debug!(%error, endpoint = %first.endpoint().authority, "upstream connect failed");
            let retry = again.take().and_then(|a| Some((first.retry()?, a)));
            let Some((next, again)) = retry else {
                return Poll::Ready(Err(CallError::failed(Outcome::ConnectFailure, error)));
            };
            let to = next.endpoint().authority.clone();
            let Some(uri) = again.uri(to.clone()) else {
                return Poll::Ready(Err(CallError::failed(Outcome::ConnectFailure, error)));
            };
            let mut req = Request::new(UpstreamBody::empty());
            *req.method_mut() = again.method;
            *req.uri_mut() = uri;
            *req.version_mut() = again.version;
            *req.headers_mut() = again.headers;
            pick.0 = Some(next);
            fut.set(again.client.request(to, req));
        }
    }
}

/// A short plain-text response made by the agent.
pub(crate) fn local_response(status: StatusCode, body: &'static str) -> Response<Inner> {
    let mut response = Response::new(GovBody::local(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn failure_response(failure: Failure) -> Response<Inner> {
    let (status, body) = failure.answer();
    local_response(status, body)
}

/// The peer address as an `x-forwarded-for` value, made once per connection.
fn peer_value(peer: std::net::SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.ip().to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target_service<B>(req: &Request<B>) -> Option<&str> {
        super::target_service(gov_engine::Headers::Map(req.headers()), request_host(req))
    }

    #[test]
    fn outbound_target_prefers_gov_service_then_host_without_port() {
        let req = Request::builder()
            .header("gov-service", "inventory")
            .header("host", "billing:8080")
            .body(())
            .unwrap();
        assert_eq!(target_service(&req), Some("inventory"));
        let req = Request::builder()
            .header("host", "billing:8080")
            .body(())
            .unwrap();
        assert_eq!(target_service(&req), Some("billing"));
        let req = Request::builder()
            .header("host", "billing")
            .body(())
            .unwrap();
        assert_eq!(target_service(&req), Some("billing"));
        let req = Request::builder().uri("http://[::1]:80/").body(()).unwrap();
        assert_eq!(target_service(&req), Some("[::1]"));
        let req = Request::builder().uri("/").body(()).unwrap();
        assert_eq!(target_service(&req), None);
    }
}
