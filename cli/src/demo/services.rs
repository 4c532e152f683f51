//! The two demo services behind the agents: small hyper servers on loopback
//! that answer the routes `examples/shop.gov` governs.
//!
//! - `order`: `/orders/{id}` (fast, about 1 ms, and calls inventory through
//!   its agent's outbound listener), `/benchmark/delay/z100` (slow, 100 ms),
//!   `/mdm/supplier` (the supplier master data: see [`Supplier`]).
//! - `inventory`: `/stock/{id}` (fast).
//! - both: `GET /application/readiness` and `POST /admin/consumers/start|stop`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Latency of the fast endpoints.
const FAST: Duration = Duration::from_millis(1);
/// Latency of `/benchmark/delay/z100`.
const SLOW: Duration = Duration::from_millis(100);
/// Share of supplier calls that fail when the backend is healthy.
const HEALTHY_ERRORS: f64 = 0.02;
/// Share of supplier calls that fail at the height of an outage.
const OUTAGE_ERRORS: f64 = 0.95;
/// How long an outage takes to go from healthy to its height.
const OUTAGE_RAMP: Duration = Duration::from_secs(10);

/// The supplier master-data backend of `order`. It starts healthy (2% of
/// calls fail), then an outage begins: the share of failing calls (HTTP 500,
/// business errors for the `mdm` fuse) rises to 95% over 10 s, so the fuse
/// (more than 50% over 1 m) trips after about 20 s. The demo ends the outage
/// once the fuse has shielded the backend for a while, so that a release
/// sticks; the next outage is scheduled after a release.
#[derive(Debug)]
pub struct Supplier {
    /// When the current or next outage begins. `None`: healthy.
    outage_from: Mutex<Option<Instant>>,
}

impl Supplier {
    /// A backend whose first outage begins at `from`.
    pub fn new(from: Instant) -> Self {
        Self {
            outage_from: Mutex::new(Some(from)),
        }
    }

    /// Ends the outage (or cancels the scheduled one).
    pub fn recover(&self) {
        *self.lock() = None;
    }

    /// Schedules the next outage at `from` unless one is already scheduled.
    pub fn schedule_outage(&self, from: Instant) {
        self.lock().get_or_insert(from);
    }

    /// Whether an outage is under way at `now`.
    pub fn in_outage(&self, now: Instant) -> bool {
        self.lock().is_some_and(|from| now >= from)
    }

    /// The share of calls that fail at `now`.
    pub fn error_share(&self, now: Instant) -> f64 {
        match *self.lock() {
            Some(from) if now >= from => {
                let ramp = (now - from).as_secs_f64() / OUTAGE_RAMP.as_secs_f64();
                HEALTHY_ERRORS + (OUTAGE_ERRORS - HEALTHY_ERRORS) * ramp.min(1.0)
            }
            _ => HEALTHY_ERRORS,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.outage_from
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

type Body = Full<Bytes>;
type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// What the order service needs to call inventory through its agent.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// The order agent's outbound listener.
    pub addr: SocketAddr,
    client: HttpClient,
}

impl Outbound {
    pub fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Self {
            addr,
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

/// The demo service `name`, answering on `listener` until `stop`.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    supplier: Arc<Supplier>,
    outbound: Option<Outbound>,
    stop: CancellationToken,
) {
    let mut conns = JoinSet::new();
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (supplier, outbound) = (supplier.clone(), outbound.clone());
        let service = hyper::service::service_fn(move |req| {
            let (supplier, outbound) = (supplier.clone(), outbound.clone());
            async move {
                Ok::<_, std::convert::Infallible>(
                    handle(name, req, &supplier, outbound.as_ref()).await,
                )
            }
        });
        conns.spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        // Reap finished connections so the set stays small.
        while conns.try_join_next().is_some() {}
    }
    // The agents in front have drained by now: close what is left.
    conns.shutdown().await;
}

async fn handle(
    name: &str,
    req: Request<Incoming>,
    supplier: &Supplier,
    outbound: Option<&Outbound>,
) -> Response<Body> {
    let path = req.uri().path();
    match (req.method(), name, path) {
        (&Method::GET, _, "/application/readiness") => text(StatusCode::OK, "UP\n".into()),
        (&Method::POST, _, "/admin/consumers/start" | "/admin/consumers/stop") => {
            text(StatusCode::OK, "ok\n".into())
        }
        (&Method::GET, "order", "/benchmark/delay/z100") => {
            tokio::time::sleep(SLOW).await;
            text(StatusCode::OK, "slept 100ms\n".into())
        }
        (&Method::GET, "order", p) if p.starts_with("/mdm/supplier") => {
            tokio::time::sleep(FAST).await;
            if rand::random::<f64>() < supplier.error_share(Instant::now()) {
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "supplier master data unavailable\n".into(),
                )
            } else {
                text(
                    StatusCode::OK,
                    "{\"supplier\":\"acme\",\"rating\":\"A\"}\n".into(),
                )
            }
        }
        (&Method::GET, "order", p) if p.starts_with("/orders/") => {
            tokio::time::sleep(FAST).await;
            let id = &p["/orders/".len()..];
            match outbound {
                Some(out) => match stock(out, id).await {
                    Ok(stock) => text(StatusCode::OK, format!("order {id}: {stock}")),
                    Err(status) => {
                        text(status, format!("order {id}: inventory answered {status}\n"))
                    }
                },
                None => text(StatusCode::OK, format!("order {id}\n")),
            }
        }
        (&Method::GET, "inventory", p) if p.starts_with("/stock/") => {
            tokio::time::sleep(FAST).await;
            text(
                StatusCode::OK,
                format!("item {}: 42 in stock\n", &p["/stock/".len()..]),
            )
        }
        _ => text(StatusCode::NOT_FOUND, "no such route\n".into()),
    }
}

/// `GET /stock/{id}` on inventory, through the order agent's outbound listener.
async fn stock(out: &Outbound, id: &str) -> Result<String, StatusCode> {
    let req = Request::get(format!("http://{}/stock/{id}", out.addr))
        .header("gov-service", "inventory")
        .body(Empty::new())
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let call = async {
        let resp = out
            .client
            .request(req)
            .await
            .map_err(|_| StatusCode::BAD_GATEWAY)?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|_| StatusCode::BAD_GATEWAY)?
            .to_bytes();
        if status.is_success() {
            Ok(String::from_utf8_lossy(&body).into_owned())
        } else {
            Err(status)
        }
    };
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .unwrap_or(Err(StatusCode::GATEWAY_TIMEOUT))
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supplier_outage_ramps_and_recovers() {
        let start = Instant::now();
        let s = Supplier::new(start + Duration::from_secs(5));
        assert!((s.error_share(start) - HEALTHY_ERRORS).abs() < 1e-9);
        assert!(!s.in_outage(start));
        let half = start + Duration::from_secs(10);
        assert!(s.in_outage(half));
        assert!((s.error_share(half) - (HEALTHY_ERRORS + OUTAGE_ERRORS) / 2.0).abs() < 1e-9);
        let top = start + Duration::from_secs(30);
        assert!((s.error_share(top) - OUTAGE_ERRORS).abs() < 1e-9);
        s.recover();
        assert!((s.error_share(top) - HEALTHY_ERRORS).abs() < 1e-9);
        s.schedule_outage(top + Duration::from_secs(120));
        s.schedule_outage(top + Duration::from_secs(999));
        assert!(s.in_outage(top + Duration::from_secs(121)));
    }

    /// With the load's 20 crm calls/s from the start, the error ratio over
    /// the first minute passes 50% before 30 s: the fuse trips in the first
    /// minute, and not before the outage is visible (10 s).
    #[test]
    fn fuse_ratio_passes_half_within_the_first_minute() {
        let start = Instant::now();
        let s = Supplier::new(start + Duration::from_secs(5));
        let (mut errors, mut calls) = (0.0, 0.0);
        let mut crossed = None;
        for tenth in 0..600 {
            let t = start + Duration::from_millis(tenth * 100);
            errors += s.error_share(t);
            calls += 1.0;
            if crossed.is_none() && calls >= 20.0 && errors / calls > 0.5 {
                crossed = Some(tenth / 10);
            }
        }
        let at = crossed.unwrap_or(u64::MAX);
        assert!((10..30).contains(&at), "crossed 50% at {at}s");
    }
}
