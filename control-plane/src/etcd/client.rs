//! govd's etcd v3 client: the calls it makes (KV Range, Put and Txn; Watch;
//! Lease grant, revoke and keep-alive) over the stubs `build.rs` generates
//! from `proto/etcd/`, on one tonic channel balanced over every member in
//! `--store` (a call goes to a member that is up), with TLS (`etcds://`: the
//! members' CA and a client identity, the server name from the endpoint's
//! host), a timeout per call and HTTP/2 keep-alives.

mod error;
mod ops;
pub mod pb;
mod stream;

use std::time::Duration;

use tonic::transport::channel::Change;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

pub use error::{EtcdError, GrpcStatus};
pub use ops::PAGE;
use pb::etcdserverpb::request_op::Request;
use pb::etcdserverpb::response_op::Response;
use pb::etcdserverpb::{
    LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest, RangeResponse, TxnRequest,
    TxnResponse, kv_client::KvClient, lease_client::LeaseClient, watch_client::WatchClient,
};
pub use stream::{KeepAlive, Watch};

/// The largest answer the client takes.
const MAX_ANSWER: usize = 64 << 20;

/// How to reach the members.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// Each call's bound (a stream's: until its first answer).
    pub timeout: Option<Duration>,
    /// How long a connection to one member may take.
    pub connect_timeout: Option<Duration>,
    /// HTTP/2 pings every `.0`, the connection dropped when one is not
    /// answered within `.1` (also while no call is open).
    pub keep_alive: Option<(Duration, Duration)>,
    /// TLS for `https://` endpoints (required with them).
    pub tls: Option<ClientTlsConfig>,
}

/// A client of the members of one etcd cluster (cheap to clone).
#[derive(Clone, Debug)]
pub struct Client {
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
    lease: LeaseClient<Channel>,
}

impl Client {
    /// A client of `endpoints` (`http://HOST:PORT`, or `https://` with
    /// [`ConnectOptions::tls`]). Connections are made by the calls: a member
    /// that is down fails no call while another answers.
    pub fn connect(
        endpoints: &[impl AsRef<str>],
        options: &ConnectOptions,
    ) -> Result<Self, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::Invalid("no etcd endpoints".into()));
        }
        let (channel, changes) = Channel::balance_channel(endpoints.len());
        for url in endpoints {
            let endpoint = endpoint(url.as_ref(), options)?;
            changes
                .try_send(Change::Insert(endpoint.uri().clone(), endpoint))
                .map_err(|_| EtcdError::Invalid("the balanced channel closed".into()))?;
        }
        Ok(Self {
            // Answers of up to 64 MiB (tonic's default is 4 MiB): a page of
            // a paged read ([`RangeRequest::paged`]) and a transaction's reads.
            kv: KvClient::new(channel.clone()).max_decoding_message_size(MAX_ANSWER),
            watch: WatchClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
        })
    }

    /// A read (a key, a prefix: [`RangeRequest::key`], [`RangeRequest::prefix`]).
    pub async fn range(&self, request: RangeRequest) -> Result<RangeResponse, EtcdError> {
        Ok(self.kv.clone().range(request).await?.into_inner())
    }

    /// A read of `key`.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, EtcdError> {
        self.range(RangeRequest::key(key)).await
    }

    /// Puts `value` at `key`; the store's revision after it.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<i64, EtcdError> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            ..PutRequest::default()
        };
        let answer = self.kv.clone().put(request).await?.into_inner();
        Ok(answer.header.map_or(0, |h| h.revision))
    }

    /// A transaction (compares, then the operations of the side they chose).
    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, EtcdError> {
        Ok(self.kv.clone().txn(request).await?.into_inner())
    }

    /// A transaction, then the rest of each of its paged reads
    /// ([`RangeRequest::paged`]), page after page at the transaction's
    /// revision: one consistent read of any number of keys (10,000 agents'
    /// keys are about 2 MB), no answer larger than a page.
    pub async fn txn_whole(&self, txn: TxnRequest) -> Result<TxnResponse, EtcdError> {
        let mut got = self.txn(txn.clone()).await?;
        let revision = got.revision();
        let ops = if got.succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for (request, answer) in ops.iter().zip(got.responses.iter_mut()) {
            let (Some(Request::RequestRange(read)), Some(Response::ResponseRange(page))) =
                (&request.request, &mut answer.response)
            else {
                continue;
            };
            while page.more
                && let Some(last) = page.kvs.last()
            {
                let next = self.range(read.after(&last.key, revision)).await?;
                page.more = next.more;
                page.kvs.extend(next.kvs);
            }
        }
        Ok(got)
    }

    /// Watches `key` from `start_revision` (0: from now).
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        start_revision: i64,
    ) -> Result<Watch, EtcdError> {
        Watch::open(self.watch.clone(), key.into(), start_revision).await
    }

    /// A new lease of `ttl` seconds: its ID.
    pub async fn lease_grant(&self, ttl: i64) -> Result<i64, EtcdError> {
        let request = LeaseGrantRequest {
            ttl,
            ..LeaseGrantRequest::default()
        };
        let answer = self.lease.clone().lease_grant(request).await?.into_inner();
        if answer.error.is_empty() {
            Ok(answer.id)
        } else {
            Err(EtcdError::Refused(answer.error))
        }
    }

    /// Revokes lease `id`: the keys attached to it are removed.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), EtcdError> {
        let request = LeaseRevokeRequest { id };
        self.lease.clone().lease_revoke(request).await?;
        Ok(())
    }

    /// Keeps lease `id` alive (an error when etcd no longer knows it).
    pub async fn lease_keep_alive(&self, id: i64) -> Result<KeepAlive, EtcdError> {
        KeepAlive::open(self.lease.clone(), id).await
    }
}

/// The endpoint of one member, with `options`.
fn endpoint(url: &str, options: &ConnectOptions) -> Result<Endpoint, EtcdError> {
    let bad = |source| EtcdError::Endpoint {
        url: url.to_owned(),
        source,
    };
    let tls = if url.starts_with("https://") {
        true
    } else if url.starts_with("http://") {
        false
    } else {
        return Err(EtcdError::Invalid(format!(
            "`{url}` is not an etcd endpoint: it starts with neither http:// nor https://"
        )));
    };
    let mut endpoint = Endpoint::from_shared(url.to_owned()).map_err(bad)?;
    match (tls, &options.tls) {
        (true, Some(config)) => endpoint = endpoint.tls_config(config.clone()).map_err(bad)?,
        (true, None) => {
            return Err(EtcdError::Invalid(format!(
                "`{url}` is https:// but no TLS settings were given"
            )));
        }
        (false, Some(_)) => {
            return Err(EtcdError::Invalid(format!(
                "TLS settings are for https:// endpoints, not `{url}`"
            )));
        }
        (false, None) => {}
    }
    if let Some((interval, timeout)) = options.keep_alive {
        endpoint = endpoint
            .keep_alive_while_idle(true)
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(timeout);
    }
    if let Some(timeout) = options.timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if let Some(timeout) = options.connect_timeout {
        endpoint = endpoint.connect_timeout(timeout);
    }
    Ok(endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn endpoints_and_tls_settings_must_agree() {
        let plain = ConnectOptions::default();
        let tls = ConnectOptions {
            tls: Some(ClientTlsConfig::new()),
            ..ConnectOptions::default()
        };
        let none: [&str; 0] = [];
        for (endpoints, options, problem) in [
            (&none[..], &plain, "no etcd endpoints"),
            (
                &["127.0.0.1:2379"][..],
                &plain,
                "neither http:// nor https://",
            ),
            (&["https://127.0.0.1:2379"][..], &plain, "no TLS settings"),
            (
                &["http://127.0.0.1:2379"][..],
                &tls,
                "for https:// endpoints",
            ),
            (&["http://a b:1"][..], &plain, "is not an etcd endpoint"),
        ] {
            let err = Client::connect(endpoints, options).unwrap_err();
            assert!(err.to_string().contains(problem), "{endpoints:?}: {err}");
            assert!(!err.transient(), "{err}");
        }
        assert!(Client::connect(&["http://127.0.0.1:1", "http://127.0.0.1:2"], &plain).is_ok());
        assert!(Client::connect(&["https://127.0.0.1:1"], &tls).is_ok());
    }

    /// A member that is not there fails the call as one worth trying again.
    #[tokio::test]
    async fn a_call_to_no_member_fails_in_transit() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let options = ConnectOptions {
            timeout: Some(Duration::from_secs(5)),
            connect_timeout: Some(Duration::from_secs(5)),
            ..ConnectOptions::default()
        };
        let client = Client::connect(&[url], &options).unwrap();
        let err = client.get("k").await.unwrap_err();
        assert!(err.transient(), "{err:?}");
    }
}
