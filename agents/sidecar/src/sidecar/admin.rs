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
            // A browser sends `origin` (and `sec-fetch-*`) with every
            // cross-site POST: a web page on this host must not stop the agent
            // with a form. Tools (curl, the platform's preStop) send neither.
            (&Method::POST, "/shutdown" | "/terminate") if from_a_browser(req.headers()) => {
                tracing::warn!("refused POST /shutdown from a browser page");
                text(
                    StatusCode::FORBIDDEN,
                    "forbidden: /shutdown does not take requests from web pages; send SIGTERM or POST without an origin\n".into(),
                )
            }
            // What a Kubernetes preStop hook of the service's container calls: the
            // config's shutdown steps (deregister, wait, stop, drain), as SIGTERM
            // runs them, while the service still runs (a native sidecar gets
            // its SIGTERM only after the service has exited).
            (&Method::POST, "/terminate") => {
                tracing::info!("terminate requested on the admin listener");
                self.lifecycle.begin_shutdown();
                text(StatusCode::ACCEPTED, "running the shutdown steps\n".into())
            }
            (&Method::POST, "/shutdown") => {
                tracing::info!("shutdown requested on the admin listener");
                self.stop.cancel();
                text(StatusCode::ACCEPTED, "shutting down\n".into())
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

/// Whether a request carries what browsers add to page-initiated requests.
fn from_a_browser(headers: &http::HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN)
        || headers.contains_key("sec-fetch-site")
        || headers.contains_key("sec-fetch-mode")
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
