//! Where the proxy sends requests: the pooled upstream client, the local service, and
//! the static instance lists of other services for the outbound listener.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::Authority;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::body::Counted;
use super::proxy::RequestTally;

/// The body the proxy forwards upstream: the client's body, counted as it streams.
pub(crate) type UpstreamBody = Counted<Incoming, RequestTally>;

/// A pooled upstream client.
pub(crate) type UpstreamClient = Client<HttpConnector, UpstreamBody>;

/// Which protocol the proxy speaks to upstreams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 whatever the client spoke (the default: every HTTP server speaks it).
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge (h2c), for upstreams that speak only HTTP/2.
    Http2,
    /// The protocol the client spoke: HTTP/2 clients (gRPC) get an HTTP/2 upstream
    /// connection, with trailers passed through; HTTP/1 clients an HTTP/1.1 one.
    Downstream,
}

impl std::str::FromStr for UpstreamProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "http1" => Ok(Self::Http1),
            "http2" => Ok(Self::Http2),
            "downstream" => Ok(Self::Downstream),
            _ => Err(format!(
                "`{s}` is not an upstream protocol: use `http1`, `http2` or `downstream`"
            )),
        }
    }
}

/// The pooled clients all upstream calls share: keep-alive connections pooled per
/// upstream address (HTTP/2 ones multiplexed), `TCP_NODELAY`, a bounded connect time.
pub(crate) struct Clients {
    protocol: UpstreamProtocol,
    http1: UpstreamClient,
    http2: UpstreamClient,
}

impl Clients {
    pub(crate) fn new(protocol: UpstreamProtocol) -> Self {
        Self {
            protocol,
            http1: client(false),
            http2: client(true),
        }
    }

    /// The client for a request that arrived as `version`, and the version to send.
    pub(crate) fn pick(&self, version: http::Version) -> (&UpstreamClient, http::Version) {
        let http2 = match self.protocol {
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::Http2 => true,
            UpstreamProtocol::Downstream => version == http::Version::HTTP_2,
        };
        if http2 {
            (&self.http2, http::Version::HTTP_2)
        } else {
            (&self.http1, http::Version::HTTP_11)
        }
    }
}

fn client(http2: bool) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    connector.set_keepalive(Some(Duration::from_secs(60)));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .timer(TokioTimer::new())
        .http2_only(http2)
        .build(connector)
}

/// One instance of a service the local service calls.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Where it listens.
    pub authority: Authority,
    /// Its identity for client-side rules (per-instance bulkheads): `host:port`.
    pub id: Arc<str>,
}

/// The instances of one service, picked round robin.
#[derive(Debug)]
pub(crate) struct Pool {
    instances: Vec<Instance>,
    next: AtomicUsize,
}

impl Pool {
    fn new(instances: Vec<Instance>) -> Self {
        Self {
            instances,
            next: AtomicUsize::new(0),
        }
    }

    /// The next instance, round robin; `None` when the list is empty.
    pub(crate) fn pick(&self) -> Option<&Instance> {
        if self.instances.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.instances.get(n % self.instances.len())
    }
}

/// The static instance lists per service name, for the outbound listener.
#[derive(Debug, Default)]
pub(crate) struct Directory {
    services: HashMap<String, Pool>,
}

impl Directory {
    pub(crate) fn new(services: &[(String, Vec<Authority>)]) -> Self {
        let services = services
            .iter()
            .map(|(name, addrs)| {
                let instances = addrs
                    .iter()
                    .map(|authority| Instance {
                        authority: authority.clone(),
                        id: Arc::from(authority.as_str()),
                    })
                    .collect();
                (name.clone(), Pool::new(instances))
            })
            .collect();
        Self { services }
    }

    /// The pool of `service`, if it is known.
    pub(crate) fn get(&self, service: &str) -> Option<&Pool> {
        self.services.get(service)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_cycles_through_instances() {
        let dir = Directory::new(&[(
            "inventory".to_owned(),
            vec![
                Authority::from_static("127.0.0.1:9001"),
                Authority::from_static("127.0.0.1:9002"),
            ],
        )]);
        let pool = dir.get("inventory").unwrap();
        let picked: Vec<_> = (0..4).map(|_| pool.pick().unwrap().id.clone()).collect();
        assert_eq!(
            picked.iter().map(|s| &**s).collect::<Vec<_>>(),
            [
                "127.0.0.1:9001",
                "127.0.0.1:9002",
                "127.0.0.1:9001",
                "127.0.0.1:9002"
            ]
        );
        assert!(dir.get("billing").is_none());
    }
}
