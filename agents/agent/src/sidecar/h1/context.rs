//! What every connection of a proxy listener shares on the HTTP/1 path.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::pool::IdlePool;
use crate::sidecar::listener::{Shared, Side};

/// What a connection of a proxy listener needs.
#[derive(Clone)]
pub(crate) struct Listener {
    pub(crate) shared: Arc<Shared>,
    pub(crate) side: Side,
    pub(crate) stop: CancellationToken,
    /// `stop`, as a flag read on every request (`is_cancelled` takes a lock).
    pub(super) stopping: Arc<AtomicBool>,
    pub(crate) header_read_timeout: Option<Duration>,
    /// The longest a client may stall a request body or stop reading a response.
    pub(crate) client_timeout: Option<Duration>,
    /// The listener's connections, and its count of refused requests.
    pub(crate) conns: Arc<crate::sidecar::serve::Connections>,
    /// Idle upstream connections, shared by the listeners.
    pub(super) idle: Arc<IdlePool>,
}

impl Listener {
    /// The context of a listener's connections. Call it inside the runtime: a task
    /// raises the stop flag when `stop` is cancelled.
    pub(crate) fn new(
        shared: Arc<Shared>,
        side: Side,
        stop: CancellationToken,
        header_read_timeout: Option<Duration>,
        client_timeout: Option<Duration>,
        conns: Arc<crate::sidecar::serve::Connections>,
        idle: Arc<IdlePool>,
    ) -> Self {
        let stopping = Arc::new(AtomicBool::new(stop.is_cancelled()));
        let (flag, token) = (stopping.clone(), stop.clone());
        tokio::spawn(async move {
            token.cancelled().await;
            flag.store(true, Ordering::Relaxed);
        });
        Self {
            shared,
            side,
            stop,
            stopping,
            header_read_timeout,
            client_timeout,
            conns,
            idle,
        }
    }

    /// Whether the listener is stopping (connections close after their request).
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
}
