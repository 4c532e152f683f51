//! The admin listener: `/metrics`, `/config`, `/ready`, `/live`, `POST /terminate`
//! and `POST /shutdown`.
//!
//! It runs on its own port so that probes and scrapes never queue behind proxied
//! traffic or count against its rules, and it keeps answering while the proxy
//! listeners drain (`/ready` then says 503).

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

use super::metrics;
use crate::health::Health;

/// What the admin handlers read.
pub(crate) struct Admin {
    pub(crate) health: Arc<Health>,
    pub(crate) stop: CancellationToken,
    /// `POST /terminate` begins its ordered shutdown.
    pub(crate) lifecycle: Arc<crate::lifecycle::Lifecycle>,
    pub(crate) metrics: metrics::Source,
}

impl Admin {
    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        match (req.method(), req.uri().path()) {
            (&Method::GET | &Method::HEAD, "/live") => text(StatusCode::OK, "live\n".into()),
            (&Method::GET | &Method::HEAD, "/ready") => {
                // Readiness is about serving; a refused control plane is
                // said beside it (the agent enforces its last good config).
                let refused = self
                    .health
                    .control_plane_refusal()
                    .map(|r| format!("control plane refused this agent's credentials: {r}\n"))
                    .unwrap_or_default();
                match self.health.not_ready_reason() {
                    None => text(StatusCode::OK, format!("ready\n{refused}")),
                    Some(reason) => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: {reason}\n{refused}"),
                    ),
                }
            }
            (&Method::GET | &Method::HEAD, "/metrics") => {
                let mut response =
                    Response::new(Full::new(Bytes::from(self.metrics.render(&self.health))));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                response
            }
            (&Method::GET | &Method::HEAD, "/config") => match self.metrics.config.in_force() {
                Some(in_force) => match serde_json::to_string_pretty(&in_force) {
                    Ok(json) => {
                        let mut response = text(StatusCode::OK, json + "\n");
                        response.headers_mut().insert(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        );
                        response
                    }
                    Err(error) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("cannot encode the config: {error}\n"),
                    ),
                },
                None => text(
                    StatusCode::NOT_FOUND,
                    "no config in force yet: give --config FILE or wait for the control plane\n"
                        .into(),
                ),
            },
            // A web page on this host must not stop the agent: see `refusal`.
            (&Method::POST, path @ ("/shutdown" | "/terminate")) => {
                if let Some(why) = refusal(&req) {
                    tracing::warn!(path, why, "refused a POST that may come from a web page");
                    return text(
                        StatusCode::FORBIDDEN,
                        format!("forbidden: {why}; POST {path} with the header `{STOP_HEADER}: {}` from a tool (curl, wget, a preStop hook), or send SIGTERM\n", &path[1..]),
                    );
                }
                self.stop_or_terminate(path)
            }
            (_, "/live" | "/ready" | "/metrics" | "/config" | "/shutdown" | "/terminate") => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed\n".into(),
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /metrics, /config, /ready, /live, POST /terminate or POST /shutdown\n".into(),
            ),
        }
    }
}

// === impl Admin ===

impl Admin {
    /// A POST that passed [`refusal`].
    fn stop_or_terminate(&self, path: &str) -> Response<Full<Bytes>> {
        if path == "/terminate" {
            // What a Kubernetes preStop hook of the service's container
            // calls: the config's shutdown steps (deregister, wait, stop,
            // drain), as SIGTERM runs them, while the service still runs (a
            // native sidecar gets its SIGTERM only after the service exited).
            tracing::info!("terminate requested on the admin listener");
            self.lifecycle.begin_shutdown();
            text(StatusCode::ACCEPTED, "running the shutdown steps\n".into())
        } else {
            tracing::info!("shutdown requested on the admin listener");
            self.stop.cancel();
            text(StatusCode::ACCEPTED, "shutting down\n".into())
        }
    }
}

/// The header a `POST /shutdown` or `/terminate` must carry (any value).
pub(crate) const STOP_HEADER: &str = "gov-admin";

/// Why a POST that stops the agent is refused, if it is: it may come from a
/// web page on this host. Three independent reasons, each enough:
///
/// - a page's requests carry `origin` (every POST) or `sec-fetch-*`;
/// - a page cannot add a header of its own to a cross-origin request
///   without a CORS preflight, which this listener never grants (so a form
///   post or a `text/plain` fetch lacks [`STOP_HEADER`]);
/// - a page that rebinds its own DNS name to 127.0.0.1 makes its requests
///   same-origin, but they still name that host: only an IP address or
///   `localhost` is accepted as the host, which a page cannot rebind.
fn refusal<B>(req: &Request<B>) -> Option<&'static str> {
    let headers = req.headers();
    if headers.contains_key(header::ORIGIN)
        || headers.contains_key("sec-fetch-site")
        || headers.contains_key("sec-fetch-mode")
    {
        return Some("the request comes from a web page (it has `origin` or `sec-fetch-*`)");
    }
    let host = req
        .uri()
        .authority()
        .map(|a| a.host().to_owned())
        .or_else(|| {
            let value = headers.get(header::HOST)?.to_str().ok()?;
            let authority: http::uri::Authority = value.parse().ok()?;
            Some(authority.host().to_owned())
        });
    match host {
        // HTTP/1.0 without a host: no browser sends that.
        None if !headers.contains_key(header::HOST) => {}
        None => return Some("the `host` header does not parse"),
        Some(host) if !address_or_localhost(&host) => {
            return Some(
                "the host is a DNS name (a page may have rebound it to this address); use an IP address or `localhost`",
            );
        }
        Some(_) => {}
    }
    if !headers.contains_key(STOP_HEADER) {
        return Some("the request lacks the header a web page cannot send");
    }
    None
}

/// `127.0.0.1`, `[::1]`, `10.1.2.3` or `localhost`: names no web page can
/// point at this agent with DNS.
fn address_or_localhost(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<std::net::IpAddr>().is_ok() || host.eq_ignore_ascii_case("localhost")
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
