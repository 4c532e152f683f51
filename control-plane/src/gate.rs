//! The gate in front of govd's gRPC services: a call's bearer token is
//! checked from its headers before a byte of its body is read, and a call's
//! body is bounded by what the method needs.
//!
//! Without it, tonic decodes a request (up to the policy size limit, 16 MiB
//! by default) before the method can look at the token: 16 token-less 16 MB
//! `Apply` calls took govd from 16 MB to 277 MB of memory (issue 28). A
//! refused call is answered from its headers; its body is never polled, and
//! HTTP/2 resets the stream, so the client stops sending it.
//!
//! The methods themselves check the token again (with the name the audit
//! log records): the gate only refuses early what they would refuse.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use http_body_util::BodyExt as _;
use tonic::Status;
use tonic::body::Body;

use crate::auth::Role;
use crate::control_plane::Inner;

/// The most bytes the body of any call but `Apply` and `Connect` may carry
/// (`Status`, `Watch`, `Audit`, `Release`, health checks: a few names).
pub const SMALL_CALL_BYTES: usize = 64 << 10;

/// How much of a call's body may be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    /// [`SMALL_CALL_BYTES`] in all.
    Small,
    /// Per message, as the gRPC service's decoding limit says (`Apply`: the
    /// policy size limit; `Connect`: a stream of agent messages).
    Service,
}

/// One method of `gov.v1.ControlPlane`: who may call it, how much it reads.
struct Method {
    path: &'static str,
    /// `Role::Agent`: an agent's credentials (`Connect`).
    need: Role,
    body: Bound,
}

/// Every method of `gov.v1.ControlPlane`. A path of that service not listed
/// here (a method added to the proto and not here) needs the admin role.
const METHODS: [Method; 9] = [
    method("Apply", Role::Admin, Bound::Service),
    method("Connect", Role::Agent, Bound::Service),
    method("Watch", Role::Viewer, Bound::Small),
    method("Status", Role::Viewer, Bound::Small),
    method("Audit", Role::Viewer, Bound::Small),
    method("History", Role::Viewer, Bound::Small),
    method("Release", Role::Operator, Bound::Small),
    // Abort: an operator; promote (an apply everywhere): the admin
    // (checked by the method).
    method("Canary", Role::Operator, Bound::Small),
    // A CSR: a few hundred bytes.
    method("Certify", Role::Agent, Bound::Small),
];

const SERVICE_PREFIX: &str = "/gov.v1.ControlPlane/";

const fn method(path: &'static str, need: Role, body: Bound) -> Method {
    Method { path, need, body }
}

/// Puts [`Gate`] in front of a service.
#[derive(Clone)]
pub(crate) struct GateLayer {
    inner: Arc<Inner>,
}

/// Checks each call's token from its headers, then bounds its body.
#[derive(Clone)]
pub(crate) struct Gate<S> {
    inner: Arc<Inner>,
    service: S,
}

// === impl GateLayer ===

impl GateLayer {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }
}

impl<S> tower::Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, service: S) -> Gate<S> {
        Gate {
            inner: self.inner.clone(),
            service,
        }
    }
}

// === impl Gate ===

impl<S> tower::Service<http::Request<Body>> for Gate<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<std::future::Ready<Result<Self::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let peer = peer(&parts.extensions);
        let certified = peer.is_some_and(|(_, certified)| certified);
        let (bound, proved) = match admit(&self.inner, parts.uri.path(), &parts.headers, certified)
        {
            Ok(admitted) => admitted,
            Err(status) => return Either::Left(std::future::ready(Ok(status.into_http()))),
        };
        // The connection has made an authenticated call: it may stay open
        // past `--auth-timeout` (connections.rs).
        if let Some((peer, _)) = peer
            && proved
        {
            self.inner.metrics.connections.prove(peer);
        }
        let body = match bound {
            Bound::Service => body,
            Bound::Small => bounded(body, SMALL_CALL_BYTES),
        };
        Either::Right(self.service.call(http::Request::from_parts(parts, body)))
    }
}

/// Whether a call to `path` with `headers` may be read, how much of it, and
/// whether it proves who is calling (`certified`: the connection presented
/// a client certificate, verified by the TLS handshake). Health checks
/// (`grpc.health.v1`) and paths of no service are open, with a small body,
/// and prove nothing; `gov.v1.ControlPlane` methods need the token their
/// method needs (none on an open govd, `--insecure`).
fn admit(
    inner: &Inner,
    path: &str,
    headers: &http::HeaderMap,
    certified: bool,
) -> Result<(Bound, bool), Status> {
    let Some(name) = path.strip_prefix(SERVICE_PREFIX) else {
        return Ok((Bound::Small, false));
    };
    let (need, body) = METHODS
        .iter()
        .find(|m| m.path == name)
        .map_or((Role::Admin, Bound::Small), |m| (m.need, m.body));
    let mut request = tonic::Request::new(());
    *request.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers.clone());
    let tokens = inner.tokens();
    if need == Role::Agent {
        // With a client CA, an agent may prove itself by its certificate
        // alone: `Connect` checks it before it reads the hello.
        let certificate_only = inner.agent_certificates && !headers.contains_key("authorization");
        if certificate_only {
            return Ok((body, certified));
        }
        tokens.agent(&request)?;
    } else {
        tokens.caller(&request, need, name, "")?;
    }
    Ok((body, true))
}

/// The peer address of the connection a call came on, and whether it
/// presented a client certificate.
fn peer(extensions: &http::Extensions) -> Option<(SocketAddr, bool)> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    if let Some(tls) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() {
        let certified = tls.peer_certs().is_some_and(|c| !c.is_empty());
        return tls.get_ref().remote_addr().map(|a| (a, certified));
    }
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .map(|a| (a, false))
}

/// `body`, failing with `RESOURCE_EXHAUSTED` past `limit` bytes.
fn bounded(body: Body, limit: usize) -> Body {
    Body::new(
        http_body_util::Limited::new(body, limit).map_err(move |error| {
            if error.is::<http_body_util::LengthLimitError>() {
                Box::new(Status::resource_exhausted(format!(
                    "this call's message is over {limit} bytes, the most govd reads for it"
                ))) as Box<dyn std::error::Error + Send + Sync>
            } else {
                error
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_of_the_service_is_listed_once() {
        let names: Vec<&str> = gov_proto::v1::control_plane_server::SERVICE_NAME
            .split('.')
            .collect();
        assert_eq!(names.last(), Some(&"ControlPlane"));
        assert_eq!(
            SERVICE_PREFIX,
            format!("/{}/", gov_proto::v1::control_plane_server::SERVICE_NAME)
        );
        let mut paths: Vec<&str> = METHODS.iter().map(|m| m.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), METHODS.len());
    }
}
