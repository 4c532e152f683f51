//! What both proxy paths (the HTTP/1 path and hyper's) share: the listener
//! context ([`Shared`], [`Side`]), where an outbound call goes
//! ([`target_service`]), and the answers the agent makes itself ([`Failure`]).
//! The steps both paths run on a request head are `front`'s.

use std::sync::Arc;

use http::StatusCode;
use http::header::HeaderName;
use http::uri::Authority;

use super::upstream::{Clients, Directory};
use crate::decision_log::DecisionLog;
use gov_engine::{Admission, Engine, Rejection, RequestInfo};

/// The header a local service may set on an outbound call to name the service it
/// calls; without it the `host` header (without its port) names it.
pub static GOV_SERVICE: HeaderName = HeaderName::from_static("gov-service");

/// What both proxy listeners share.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) clients: Clients,
    /// The local service, for the inbound listener.
    pub(crate) local: Authority,
    /// Other services' endpoints and their balancer, for the outbound listener.
    pub(crate) directory: Arc<Directory>,
    /// `--decision-log`.
    pub(crate) log: Option<DecisionLog>,
    /// `--client-gone-hold`: how long a call whose client left is finished
    /// at most (hyper's side; see `abandoned`).
    pub(crate) client_gone_hold: std::time::Duration,
    /// The keys of `consumer from jwt` sources (the inbound listener).
    pub(crate) verifier: super::consumer::Verifier,
    /// Mutual TLS between agents.
    pub(crate) mtls: Arc<super::mtls::PeerTls>,
}

impl Shared {
    /// The consumer of a request by the service's `consumer from`
    /// ([`super::consumer::identify`]).
    /// `caller`: the calling agent of the connection (mutual TLS).
    pub(crate) fn identify(
        &self,
        side: Side,
        caller: Option<&super::mtls::Caller>,
        headers: gov_engine::Headers<'_>,
    ) -> Result<super::consumer::Identity, String> {
        if side == Side::Outbound {
            return Ok(super::consumer::Identity::AsSent);
        }
        super::consumer::identify(&self.engine, &self.verifier, caller, headers)
    }

    /// The engine's decision on `info`, logged when the decision log samples
    /// the call (the rejection now, an admitted call when its admission drops):
    /// the HTTP/1 path's, told to the log as hyper's path tells it through
    /// [`gov_engine::Govern`].
    #[inline]
    /// `system_error`: fuses count the call as one whatever its outcome (a
    /// token that did not verify, `on invalid count`). `deadline`: when the
    /// caller's deadline passes ([`gov_engine::deadline`]).
    pub(crate) async fn admit(
        &self,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
        system_error: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Admission, Rejection> {
        let mut admission = self
            .engine
            .admit_observed(info, &self.log, request_bytes, deadline)
            .await?;
        if system_error {
            admission.count_as_system_error();
        }
        Ok(admission)
    }
}

/// How the upstream of a listener reads request paths: the service's declared
/// `paths` for its own instance (inbound), the default for calls to others,
/// whose declarations this agent does not have. Both proxy paths read it here.
pub(crate) fn path_reading(shared: &Shared, side: Side) -> gov_engine::path::Reading {
    match side {
        Side::Inbound => shared.engine.path_reading(),
        Side::Outbound => gov_engine::path::Reading::default(),
    }
}

/// Which listener a connection came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// Clients of the local service.
    Inbound,
    /// The local service calling other services.
    Outbound,
}

/// Why a request could not be forwarded.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Failure {
    /// The request is not one the proxy can forward.
    BadRequest(&'static str),
    /// The request is malformed or ambiguous (the connection closes after
    /// it): the HTTP/1 codec's answer.
    Refused {
        status: StatusCode,
        body: &'static str,
    },
    /// The outbound call names no known service.
    UnknownService,
    /// The upstream could not be connected to.
    Connect,
    /// The upstream failed after the connection was made.
    Upstream,
}

impl Failure {
    /// An outbound call that names no service (both paths' front).
    pub(crate) const NO_SERVICE: Failure = Failure::BadRequest(
        "gov-agent: an outbound call needs a `gov-service` or `host` header naming the service\n",
    );

    /// A refusal answered with `(status, body)`.
    pub(crate) fn refused((status, body): (StatusCode, &'static str)) -> Self {
        Failure::Refused { status, body }
    }

    /// The status and short body of the answer.
    pub(crate) fn answer(self) -> (StatusCode, &'static str) {
        match self {
            Failure::BadRequest(body) => (StatusCode::BAD_REQUEST, body),
            Failure::Refused { status, body } => (status, body),
            Failure::UnknownService => (
                StatusCode::BAD_GATEWAY,
                "gov-agent: no instances known for the called service\n",
            ),
            Failure::Connect => (
                StatusCode::BAD_GATEWAY,
                "gov-agent: upstream connection failed\n",
            ),
            Failure::Upstream => (StatusCode::BAD_GATEWAY, "gov-agent: upstream failed\n"),
        }
    }

    /// The answer as an HTTP/1.1 message at the end of `out` (the HTTP/1 path).
    pub(crate) fn write_http1(self, out: &mut Vec<u8>, close: bool) {
        use std::io::Write;
        let (status, body) = self.answer();
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\ncontent-type: text/plain; charset=utf-8\r\n{}content-length: {}\r\n\r\n{body}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            if close { "connection: close\r\n" } else { "" },
            body.len(),
        );
    }
}

/// The service an outbound call is for: `gov-service`, else `host` (the host the
/// request names) without its port.
pub(crate) fn target_service<'a>(
    headers: gov_engine::Headers<'a>,
    host: Option<&'a str>,
) -> Option<&'a str> {
    if headers.get(&GOV_SERVICE).is_some() {
        return headers.get_str(&GOV_SERVICE).filter(|s| !s.is_empty());
    }
    let host = host?;
    // Strip the port; a bracketed IPv6 literal keeps its brackets.
    let name = match host.rfind(':') {
        Some(i) if !host[i..].contains(']') => &host[..i],
        _ => host,
    };
    (!name.is_empty()).then_some(name)
}
