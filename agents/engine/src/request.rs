//! What the engine needs to know about a request: [`RequestInfo`], built
//! from an `http::Request`, a parsed HTTP/1 head, or by hand.

use http::{HeaderMap, Method, Request};

use crate::config::Direction;
use crate::route::Headers;

/// What the engine needs to know about a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    /// Which listener the request came through.
    pub direction: Direction,
    pub method: &'a Method,
    /// The URI path, without the query.
    pub path: &'a str,
    /// The query, after `?` (empty without one): keys on a query parameter
    /// read it.
    pub query: &'a str,
    /// The claims of the caller's verified token that rules key on
    /// (`per claim`), as (name, value); empty without a verified token. The
    /// agent fills it from the token it verified, never from a header.
    pub claims: &'a [(String, String)],
    /// The request headers (the consumer is read from the configured header).
    pub headers: Headers<'a>,
    /// Outbound: the called service and, once chosen, the upstream instance.
    pub target: Option<Target<'a>>,
}

/// The destination of an outbound call.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The called service (matched by `calls to SERVICE`).
    pub service: &'a str,
    /// The upstream instance (e.g. `10.0.0.7:8080`), the key of
    /// `per instance` bulkheads. `None`: those bulkheads use one shared scope.
    pub instance: Option<&'a str>,
}

impl<'a> RequestInfo<'a> {
    /// An inbound request (server side rules).
    pub fn inbound(method: &'a Method, path: &'a str, headers: &'a HeaderMap) -> Self {
        Self {
            direction: Direction::Inbound,
            method,
            path,
            query: "",
            claims: &[],
            headers: Headers::Map(headers),
            target: None,
        }
    }

    /// An outbound request to `service` (client side rules).
    pub fn outbound(
        method: &'a Method,
        path: &'a str,
        headers: &'a HeaderMap,
        service: &'a str,
        instance: Option<&'a str>,
    ) -> Self {
        Self {
            direction: Direction::Outbound,
            method,
            path,
            query: "",
            claims: &[],
            headers: Headers::Map(headers),
            target: Some(Target { service, instance }),
        }
    }

    /// The same request with the query `query` (after `?`).
    pub fn with_query(self, query: &'a str) -> Self {
        Self { query, ..self }
    }

    /// The same request with the verified `claims` (name, value).
    pub fn with_claims(self, claims: &'a [(String, String)]) -> Self {
        Self { claims, ..self }
    }

    /// The inbound view of an `http::Request`.
    pub fn from_request<B>(req: &'a Request<B>) -> Self {
        Self::inbound(req.method(), req.uri().path(), req.headers())
            .with_query(req.uri().query().unwrap_or_default())
    }
}

/// The claims of a caller's verified token that rules key on (`per claim`),
/// carried by a request on hyper's path as an extension (which no client
/// can set) from the agent's verification to the engine's decision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifiedClaims(pub Vec<(String, String)>);
