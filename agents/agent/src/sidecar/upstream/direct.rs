//! The HTTP/2 upstream client: the `h2` crate's client connections kept per
//! upstream address, a request sent on one of them directly (no pool
//! checkout, no connector call per request: issue 37's profile put
//! hyper-util's legacy pool among the HTTP/2 path's costs), by the request's
//! own future (no dispatch through hyper's client: [`stream`]).
//!
//! Per address at most [`MAX_CONNECTIONS`] connections: a request goes to the
//! one with the fewest streams open, and a new connection is made only when
//! every open one has [`STREAMS_PER_CONNECTION`] streams open (or none is
//! open). Concurrent requests that find no connection wait for the one connect
//! in progress instead of each making its own. A connection the server closed
//! (GOAWAY, EOF, an error) is dropped from the set; a request it hands back
//! unsent is sent once more on another. A connection without a stream for
//! [`IDLE`] is closed, as the pool's idle timeout did.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::{Authority, Scheme, Uri};
use http::{Request, Response};
use hyper_util::rt::TokioIo;

mod stream;

pub(crate) use stream::H2Body;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connections per upstream address at most.
pub(crate) const MAX_CONNECTIONS: usize = 4;

/// Streams open on a connection before another one is made (while there are
/// fewer than [`MAX_CONNECTIONS`]): 100, the least `SETTINGS_MAX_CONCURRENT_STREAMS`
/// RFC 9113 recommends a server allow. Past a server's own limit, its
/// connection queues the stream until one ends.
const STREAMS_PER_CONNECTION: usize = 100;

/// How long a connection without a stream stays open (between one and two
/// of these).
const IDLE: Duration = Duration::from_secs(45);

/// The windows and buffers hyper's HTTP/2 client set, kept: 2 MiB a stream,
/// 5 MiB a connection, 1 MiB of send buffer a stream, 16 KiB of response head.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const SEND_BUFFER: usize = 1024 * 1024;
const MAX_HEADER_LIST: u32 = 16 * 1024;

/// How a request sent on the HTTP/2 client failed.
#[derive(Debug)]
pub(crate) struct SendError {
    /// No connection could be made: nothing was sent.
    pub(crate) connect: bool,
    pub(crate) source: BoxError,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.connect {
            write!(f, "cannot connect to the upstream: {}", self.source)
        } else {
            write!(f, "{}", self.source)
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The HTTP/2 client: connections per upstream address, made by `C`, that
/// send `B` bodies.
pub(crate) struct Http2Client<C, B> {
    connector: C,
    hosts: Arc<Hosts>,
    body: std::marker::PhantomData<fn(B)>,
}

impl<C: Clone, B> Clone for Http2Client<C, B> {
    fn clone(&self) -> Self {
        Self {
            connector: self.connector.clone(),
            hosts: self.hosts.clone(),
            body: std::marker::PhantomData,
        }
    }
}

#[derive(Default)]
struct Host {
    conns: Vec<Slot>,
    /// The connect in progress, which requests that find no connection wait for.
    connecting: Option<Arc<Connecting>>,
    next_id: u64,
}

type Connecting = tokio::sync::OnceCell<Result<(), Arc<str>>>;

struct Slot {
    id: u64,
    send: SendRequest<Bytes>,
    /// Streams open on it (each held by a [`OpenStream`] until its response ends).
    streams: Arc<AtomicUsize>,
    /// A request was sent since the last idle check.
    used: bool,
}

/// One stream open on a connection of the HTTP/2 client, counted until this
/// is dropped (with the response's body).
pub(crate) struct OpenStream(Arc<AtomicUsize>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Tells a request body's pipe to reset its stream when the request's future
/// is dropped before the response's head came (taken empty once it came).
struct CancelOnDrop(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            let _ = cancel.send(());
        }
    }
}

/// Keyed with foldhash over [`HostKey`]'s one word: an upstream address is
/// looked up per request, and std's SipHash of an `Authority` (a byte at a
/// time) cost about 1,400 instructions a call in issue 37's fixed-rate
/// profile. The keys are configured addresses, not client input.
type HostMap = HashMap<HostKey, Host, foldhash::fast::RandomState>;

type Hosts = Mutex<HostMap>;

/// A set of connections: the worker thread that drives them (0 without
/// workers: `sidecar::workers`) and the upstream address.
#[derive(Clone, PartialEq, Eq)]
struct HostKey(usize, Authority);

impl std::hash::Hash for HostKey {
    /// One word: the worker folded with the address's bytes lower-cased (as
    /// `Authority`'s equality compares them), FNV-1a.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let seed = 0xcbf2_9ce4_8422_2325 ^ self.0 as u64;
        let folded = self.1.as_str().bytes().fold(seed, |h, b| {
            (h ^ u64::from(b.to_ascii_lowercase())).wrapping_mul(0x0100_0000_01b3)
        });
        state.write_u64(folded);
    }
}

impl<C, B> Http2Client<C, B>
where
    C: tower::Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(connector: C) -> Self {
        Self {
            connector,
            hosts: Arc::default(),
            body: std::marker::PhantomData,
        }
    }

    fn hosts(&self) -> MutexGuard<'_, HostMap> {
        lock(&self.hosts)
    }

    /// Sends `req` (its URI absolute: its authority is the `:authority`) on a
    /// connection to `to` and waits for the response's head; the [`OpenStream`]
    /// counts the stream open until the response's body is done with.
    pub(crate) async fn send(
        self,
        to: Authority,
        req: Request<B>,
    ) -> Result<(Response<H2Body>, OpenStream), SendError> {
        // A connection found closing takes no stream: the request goes once
        // more, on another; a connect that succeeded lets the pick go round
        // again. The calling worker's own connections (`sidecar::workers`).
        let to = HostKey(crate::sidecar::workers::index(), to);
        let mut resent = false;
        for _ in 0..4 {
            let picked = {
                let mut hosts = self.hosts();
                let found = hosts.get_mut(&to).map(Host::pick);
                match found {
                    Some(Ok(slot)) => {
                        slot.used = true;
                        slot.streams.fetch_add(1, Ordering::Relaxed);
                        let stream = OpenStream(slot.streams.clone());
                        Ok((slot.send.clone(), stream, slot.id))
                    }
                    Some(Err(connecting)) => Err(connecting),
                    None => {
                        let connecting = Arc::<Connecting>::default();
                        let host = Host {
                            connecting: Some(connecting.clone()),
                            ..Host::default()
                        };
                        hosts.insert(to.clone(), host);
                        Err(connecting)
                    }
                }
            };
            match picked {
                Ok((send, stream, id)) => match send.ready().await {
                    Ok(send) => return Self::on(send, req).await.map(|r| (r, stream)),
                    Err(error) => {
                        Host::remove(&mut self.hosts(), &to, id);
                        if resent {
                            return Err(SendError {
                                connect: false,
                                source: error.into(),
                            });
                        }
                        resent = true;
                    }
                },
                Err(connecting) => {
                    let connected = connecting.get_or_init(|| self.connect(&to)).await;
                    if let Err(why) = connected {
                        return Err(SendError {
                            connect: true,
                            source: why.to_string().into(),
                        });
                    }
                }
            }
        }
        Err(SendError {
            connect: true,
            source: "no connection to the upstream stayed open".into(),
        })
    }

    /// Sends `req` on a connection ready for a stream, its body's ready part
    /// inline and the rest piped by a task, and waits for the response's head.
    async fn on(
        mut send: SendRequest<Bytes>,
        req: Request<B>,
    ) -> Result<Response<H2Body>, SendError> {
        let failed = |error: h2::Error| SendError {
            connect: false,
            source: error.into(),
        };
        let (mut parts, mut body) = req.into_parts();
        stream::content_length(&parts.method, &mut parts.headers, &body.size_hint());
        let end = body.is_end_stream();
        let (response, mut sending) = send
            .send_request(Request::from_parts(parts, ()), end)
            .map_err(failed)?;
        let mut cancel = None;
        if !end {
            let whole = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(stream::send_ready(&mut body, &mut sending, cx))
            })
            .await;
            if !whole {
                let (tx, rx) = tokio::sync::oneshot::channel();
                cancel = Some(CancelOnDrop(Some(tx)));
                tokio::spawn(stream::pipe(body, sending, rx));
            }
        }
        let response = response.await.map_err(failed)?;
        if let Some(mut cancel) = cancel {
            // The response came: the body's pipe goes on by itself.
            cancel.0.take();
        }
        let (parts, recv) = response.into_parts();
        let body = H2Body::new(recv, &parts.headers);
        Ok(Response::from_parts(parts, body))
    }

    /// Opens a connection to `to` and adds it to the address's set.
    async fn connect(&self, to: &HostKey) -> Result<(), Arc<str>> {
        let opened = self.open(&to.1).await;
        let mut hosts = self.hosts();
        let host = hosts.entry(to.clone()).or_default();
        host.connecting = None;
        let (send, conn) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                tracing::debug!(%error, upstream = %to.1, "cannot open an HTTP/2 connection");
                if host.conns.is_empty() {
                    hosts.remove(to);
                }
                return Err(error.to_string().into());
            }
        };
        let id = host.next_id;
        host.next_id += 1;
        host.conns.push(Slot {
            id,
            send,
            streams: Arc::default(),
            used: true,
        });
        drop(hosts);
        let hosts = Arc::downgrade(&self.hosts);
        let to = to.clone();
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let start = tokio::time::Instant::now() + IDLE;
            let mut idle = tokio::time::interval_at(start, IDLE);
            loop {
                tokio::select! {
                    closed = &mut conn => {
                        if let Err(error) = closed {
                            tracing::debug!(%error, upstream = %to.1, "an HTTP/2 upstream connection failed");
                        }
                        break;
                    }
                    _ = idle.tick() => {
                        if Host::idle(&hosts, &to, id) {
                            return;
                        }
                    }
                }
            }
            if let Some(hosts) = hosts.upgrade() {
                Host::remove(&mut lock(&hosts), &to, id);
            }
        });
        Ok(())
    }

    async fn open(
        &self,
        to: &Authority,
    ) -> Result<
        (
            SendRequest<Bytes>,
            h2::client::Connection<TokioIo<C::Response>, Bytes>,
        ),
        BoxError,
    > {
        let uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(to.clone())
            .path_and_query("/")
            .build()?;
        let io = tower::Service::call(&mut self.connector.clone(), uri)
            .await
            .map_err(Into::into)?;
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_send_buffer_size(SEND_BUFFER)
            .max_header_list_size(MAX_HEADER_LIST)
            .enable_push(false)
            .handshake(TokioIo::new(io))
            .await?;
        Ok((send, conn))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Host {
    /// The connection a request goes on, or the connect to wait for. (A
    /// connection leaves the set when its task ends.)
    fn pick(&mut self) -> Result<&mut Slot, Arc<Connecting>> {
        let open = self.conns.len();
        let connecting = self.connecting.is_some();
        let best = self
            .conns
            .iter_mut()
            .min_by_key(|slot| slot.streams.load(Ordering::Relaxed));
        if let Some(slot) = best
            && (open >= MAX_CONNECTIONS
                || connecting
                || slot.streams.load(Ordering::Relaxed) < STREAMS_PER_CONNECTION)
        {
            return Ok(slot);
        }
        Err(self.connecting.get_or_insert_with(Arc::default).clone())
    }

    /// Whether connection `id` of `to` has been idle since the last check
    /// (then it leaves the set, and its task closes it).
    fn idle(hosts: &std::sync::Weak<Hosts>, to: &HostKey, id: u64) -> bool {
        let Some(hosts) = hosts.upgrade() else {
            return true;
        };
        let mut hosts = lock(&hosts);
        let Some(slot) = hosts
            .get_mut(to)
            .and_then(|host| host.conns.iter_mut().find(|slot| slot.id == id))
        else {
            return true;
        };
        if slot.used || slot.streams.load(Ordering::Relaxed) > 0 {
            slot.used = false;
            return false;
        }
        Self::remove(&mut hosts, to, id);
        true
    }

    /// Drops connection `id` of `to` from the set, and the address when it has
    /// no connection left.
    fn remove(hosts: &mut HostMap, to: &HostKey, id: u64) {
        if let Some(host) = hosts.get_mut(to) {
            host.conns.retain(|slot| slot.id != id);
            if host.conns.is_empty() && host.connecting.is_none() {
                hosts.remove(to);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_key_is_found_whatever_the_case_of_its_address_and_only_on_its_worker() {
        let key = |worker, to: &str| HostKey(worker, to.parse::<Authority>().unwrap());
        let mut map: HashMap<HostKey, u32, foldhash::fast::RandomState> = HashMap::default();
        map.insert(key(1, "Upstream.Example:8080"), 7);
        assert_eq!(map.get(&key(1, "upstream.example:8080")), Some(&7));
        assert_eq!(map.get(&key(1, "UPSTREAM.EXAMPLE:8080")), Some(&7));
        assert_eq!(map.get(&key(0, "upstream.example:8080")), None);
        assert_eq!(map.get(&key(1, "upstream.example:8081")), None);
    }
}
