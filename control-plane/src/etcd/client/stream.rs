//! The two bidirectional streams govd keeps open: a watch (a create request
//! first, then etcd's responses) and a lease's keep-alive (a request per
//! renewal, an answer each).

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use super::error::EtcdError;
use super::pb::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, WatchCreateRequest, WatchRequest, WatchResponse,
    lease_client::LeaseClient, watch_client::WatchClient, watch_request,
};

/// Requests queued on a stream before a send waits (govd sends one at a time).
const QUEUE: usize = 4;

/// A watch of one key: etcd's responses, the first saying it was created.
/// A response with `canceled` set ends it (`compact_revision` then says
/// the start revision was compacted away).
#[derive(Debug)]
pub struct Watch {
    /// Kept open: the watch lives as long as its request stream.
    _requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

impl Watch {
    /// Opens a watch of `key` from `start_revision` (0: from now).
    pub(super) async fn open(
        mut client: WatchClient<Channel>,
        key: Vec<u8>,
        start_revision: i64,
    ) -> Result<Self, EtcdError> {
        let (requests, queue) = mpsc::channel(QUEUE);
        // The create request goes with the call: etcd sends its headers
        // with its first answer, which the call waits for.
        let create = WatchCreateRequest {
            key,
            start_revision,
            ..WatchCreateRequest::default()
        };
        requests
            .send(WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
            })
            .await
            .map_err(|_| EtcdError::Ended("watch"))?;
        let responses = client.watch(ReceiverStream::new(queue)).await?.into_inner();
        Ok(Self {
            _requests: requests,
            responses,
        })
    }

    /// The next response; `None` when etcd ended the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, EtcdError> {
        Ok(self.responses.message().await?)
    }
}

/// A lease kept alive: each [`KeepAlive::renew`] sends a keep-alive and
/// reads its answer.
#[derive(Debug)]
pub struct KeepAlive {
    id: i64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    responses: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Opens the keep-alive stream of lease `id` and renews it once: an
    /// error when etcd no longer knows the lease.
    pub(super) async fn open(mut client: LeaseClient<Channel>, id: i64) -> Result<Self, EtcdError> {
        let (requests, queue) = mpsc::channel(QUEUE);
        // The first renewal goes with the call: etcd sends its headers with
        // its first answer, which the call waits for.
        requests
            .send(LeaseKeepAliveRequest { id })
            .await
            .map_err(|_| EtcdError::Ended("lease keep-alive"))?;
        let mut responses = client
            .lease_keep_alive(ReceiverStream::new(queue))
            .await?
            .into_inner();
        match responses.message().await? {
            Some(answer) if answer.ttl > 0 => Ok(Self {
                id,
                requests,
                responses,
            }),
            Some(_) => Err(EtcdError::Refused(format!("lease {id} not found"))),
            None => Err(EtcdError::Ended("lease keep-alive")),
        }
    }

    /// Renews the lease: its time to live in seconds from now, as etcd
    /// answers (0 or less: the lease is gone).
    pub async fn renew(&mut self) -> Result<i64, EtcdError> {
        self.requests
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| EtcdError::Ended("lease keep-alive"))?;
        match self.responses.message().await? {
            Some(answer) => Ok(answer.ttl),
            None => Err(EtcdError::Ended("lease keep-alive")),
        }
    }
}
