//! WebSocket through the proxy (HTTP/1.1 `Upgrade: websocket`, RFC 6455), on
//! hyper's side: the HTTP/1 path hands every `Upgrade` request over.
//!
//! The upgrade request is judged by the rules like any call, and forwarded
//! with its `connection: upgrade` and `upgrade: websocket`; only when the
//! upstream answers `101 Switching Protocols` with `upgrade: websocket` do the
//! two connections become a tunnel, bytes relayed both ways until either side
//! closes. The tunnel holds the call's admission (its bulkhead permits, its
//! in-flight count) for its whole life, and is counted in `/metrics`.
//!
//! What is never a tunnel: an upgrade to anything but `websocket` (`h2c`
//! would carry HTTP/2 requests the engine never judged: its `upgrade` is
//! removed as a hop-by-hop field, as before); an upgrade request with a body
//! (refused: its bytes could be read as the first frames or as a smuggled
//! request); a `101` the client did not ask for, or to another protocol (a
//! 502); an answer other than `101` (an ordinary response, after which the
//! handed-over connection closes, so nothing the client sends after it
//! reaches the upstream unjudged).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::serve::Connections;

/// The client's side of a WebSocket upgrade request being forwarded, and the
/// `upgrade` value it sent.
#[derive(Clone)]
pub(crate) struct ClientUpgrade {
    pub(crate) on: OnUpgrade,
    pub(crate) protocol: HeaderValue,
}

/// Both sides of an upgrade the upstream accepted.
#[derive(Clone)]
pub(crate) struct Tunnel {
    client: OnUpgrade,
    upstream: OnUpgrade,
}

/// Whether `headers` name `token` in a comma-separated list of `name`.
fn lists(headers: &HeaderMap, name: &header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|item| item.trim().eq_ignore_ascii_case(token))
        })
    })
}

/// Whether `req` asks to become a WebSocket: HTTP/1.1, one `upgrade` field
/// that is `websocket`, and `connection` naming `upgrade`.
pub(crate) fn is_websocket<B>(req: &Request<B>) -> bool {
    let headers = req.headers();
    req.version() == http::Version::HTTP_11
        && headers.get_all(header::UPGRADE).iter().count() == 1
        && headers
            .get(header::UPGRADE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
        && lists(headers, &header::CONNECTION, "upgrade")
}

/// Whether an upgrade request has a body (any `transfer-encoding`, or a
/// `content-length` other than 0): refused.
pub(crate) fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|v| v.as_bytes() != b"0")
}

/// Puts back the fields that make a request an upgrade (the hop-by-hop
/// removal took them).
pub(crate) fn restore(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, protocol);
}

/// The tunnel of an upstream's `101` to a WebSocket upgrade the client asked
/// for (`client`); `None` when the `101` switches to anything else.
pub(crate) fn accept<B>(response: &mut Response<B>, client: ClientUpgrade) -> Option<Tunnel> {
    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS
        && response
            .headers()
            .get(header::UPGRADE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !switched {
        return None;
    }
    let upstream = hyper::upgrade::on(&mut *response);
    restore(response.headers_mut(), client.protocol);
    Some(Tunnel {
        client: client.on,
        upstream,
    })
}

/// Relays the tunnel's bytes both ways until either side closes, holding
/// `admission` (the call's permits) until then.
pub(crate) fn spawn<H: Send + 'static>(tunnel: Tunnel, admission: H, conns: Arc<Connections>) {
    tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(tunnel.client, tunnel.upstream) {
            Ok(both) => both,
            Err(error) => {
                tracing::debug!(%error, "an accepted upgrade did not complete");
                return;
            }
        };
        conns.upgraded.fetch_add(1, Ordering::Relaxed);
        conns.upgraded_open.fetch_add(1, Ordering::Relaxed);
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
            Err(error) => tracing::debug!(%error, "upgraded connection ended"),
        }
        conns.upgraded_open.fetch_sub(1, Ordering::Relaxed);
        drop(admission);
    });
}
