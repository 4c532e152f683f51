//! The demo's load generator: a few fixed-rate streams of requests (Poisson
//! arrivals, so that bursts happen as in real traffic) sent to the agents'
//! inbound listeners, as the consumers `crm` and `web`.
//!
//! Bounded on every side: at most [`MAX_IN_FLIGHT`] requests at once (an
//! arrival that finds none free is skipped and counted), each request at most
//! [`REQUEST_TIMEOUT`], and the whole load stops on `stop` or after
//! [`MAX_RUN`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Requests in flight at most.
pub const MAX_IN_FLIGHT: u32 = 64;
/// The longest a request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The load stops by itself after this long.
pub const MAX_RUN: Duration = Duration::from_secs(3600);

/// The header `examples/shop.gov` reads the consumer from.
const CONSUMER: &str = "x-gov-consumer";

/// One stream of requests.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    pub consumer: &'static str,
    /// `order` or `inventory`.
    pub service: &'static str,
    /// The path; `{n}` is replaced by a counter.
    pub path: &'static str,
    /// Requests per second.
    pub rate: f64,
}

/// The demo's traffic, about 145 requests/s in total.
pub const STREAMS: [Stream; 4] = [
    // Fast shop traffic; each order call also calls inventory.
    Stream {
        consumer: "web",
        service: "order",
        path: "/orders/{n}",
        rate: 30.0,
    },
    // The slow endpoint at about 90% of what its bulkhead (10 permits of 100 ms)
    // admits: bursts above 10 at once are shed with 408.
    Stream {
        consumer: "web",
        service: "order",
        path: "/benchmark/delay/z100",
        rate: 90.0,
    },
    // The CRM reads supplier master data: the `mdm` fuse watches these calls,
    // well under the `crm_supplier` limit of 100/s.
    Stream {
        consumer: "crm",
        service: "order",
        path: "/mdm/supplier?id={n}",
        rate: 20.0,
    },
    // The same endpoint for the web shop: no fuse or limit matches it.
    Stream {
        consumer: "web",
        service: "order",
        path: "/mdm/supplier?id={n}",
        rate: 5.0,
    },
];

/// What the load generator saw, cumulative.
#[derive(Debug, Default)]
pub struct Counters {
    pub sent: AtomicU64,
    /// 2xx answers.
    pub ok: AtomicU64,
    /// Answers made by an agent's rule (`gov-rejected-by` header).
    pub rejected: AtomicU64,
    /// Other non-2xx answers (the services' own errors).
    pub errors: AtomicU64,
    /// No answer: connection failed or timed out.
    pub failed: AtomicU64,
    /// Arrivals not sent because [`MAX_IN_FLIGHT`] requests were in flight.
    pub skipped: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub sent: u64,
    pub ok: u64,
    pub rejected: u64,
    pub errors: u64,
    pub failed: u64,
    pub skipped: u64,
}

impl Counters {
    pub fn totals(&self) -> Totals {
        Totals {
            sent: self.sent.load(Relaxed),
            ok: self.ok.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            errors: self.errors.load(Relaxed),
            failed: self.failed.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
        }
    }
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Runs `streams` against the agents (`targets`: service name, inbound
/// address) until `stop` or [`MAX_RUN`], then waits (at most
/// [`REQUEST_TIMEOUT`]) for the requests in flight.
pub async fn run(
    streams: &[Stream],
    targets: Vec<(&'static str, SocketAddr)>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT as usize));
    let deadline = tokio::time::sleep(MAX_RUN);
    let mut tasks = JoinSet::new();
    for stream in streams {
        let Some(&(_, addr)) = targets.iter().find(|(s, _)| *s == stream.service) else {
            continue;
        };
        tasks.spawn(run_stream(
            *stream,
            addr,
            client.clone(),
            permits.clone(),
            counters.clone(),
            stop.clone(),
        ));
    }
    tokio::select! {
        () = stop.cancelled() => {}
        () = deadline => stop.cancel(),
    }
    while tasks.join_next().await.is_some() {}
    // Every request holds a permit until it is done.
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, permits.acquire_many(MAX_IN_FLIGHT)).await;
}

async fn run_stream(
    stream: Stream,
    addr: SocketAddr,
    client: HttpClient,
    permits: Arc<Semaphore>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    let mut n: u64 = 0;
    // Arrivals are scheduled on absolute times so that timer rounding does
    // not lower the rate; after a stall, the missed arrivals are dropped.
    let mut next = tokio::time::Instant::now();
    loop {
        next += exponential(stream.rate);
        let now = tokio::time::Instant::now();
        if next + Duration::from_secs(1) < now {
            next = now;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        n += 1;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            counters.skipped.fetch_add(1, Relaxed);
            continue;
        };
        let uri = format!(
            "http://{addr}{}",
            stream.path.replace("{n}", &(n % 1000).to_string())
        );
        let Ok(req) = Request::get(uri)
            .header(CONSUMER, stream.consumer)
            .body(Empty::new())
        else {
            continue;
        };
        counters.sent.fetch_add(1, Relaxed);
        let (client, counters) = (client.clone(), counters.clone());
        tokio::spawn(async move {
            let call = async {
                let resp = client.request(req).await.ok()?;
                let rejected = resp.headers().contains_key(gov_engine::REJECTED_BY);
                let status = resp.status();
                // Read the body so the connection goes back to the pool.
                resp.into_body().collect().await.ok()?;
                Some((status, rejected))
            };
            let counter = match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
                Ok(Some((_, true))) => &counters.rejected,
                Ok(Some((status, false))) if status.is_success() => &counters.ok,
                Ok(Some(_)) => &counters.errors,
                Ok(None) | Err(_) => &counters.failed,
            };
            counter.fetch_add(1, Relaxed);
            drop(permit);
        });
    }
}

/// A random gap between Poisson arrivals at `rate` per second.
fn exponential(rate: f64) -> Duration {
    let u: f64 = rand::random::<f64>();
    // 1 - u is in (0, 1]: its logarithm is finite.
    let secs = -(1.0 - u).ln() / rate.max(0.001);
    Duration::from_secs_f64(secs.min(10.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_rate_is_within_the_demo_budget() {
        let total: f64 = STREAMS.iter().map(|s| s.rate).sum();
        assert!((50.0..=200.0).contains(&total), "{total}");
    }

    #[test]
    fn gaps_average_to_the_rate() {
        let n = 20_000;
        let sum: f64 = (0..n).map(|_| exponential(100.0).as_secs_f64()).sum();
        let mean = sum / f64::from(n);
        assert!((0.008..0.012).contains(&mean), "{mean}");
    }
}
