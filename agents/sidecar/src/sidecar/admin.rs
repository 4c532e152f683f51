//! The admin listener: `/metrics`, `/config`, `/ready`, `/live`, `POST /terminate`
//! and `POST /shutdown`.
//!
//! It runs on its own port so that probes and scrapes never queue behind proxied
//! traffic or count against its rules, and it keeps answering while the proxy
//! listeners drain (`/ready` then says 503).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

use super::metrics;

/// Whether the agent should get traffic: a config is loaded and it is not draining.
#[derive(Debug, Default)]
pub struct Health {
    config_loaded: AtomicBool,
    draining: AtomicBool,
    /// Warmup/shutdown gate (`crate::lifecycle`): 0 open (no warmup), 1 held until
    /// registered, 2 registered, 3 deregistered.
    registration: AtomicU8,
}

impl Health {
    /// Records that a config is in force.
    pub fn set_config_loaded(&self) {
        self.config_loaded.store(true, Ordering::Release);
    }

    /// Records that the agent is stopping: from here on `/ready` fails.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Holds `/ready` at 503 until [`Self::set_registered`] (warmup); only before
    /// the first registration.
    pub fn hold(&self) {
        let _ = self
            .registration
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The warmup registered the instance: `/ready` may say 200.
    pub fn set_registered(&self) {
        let _ = self
            .registration
            .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire);
        let _ = self
            .registration
            .compare_exchange(0, 2, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The shutdown deregistered the instance: `/ready` says 503, traffic still served.
    pub fn set_deregistered(&self) {
        self.registration.store(3, Ordering::Release);
    }

    /// Why the agent is not ready, or `None` when it is.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        if self.draining.load(Ordering::Acquire) {
            Some("draining")
        } else if self.registration.load(Ordering::Acquire) == 3 {
            Some("deregistered")
        } else if self.registration.load(Ordering::Acquire) == 1 {
            Some("warming up (not registered yet)")
        } else if !self.config_loaded.load(Ordering::Acquire) {
            Some("no config loaded")
        } else {
            None
        }
    }
}

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
            (&Method::GET | &Method::HEAD, "/ready") => match self.health.not_ready_reason() {
                None => text(StatusCode::OK, "ready\n".into()),
                Some(reason) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {reason}\n"),
                ),
            },
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
