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

/// The pooled HTTP/1.1 client all upstream calls share.
pub(crate) type UpstreamClient = Client<HttpConnector, UpstreamBody>;

/// Builds the upstream client: keep-alive connections pooled per upstream address,
/// `TCP_NODELAY`, a bounded connect time.
pub(crate) fn client() -> UpstreamClient {
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
