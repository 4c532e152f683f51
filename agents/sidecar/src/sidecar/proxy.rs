//! The forwarding path: inbound (clients -> local service) and outbound (local
//! service -> instances of other services).
//!
//! Each request is admitted by the engine first; a rejection is answered here without
//! touching the upstream. An admitted request streams to the upstream through the
//! pooled client with its hop-by-hop headers removed and `x-forwarded-for` appended;
//! the response streams back the same way. Both bodies are counted as they pass, and
//! the admission is held until the response body has finished (or the client left).
//! A gRPC call is governed through the engine's [`gov_engine::grpc`]: its rejection
//! is the gRPC form, its `grpc-timeout` its deadline when shorter than its rules',
//! its outcome its `grpc-status` (recorded at the head or, from the trailers, by the
//! response body).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::h1::codec::{Refusal, valid_authority};
use super::headers::{append_forwarded_for, strip_hop_by_hop};
use super::listener::{Failure, Shared, Side, target_service};
use super::serve::Connections;
use super::upstream::{Clients, Pick, UpstreamBody};
use gov_engine::grpc::GrpcCall;
use gov_engine::{Admission, GovBody, Outcome, RequestInfo};

/// The body of every response of the proxy listeners: the upstream's, holding the
/// call's admission (bulkhead permits, in-flight gauges) and its endpoint pick
/// (requests outstanding) until it is done or the client left; or the agent's own.
pub type ResponseBody = GovBody<Incoming, Option<Pick>>;

/// The handler of one client connection on hyper's side (HTTP/2, and what the HTTP/1
/// path hands over).
#[derive(Clone)]
pub(crate) struct Handler(Arc<Conn>);

struct Conn {
    shared: Arc<Shared>,
    side: Side,
    peer: HeaderValue,
    conns: Arc<Connections>,
    /// The HTTP/1 path handed this connection over after checking its request:
    /// hyper serves that one HTTP/1 request, then the connection closes, so that
    /// no HTTP/1 request reaches the upstream without the HTTP/1 path's checks.
    handed_over: bool,
}

// === impl Handler ===

impl Handler {
    pub(crate) fn new(
        shared: Arc<Shared>,
        side: Side,
        peer: std::net::SocketAddr,
        conns: Arc<Connections>,
        handed_over: bool,
    ) -> Self {
        Self(Arc::new(Conn {
            shared,
            side,
            peer: peer_value(peer),
            conns,
            handed_over,
        }))
    }

    /// Handles one request.
    pub(crate) async fn handle(&self, mut req: Request<Incoming>) -> Response<ResponseBody> {
        if let Err(refusal) = check(&mut req) {
            tracing::debug!(?refusal, "refused a request");
            self.0.conns.refused.fetch_add(1, Ordering::Relaxed);
            let mut response = failure_response(Failure::refused(refusal.answer()));
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
        let http1 = req.version() <= http::Version::HTTP_11;
        let mut response = match self.0.side {
            Side::Inbound => self.inbound(req).await,
            Side::Outbound => self.outbound(req).await,
        };
        if http1 && self.0.handed_over {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    /// A request from a client of the local service.
    async fn inbound(&self, req: Request<Incoming>) -> Response<ResponseBody> {
        let conn = &self.0;
        let grpc = GrpcCall::of(&req);
        let info = RequestInfo::inbound(req.method(), req.uri().path(), req.headers());
        let declared = http_body::Body::size_hint(req.body()).exact();
        let admission = match conn.shared.admit(&info, declared).await {
            Ok(admission) => admission,
            Err(rejection) => return GovBody::rejected(&rejection, grpc.is_some()),
        };
        let to = conn.shared.local.clone();
        let call = Call {
            to,
            pick: None,
            admission,
            grpc,
        };
        forward(&conn.shared.clients, req, call, &conn.peer).await
    }

    /// A call of the local service to another service.
    async fn outbound(&self, req: Request<Incoming>) -> Response<ResponseBody> {
        let conn = &self.0;
        let Some(service) =
            target_service(gov_engine::Headers::Map(req.headers()), request_host(&req))
        else {
            return failure_response(Failure::BadRequest(
                "gov-agent: an outbound call needs a `gov-service` or `host` header naming the service\n",
            ));
        };
        let Some(pick) = conn.shared.directory.pick(service) else {
            tracing::debug!(service, "outbound call to an unknown service");
            return failure_response(Failure::UnknownService);
        };
        let endpoint = pick.endpoint();
        tracing::trace!(service, instance = %endpoint.id, "outbound call");
        let grpc = GrpcCall::of(&req);
        let info = RequestInfo::outbound(
            req.method(),
            req.uri().path(),
            req.headers(),
            service,
            Some(&endpoint.id),
        );
        let declared = http_body::Body::size_hint(req.body()).exact();
        let admission = match conn.shared.admit(&info, declared).await {
            Ok(admission) => admission,
            Err(rejection) => return GovBody::rejected(&rejection, grpc.is_some()),
        };
        let call = Call {
            to: endpoint.authority.clone(),
            pick: Some(pick),
            admission,
            grpc,
        };
        forward(&conn.shared.clients, req, call, &conn.peer).await
    }
}

/// The checks of the HTTP/1 path ([`super::h1`]) that still apply to a request
/// hyper parsed: one `host` (RFC 9112 section 3.2), never both framings and one
/// length (section 6.3), and the path normalized before matching (RFC 3986 section
/// 6, [`gov_engine::path`]); the request then carries the normalized path.
fn check<B>(req: &mut Request<B>) -> Result<(), Refusal> {
    let headers = req.headers();
    // `content_length`, `transfer_encoding`: framing to an upstream that reads `_`
    // as `-` (hyper's parser does not).
    if headers.keys().any(|name| {
        let name = name.as_str();
        name.contains('_')
            && (name.eq_ignore_ascii_case("content_length")
                || name.eq_ignore_ascii_case("transfer_encoding"))
    }) {
        return Err(Refusal::BadRequest(
            "gov-agent: a framing header is spelled with `_`\n",
        ));
    }
    if headers.get_all(header::HOST).iter().nth(1).is_some() {
        return Err(Refusal::BadRequest(
            "gov-agent: the request has more than one `host` header\n",
        ));
    }
    if req.version() == http::Version::HTTP_11 && !headers.contains_key(header::HOST) {
        return Err(Refusal::BadRequest(
            "gov-agent: an HTTP/1.1 request needs a `host` header\n",
        ));
    }
    let host_ok = headers
        .get(header::HOST)
        .is_none_or(|h| h.to_str().is_ok_and(valid_authority));
    let authority_ok = req
        .uri()
        .authority()
        .is_none_or(|a| valid_authority(a.as_str()));
    if !host_ok || !authority_ok {
        return Err(Refusal::BadRequest("gov-agent: the `host` is malformed\n"));
    }
    if headers.contains_key(header::TRANSFER_ENCODING)
        && headers.contains_key(header::CONTENT_LENGTH)
    {
        return Err(Refusal::BadRequest(
            "gov-agent: the request has both `content-length` and `transfer-encoding`\n",
        ));
    }
    if headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(Refusal::BadRequest(
            "gov-agent: the request has more than one `content-length`\n",
        ));
    }
    // `CONNECT` has no path (refused later), `OPTIONS *` none to normalize.
    let path = req.uri().path();
    if req.method() == http::Method::CONNECT
        || (path == "*" && req.method() == http::Method::OPTIONS)
    {
        return Ok(());
    }
    let std::borrow::Cow::Owned(normal) = gov_engine::path::normalize(path)? else {
        return Ok(());
    };
    let mut parts = req.uri().clone().into_parts();
    let with_query = match req.uri().query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    parts.path_and_query = Some(
        PathAndQuery::try_from(with_query)
            .map_err(|_| Refusal::BadRequest("gov-agent: bad request target\n"))?,
    );
    *req.uri_mut() = Uri::from_parts(parts)
        .map_err(|_| Refusal::BadRequest("gov-agent: bad request target\n"))?;
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

/// Sends `req` to `to` under `admission` and streams the response back; reports the
/// outcome (status, connect failure, reset, timeout) to the engine, and to the
/// balancer when `to` is an endpoint it picked.
///
/// A call that could not connect to its endpoint goes once to another endpoint of the
/// service if it has no body (any method: nothing was sent); a request with a body
/// cannot be sent again from here, since its first attempt took the body. hyper's
/// pool sends a request again by itself when a kept-alive connection turns out to
/// be closed before it was written.
async fn forward(
    clients: &Clients,
    req: Request<Incoming>,
    call: Call,
    peer: &HeaderValue,
) -> Response<ResponseBody> {
    let Call {
        to,
        mut pick,
        mut admission,
        grpc,
    } = call;
    if let Some(call) = grpc {
        admission.set_caller_deadline(call.deadline);
    }
    let (mut parts, body) = req.into_parts();

    let path = match parts.uri.path_and_query() {
        Some(pq) => pq.clone(),
        // Authority-form (`CONNECT host:port`) has no path: tunnels are not proxied.
        // Such a request never reaches the upstream, so it ends no call: dropping
        // the admission gives its permits back without an outcome.
        None if parts.method == http::Method::CONNECT => {
            return failure_response(Failure::BadRequest("gov-agent: CONNECT is not supported\n"));
        }
        None => PathAndQuery::from_static("/"),
    };
    // Keep the host the client asked for: the target's authority (HTTP/2's
    // `:authority`, an absolute-form target) replaces `host` (RFC 9112 3.2.2).
    if let Some(authority) = parts.uri.authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        parts.headers.insert(header::HOST, host);
    }
    // What a second attempt needs: kept only for an outbound call without a body.
    let again_path =
        (pick.is_some() && http_body::Body::is_end_stream(&body)).then(|| path.clone());
    let Some(uri) = upstream_uri(to, path) else {
        return failure_response(Failure::BadRequest("gov-agent: bad request target\n"));
    };
    parts.uri = uri;
    let (client, version) = clients.pick(parts.version);
    parts.version = version;
    strip_hop_by_hop(&mut parts.headers);
    // hyper answered `100 Continue` itself when the body was read.
    parts.headers.remove(header::EXPECT);
    append_forwarded_for(&mut parts.headers, peer);
    stamp_would_reject(&mut parts.headers, &admission);

    let mut again = again_path.map(|path| {
        (
            parts.method.clone(),
            parts.version,
            parts.headers.clone(),
            path,
        )
    });
    let upstream_req = Request::from_parts(
        parts,
        UpstreamBody::client(GovBody::request(body, &admission)),
    );
    let deadline = admission
        .timeout()
        .map(|timeout| tokio::time::Instant::now() + timeout);
    let send = |req: Request<UpstreamBody>| async move {
        match deadline {
            None => Some(client.request(req).await),
            Some(at) => tokio::time::timeout_at(at, client.request(req)).await.ok(),
        }
    };
    let mut result = send(upstream_req).await;
    if let Some(Err(error)) = &result
        && error.is_connect()
        && let Some(first) = &pick
    {
        tracing::debug!(%error, endpoint = %first.endpoint().authority, "upstream connect failed");
        first.failed();
        let retry = again.take().and_then(|head| Some((head, first.retry()?)));
        if let Some(((method, version, headers, path), next)) = retry {
            let uri = upstream_uri(next.endpoint().authority.clone(), path);
            pick = Some(next);
            if let Some(uri) = uri {
                let mut req = Request::new(UpstreamBody::empty());
                *req.method_mut() = method;
                *req.uri_mut() = uri;
                *req.version_mut() = version;
                *req.headers_mut() = headers;
                result = send(req).await;
            }
        } else {
            // Reported: the endpoint is not told twice below.
            pick = None;
        }
    }
    let response = match result {
        Some(Ok(response)) => response,
        None => {
            if let Some(pick) = &pick {
                pick.timed_out();
            }
            return GovBody::rejected(&admission.timed_out(), grpc.is_some());
        }
        Some(Err(error)) => {
            if let Some(pick) = &pick {
                pick.failed();
            }
            return if error.is_connect() {
                tracing::debug!(%error, "upstream connect failed");
                admission.finish(Outcome::ConnectFailure);
                failure_response(Failure::Connect)
            } else {
                tracing::debug!(%error, "upstream failed");
                admission.finish(Outcome::Reset);
                failure_response(Failure::Upstream)
            };
        }
    };
    if let Some(pick) = &pick {
        pick.responded();
    }

    let (mut parts, body) = response.into_parts();
    admission.record_head(grpc.is_some(), parts.status, &parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, GovBody::response(body, admission, pick))
}

/// An admitted call on its way upstream: where to, the balancer's pick (outbound),
/// its admission, and whether it is a gRPC call.
struct Call {
    to: Authority,
    pick: Option<Pick>,
    admission: Admission,
    grpc: Option<GrpcCall>,
}

/// `http://{to}{path}`, the target of a request sent upstream.
fn upstream_uri(to: Authority, path: PathAndQuery) -> Option<Uri> {
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(to);
    uri.path_and_query = Some(path);
    Uri::from_parts(uri).ok()
}

/// A short plain-text response made by the agent.
pub(crate) fn local_response(status: StatusCode, body: &'static str) -> Response<ResponseBody> {
    let mut response = Response::new(GovBody::local(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn failure_response(failure: Failure) -> Response<ResponseBody> {
    let (status, body) = failure.answer();
    local_response(status, body)
}

/// Only the agent says which shadow rules would have refused a call: a
/// client's `gov-would-reject-by` is removed, and the rules of
/// [`Admission::stamps`] are written (the HTTP/1 path: `write_request_head`).
fn stamp_would_reject(headers: &mut http::HeaderMap, admission: &Admission) {
    headers.remove(gov_engine::WOULD_REJECT_BY);
    let mut stamps = admission
        .stamps()
        .filter(|r| HeaderValue::from_str(r).is_ok());
    let Some(first) = stamps.next() else {
        return;
    };
    let value = stamps.fold(first.to_owned(), |mut v, r| {
        v.push_str(", ");
        v.push_str(r);
        v
    });
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(gov_engine::WOULD_REJECT_BY, value);
    }
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
