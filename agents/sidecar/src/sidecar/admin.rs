//! The admin listener: `/metrics`, `/ready`, `/live` and `POST /shutdown`.
//!
//! It runs on its own port so that probes and scrapes never queue behind proxied
//! traffic or count against its rules, and it keeps answering while the proxy
//! listeners drain (`/ready` then says 503).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

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
    /// Why the control plane refuses this agent's credentials, while it does.
    control_plane_refused: std::sync::Mutex<Option<String>>,
    /// Refusals of this agent's credentials since start.
    control_plane_auth_failures: AtomicU64,
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

    /// Records a refusal of this agent's credentials by the control plane
    /// (`Some(reason)`), or that a stream was accepted (`None`).
    pub fn set_control_plane_refused(&self, reason: Option<&str>) {
        if reason.is_some() {
            self.control_plane_auth_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        *self
            .control_plane_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason.map(str::to_owned);
    }

    /// Why the control plane refuses this agent, while it does.
    pub fn control_plane_refusal(&self) -> Option<String> {
        self.control_plane_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Refusals of this agent's credentials since start.
    pub fn control_plane_auth_failures(&self) -> u64 {
        self.control_plane_auth_failures.load(Ordering::Relaxed)
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
            // A browser sends `origin` (and `sec-fetch-*`) with every
            // cross-site POST: a web page on this host must not stop the agent
            // with a form. Tools (curl, the platform's preStop) send neither.
            (&Method::POST, "/shutdown") if from_a_browser(req.headers()) => {
                tracing::warn!("refused POST /shutdown from a browser page");
                text(
                    StatusCode::FORBIDDEN,
                    "forbidden: /shutdown does not take requests from web pages; send SIGTERM or POST without an origin\n".into(),
                )
            }
            (&Method::POST, "/shutdown") => {
                tracing::info!("shutdown requested on the admin listener");
                self.stop.cancel();
                text(StatusCode::ACCEPTED, "shutting down\n".into())
            }
            (_, "/live" | "/ready" | "/metrics" | "/shutdown") => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed\n".into(),
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /metrics, /ready, /live or POST /shutdown\n".into(),
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
