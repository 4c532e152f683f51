//! What one client may hold of govd: a cap on open connections, a cap per
//! client address, a deadline for a new connection's first bytes (a TLS
//! ClientHello or the HTTP/2 preface), and one for its first authenticated
//! call, so that idle sockets cannot fill the cap: a connection that only
//! answers HTTP/2 PINGs is closed after `--auth-timeout`.
//!
//! Connections beyond the cap are not accepted until one closes: they wait
//! in the kernel's backlog rather than cost govd memory. A connection from
//! an address that holds `--max-connections-per-client` already is accepted
//! and closed at once (its address is known only once accepted).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// HTTP/2 keepalive: pings this often notice a dead agent or client.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ... and give up on a peer that does not answer within this.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How many connections govd holds and how long it waits for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at once (agents, govc, TUIs together).
    pub max_connections: usize,
    /// Open connections at once from one client IP address.
    pub max_connections_per_client: usize,
    /// HTTP/2 streams at once on one connection.
    pub max_streams_per_connection: u32,
    /// A new connection must send its first bytes within this.
    pub handshake_timeout: Duration,
    /// ... and make its first authenticated call within this.
    pub auth_timeout: Duration,
    /// HTTP/2 pings this often notice a dead peer...
    pub http2_keepalive_interval: Duration,
    /// ... that does not answer within this.
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive probes after this long idle.
    pub tcp_keepalive: Duration,
    /// `Watch` streams open at once per token.
    pub max_watches_per_token: usize,
    /// New agent streams admitted per second (a token bucket, see
    /// [`Admission`]); 0: no limit.
    pub agent_admissions_per_second: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_client: 256,
            max_streams_per_connection: 128,
            handshake_timeout: Duration::from_secs(10),
            auth_timeout: Duration::from_secs(10),
            http2_keepalive_interval: KEEPALIVE_INTERVAL,
            http2_keepalive_timeout: KEEPALIVE_TIMEOUT,
            tcp_keepalive: Duration::from_secs(60),
            max_watches_per_token: 16,
            agent_admissions_per_second: 1000,
        }
    }
}

/// An accepted connection holding one of the cap's permits until it closes.
pub struct Capped {
    stream: TcpStream,
    /// Until the first bytes arrive.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Until its first authenticated call.
    auth_deadline: Option<Pin<Box<Sleep>>>,
    held: Held,
    _permit: OwnedSemaphorePermit,
}

/// Why govd closed a connection it had accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Its address held `--max-connections-per-client` already.
    ClientCap,
    /// It sent nothing within `--handshake-timeout`.
    NoHandshake,
    /// It made no authenticated call within `--auth-timeout`.
    Unauthenticated,
    /// Its client certificate was refused at the TLS handshake (expired,
    /// not yet valid, from a CA govd does not trust).
    CertificateRefused,
}

/// The open connections by client, shared by the listener (which opens
/// and closes them) and the gate in front of the gRPC services (which marks
/// a connection's first authenticated call), and counted for `/metrics`.
#[derive(Debug, Default)]
pub struct Registry {
    table: Mutex<Table>,
    closed: [AtomicU64; Closed::ALL.len()],
}

#[derive(Debug, Default)]
struct Table {
    per_client: HashMap<IpAddr, usize>,
    /// Whether each open connection (by its peer address) has proved itself.
    proved: HashMap<SocketAddr, Arc<AtomicBool>>,
}

/// A connection's place in the [`Registry`], given back when it closes.
struct Held {
    registry: Arc<Registry>,
    peer: Option<SocketAddr>,
    proved: Arc<AtomicBool>,
}

/// `incoming` with at most `limits.max_connections` open at once and
/// `limits.max_connections_per_client` from one address, each dropped if it
/// sends nothing within `limits.handshake_timeout` or makes no
/// authenticated call (marked with [`Registry::prove`]) within
/// `limits.auth_timeout`.
pub fn capped(
    incoming: impl Stream<Item = io::Result<TcpStream>> + Send + Unpin + 'static,
    limits: ConnectionLimits,
    registry: Arc<Registry>,
) -> impl Stream<Item = io::Result<Capped>> + Send + 'static {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Said once per episode of a full cap, not once per connection.
    let warned = Arc::new(AtomicBool::new(false));
    futures::stream::unfold(incoming, move |mut incoming| {
        let (slots, warned, registry) = (slots.clone(), warned.clone(), registry.clone());
        async move {
            let permit = match slots.clone().try_acquire_owned() {
                Ok(permit) => {
                    warned.store(false, Ordering::Relaxed);
                    permit
                }
                Err(_) => {
                    if !warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            max = limits.max_connections,
                            "connection cap reached: further connections wait until one closes (--max-connections)"
                        );
                    }
                    slots.acquire_owned().await.ok()?
                }
            };
            let (stream, held) = loop {
                let stream = match incoming.next().await? {
                    Ok(stream) => stream,
                    Err(error) => return Some((Err(error), incoming)),
                };
                let peer = stream.peer_addr().ok();
                match registry.open(peer, limits.max_connections_per_client) {
                    Some(held) => break (stream, held),
                    // Closed as it is dropped; the permit serves the next one.
                    None => tracing::debug!(
                        ?peer,
                        "closed a connection over --max-connections-per-client"
                    ),
                }
            };
            let item = Capped {
                stream,
                deadline: Some(Box::pin(tokio::time::sleep(limits.handshake_timeout))),
                auth_deadline: Some(Box::pin(tokio::time::sleep(limits.auth_timeout))),
                held,
                _permit: permit,
            };
            Some((Ok(item), incoming))
        }
    })
}

/// How long a new agent stream waits for its turn before it is refused
/// (UNAVAILABLE: the agent backs off and tries again): under the 5 s an
/// agent waits for govd's answer to its `Connect`.
pub const ADMISSION_WAIT: Duration = Duration::from_secs(3);

/// New agent streams admitted at a bounded rate, so that the agents of a
/// whole fleet reconnecting at once (a govd restart) cost govd (hellos,
/// first pushes) and its store (a revision read per stream) a steady rate,
/// not a spike: each stream reserves the next free slot of the schedule
/// (one every `1 / rate`, a burst of one second's worth allowed) and waits
/// for it, or is refused when its slot is more than [`ADMISSION_WAIT`] away.
#[derive(Debug)]
pub struct Admission {
    interval: Option<Duration>,
    burst: Duration,
    /// The time the next stream's slot starts.
    next: Mutex<Option<tokio::time::Instant>>,
}

impl Admission {
    /// `per_second` streams a second; 0: no limit.
    pub fn new(per_second: u32) -> Self {
        let interval = (per_second > 0).then(|| Duration::from_secs(1) / per_second);
        Admission {
            interval,
            burst: Duration::from_secs(1),
            next: Mutex::new(None),
        }
    }

    /// Waits for this stream's turn; `false` (nothing reserved) when it is
    /// more than `max_wait` away.
    pub async fn admit(&self, max_wait: Duration) -> bool {
        let Some(interval) = self.interval else {
            return true;
        };
        let now = tokio::time::Instant::now();
        // Slots unused while quiet are kept up to one second's burst.
        let earliest = now.checked_sub(self.burst).unwrap_or(now);
        let at = {
            let mut next = self
                .next
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let at = next.map_or(earliest, |n| n.max(earliest));
            if at.saturating_duration_since(now) > max_wait {
                return false;
            }
            *next = Some(at + interval);
            at
        };
        tokio::time::sleep_until(at).await;
        true
    }
}

// === impl Registry ===

impl Closed {
    pub const ALL: [Closed; 4] = [
        Closed::ClientCap,
        Closed::NoHandshake,
        Closed::Unauthenticated,
        Closed::CertificateRefused,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Closed::ClientCap => "client_cap",
            Closed::NoHandshake => "no_handshake",
            Closed::Unauthenticated => "unauthenticated",
            Closed::CertificateRefused => "certificate_refused",
        }
    }
}

impl Registry {
    /// Marks the connection from `peer` as having made an authenticated
    /// call: it is no longer closed at `--auth-timeout`.
    pub fn prove(&self, peer: SocketAddr) {
        if let Some(proved) = self.lock().proved.get(&peer) {
            proved.store(true, Ordering::Relaxed);
        }
    }

    /// Connections govd closed, by why.
    pub fn closed(&self, why: Closed) -> u64 {
        self.closed
            .get(why as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// `govd_connections_closed_total` and `govd_connections_open`.
    pub fn render(&self, enc: &mut gov_common::prom::Encoder) {
        enc.family(
            "govd_connections_open",
            "gauge",
            "Connections open now (agents, govc, TUIs).",
        );
        let open = self.lock().proved.len() as u64;
        enc.sample("govd_connections_open", &[], open);
        enc.family(
            "govd_connections_closed_total",
            "counter",
            "Connections govd closed before they proved anything, by why: client_cap (--max-connections-per-client), no_handshake (--handshake-timeout), unauthenticated (--auth-timeout), certificate_refused (a client certificate refused at the TLS handshake).",
        );
        for why in Closed::ALL {
            let n = self.closed(why);
            enc.sample(
                "govd_connections_closed_total",
                &[("reason", why.label())],
                n,
            );
        }
    }

    pub(crate) fn count(&self, why: Closed) {
        if let Some(c) = self.closed.get(why as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for a connection from `peer`, unless its address holds `max`.
    fn open(self: &Arc<Self>, peer: Option<SocketAddr>, max: usize) -> Option<Held> {
        let proved = Arc::new(AtomicBool::new(false));
        if let Some(peer) = peer {
            let mut table = self.lock();
            let n = table.per_client.entry(peer.ip()).or_insert(0);
            if *n >= max.max(1) {
                drop(table);
                self.count(Closed::ClientCap);
                return None;
            }
            *n += 1;
            table.proved.insert(peer, proved.clone());
        }
        Some(Held {
            registry: self.clone(),
            peer,
            proved,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(peer) = self.peer else { return };
        let mut table = self.registry.lock();
        table.proved.remove(&peer);
        if let Some(n) = table.per_client.get_mut(&peer.ip()) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                table.per_client.remove(&peer.ip());
            }
        }
    }
}

// === impl Capped ===

impl Capped {
    /// Whether a deadline this connection has not met has passed (polling
    /// them also registers their wake-ups); clears the deadlines it met.
    fn overdue(&mut self, cx: &mut Context<'_>) -> Option<Closed> {
        if self
            .deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
        {
            return Some(Closed::NoHandshake);
        }
        if self.held.proved.load(Ordering::Relaxed) {
            self.auth_deadline = None;
        } else if self
            .auth_deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
        {
            return Some(Closed::Unauthenticated);
        }
        None
    }
}

impl Connected for Capped {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Capped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let spoke = matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before;
        if spoke {
            self.deadline = None;
        }
        if polled.is_pending()
            && let Some(why) = self.overdue(cx)
        {
            // Counted once: the error closes the connection.
            self.held.registry.count(why);
            self.deadline = None;
            self.auth_deadline = None;
            let what = match why {
                Closed::NoHandshake => "no handshake within the handshake timeout",
                _ => "no authenticated call within --auth-timeout",
            };
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)));
        }
        polled
    }
}

impl AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn pair(
        limits: ConnectionLimits,
    ) -> (
        std::net::SocketAddr,
        impl Stream<Item = io::Result<Capped>> + Send,
    ) {
        let (addr, incoming, _) = with_registry(limits).await;
        (addr, incoming)
    }

    async fn with_registry(
        limits: ConnectionLimits,
    ) -> (
        std::net::SocketAddr,
        impl Stream<Item = io::Result<Capped>> + Send,
        Arc<Registry>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let registry = Arc::new(Registry::default());
        (addr, capped(incoming, limits, registry.clone()), registry)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_an_authenticated_call_is_closed_at_the_auth_timeout() {
        let limits = ConnectionLimits {
            auth_timeout: Duration::from_secs(3),
            ..ConnectionLimits::default()
        };
        let (addr, incoming, registry) = with_registry(limits).await;
        let mut incoming = std::pin::pin!(incoming);
        let mut buf = [0u8; 8];
        // It speaks (an HTTP/2 preface, PING answers) but never proves itself.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        idle.write_all(b"PRI").await.unwrap();
        assert_eq!(accepted.read(&mut buf).await.unwrap(), 3);
        let error = accepted.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(registry.closed(Closed::Unauthenticated), 1);

        // One that made an authenticated call stays past the deadline.
        let mut proved = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        registry.prove(proved.local_addr().unwrap());
        tokio::time::sleep(Duration::from_secs(10)).await;
        proved.write_all(b"hi").await.unwrap();
        assert_eq!(accepted.read(&mut buf).await.unwrap(), 2);
        assert_eq!(registry.closed(Closed::Unauthenticated), 1);
    }

    #[tokio::test]
    async fn beyond_the_per_client_cap_a_connection_is_closed_and_its_slot_freed() {
        let limits = ConnectionLimits {
            max_connections: 3,
            max_connections_per_client: 2,
            ..ConnectionLimits::default()
        };
        let (addr, incoming, registry) = with_registry(limits).await;
        let mut incoming = std::pin::pin!(incoming);
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        let held = [
            incoming.next().await.unwrap().unwrap(),
            incoming.next().await.unwrap().unwrap(),
        ];
        // The third is accepted and closed: it reads the end of the stream.
        let next = tokio::time::timeout(Duration::from_millis(300), incoming.next()).await;
        assert!(
            next.is_err(),
            "a third connection from one address was kept"
        );
        let mut buf = [0u8; 1];
        assert_eq!(third.read(&mut buf).await.unwrap_or(0), 0);
        assert_eq!(registry.closed(Closed::ClientCap), 1);
        // Once one closes, the address may open another.
        drop(held);
        let _d = TcpStream::connect(addr).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), incoming.next())
            .await
            .expect("accepted once one closed");
        assert!(next.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_says_nothing_is_dropped_at_the_deadline() {
        let limits = ConnectionLimits {
            handshake_timeout: Duration::from_secs(3),
            ..ConnectionLimits::default()
        };
        let (addr, incoming) = pair(limits).await;
        let mut incoming = std::pin::pin!(incoming);
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        let mut buf = [0u8; 8];
        let error = accepted.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);

        // One that speaks in time (and proves itself) keeps going after the deadline.
        let mut talker = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        accepted.held.registry.prove(talker.local_addr().unwrap());
        talker.write_all(b"hi").await.unwrap();
        assert_eq!(accepted.read(&mut buf).await.unwrap(), 2);
        tokio::time::sleep(Duration::from_secs(10)).await;
        talker.write_all(b"there").await.unwrap();
        assert_eq!(accepted.read(&mut buf).await.unwrap(), 5);
    }

    /// Issue 35: a storm of new agent streams is taken in at the rate (a
    /// second's burst at once, then one slot every 1/rate); a stream whose
    /// slot is further away than the wait is refused at once.
    #[tokio::test(start_paused = true)]
    async fn agent_streams_are_admitted_at_the_rate_and_refused_beyond_the_wait() {
        let admission = Arc::new(Admission::new(10));
        let start = tokio::time::Instant::now();
        let storm: Vec<_> = (0..50)
            .map(|_| {
                let admission = admission.clone();
                tokio::spawn(async move {
                    let admitted = admission.admit(Duration::from_secs(3)).await;
                    (admitted, start.elapsed())
                })
            })
            .collect();
        let (mut admitted, mut refused) = (Vec::new(), 0);
        for stream in storm {
            let (ok, at) = stream.await.unwrap();
            if ok {
                admitted.push(at);
            } else {
                assert!(at.is_zero(), "refused at once");
                refused += 1;
            }
        }
        admitted.sort();
        // A second's burst plus the slot now at once, then 10 a second for 3 s.
        assert_eq!(admitted.len(), 11 + 30);
        assert_eq!(admitted.iter().filter(|at| at.is_zero()).count(), 11);
        assert_eq!(admitted[11], Duration::from_millis(100));
        assert_eq!(admitted[40], Duration::from_secs(3));
        assert_eq!(refused, 9);
        // Once quiet, a second's burst is available again.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let t = tokio::time::Instant::now();
        for _ in 0..10 {
            assert!(admission.admit(Duration::ZERO).await);
        }
        assert!(t.elapsed().is_zero());
        // No limit: every stream at once.
        let unlimited = Admission::new(0);
        for _ in 0..1000 {
            assert!(unlimited.admit(Duration::ZERO).await);
        }
    }

    #[tokio::test]
    async fn beyond_the_cap_a_connection_waits_for_one_to_close() {
        let limits = ConnectionLimits {
            max_connections: 1,
            ..ConnectionLimits::default()
        };
        let (addr, incoming) = pair(limits).await;
        let mut incoming = std::pin::pin!(incoming);
        let _first = TcpStream::connect(addr).await.unwrap();
        let held = incoming.next().await.unwrap().unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        // Not accepted while the first is open (bounded wait).
        let waiting = tokio::time::timeout(Duration::from_millis(200), incoming.next()).await;
        assert!(
            waiting.is_err(),
            "a second connection was accepted beyond the cap"
        );
        drop(held);
        let next = tokio::time::timeout(Duration::from_secs(5), incoming.next())
            .await
            .expect("accepted once the first closed");
        assert!(next.unwrap().is_ok());
    }
}
