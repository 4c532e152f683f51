//! A bulkhead's spec, converted from the wire: every value checked, nothing
//! filled in (its own file so that `bulkhead.rs` stays about the permits).

use std::time::Duration;

use gov_proto::v1::{self as proto, GrpcCode};
use http::StatusCode;

use super::adaptive::{self, AdaptiveSpec};
use super::queue::{self, QueueDiscipline};
use super::share::{self, ShareSpec};
use crate::config::invalid::{Ctx, InvalidConfig};
use crate::state::keys::KeyCap;

/// Whose calls share one set of bulkhead permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BulkheadKey {
    Operation,
    Instance,
    InstancePath,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BulkheadSpec {
    pub key: BulkheadKey,
    pub max_concurrent: u32,
    /// Zero: fail fast.
    pub max_wait: Duration,
    /// At most this many waiters per key. `None`: bounded only by `max_wait`.
    pub max_queue: Option<u32>,
    pub timeout: Option<Duration>,
    pub reject_status: StatusCode,
    /// The answer to a gRPC call it rejects.
    pub reject_grpc: GrpcCode,
    /// Keyed per instance: how many scopes it keeps.
    pub keys: KeyCap,
    /// The permits move between `min` and `max` (at most `max_concurrent`)
    /// with the latency of admitted calls; `None`: `max_concurrent`, fixed.
    pub adaptive: Option<AdaptiveSpec>,
    /// `share by consumer { ... }`: the permits shared between consumers by
    /// weight (`share`); only per operation.
    pub share: Option<ShareSpec>,
    /// How waiting calls are served.
    pub queue: QueueDiscipline,
    /// The config declares criticality: waiters are served by class
    /// (set by the config's conversion, not read from the rule).
    pub by_class: bool,
}

impl BulkheadSpec {
    /// Whether waiters are served from the ordered list ([`queue`]).
    pub(crate) fn ordered(&self) -> bool {
        self.by_class || self.queue != QueueDiscipline::Fifo
    }
}

/// A bulkhead's spec from the wire: every value checked, nothing filled in.
pub(crate) fn spec(ctx: &Ctx<'_>, b: &proto::Bulkhead) -> Result<BulkheadSpec, InvalidConfig> {
    if b.max_concurrent == 0 {
        return Err(ctx.err("`max_concurrent` must be > 0"));
    }
    Ok(BulkheadSpec {
        key: match ctx.known::<proto::BulkheadKey>("key", b.key)? {
            proto::BulkheadKey::Operation => BulkheadKey::Operation,
            proto::BulkheadKey::Instance => BulkheadKey::Instance,
            proto::BulkheadKey::InstancePath => BulkheadKey::InstancePath,
        },
        max_concurrent: b.max_concurrent,
        max_wait: Duration::from_millis(b.max_wait_ms),
        max_queue: b.max_queue,
        timeout: (b.timeout_ms > 0).then(|| Duration::from_millis(b.timeout_ms)),
        reject_status: ctx.status(b.reject_status)?,
        reject_grpc: ctx.grpc(b.reject_grpc_status)?,
        keys: crate::state::keys::cap(ctx, b.max_keys, b.overflow)?,
        adaptive: b
            .adaptive
            .as_ref()
            .map(|a| adaptive::spec(ctx, a, b.max_concurrent))
            .transpose()?,
        share: match &b.share {
            Some(_) if b.key != proto::BulkheadKey::Operation as i32 => {
                return Err(ctx.err("`share` applies to a bulkhead `per operation` only"));
            }
            Some(s) => Some(share::spec(ctx, s)?),
            None => None,
        },
        queue: match queue::spec(ctx, b.queue.as_ref())? {
            QueueDiscipline::Fifo => QueueDiscipline::Fifo,
            _ if b.share.is_some() => {
                return Err(ctx.err(
                    "a `queue` discipline does not apply to a bulkhead with `share` (the share serves its waiters)",
                ));
            }
            d => d,
        },
        by_class: false,
    })
}
