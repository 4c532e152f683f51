//! WebSocket through the proxy (HTTP/1.1 `Upgrade: websocket`, RFC 6455, and
//! HTTP/2's extended CONNECT with `:protocol websocket`, RFC 8441), on hyper's
//! side: the HTTP/1 path hands every `Upgrade` request over.
//!
//! An HTTP/2 WebSocket is judged as the `GET` of its path (so one rule covers
//! both forms) and goes upstream as an HTTP/1.1 upgrade, with a
//! `sec-websocket-key` the agent makes; the upstream's `101` becomes the
//! client's `200` (without the HTTP/1.1 handshake fields), and the stream the
//! tunnel's client side. Any other CONNECT is refused.
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
    /// An HTTP/2 extended CONNECT (else an HTTP/1.1 `Upgrade`).
    pub(crate) h2: bool,
}

/// Both sides of an upgrade the upstream accepted.
#[derive(Clone)]
pub(crate) struct Tunnel {
    client: OnUpgrade,
    upstream: OnUpgrade,
    /// The client's side is an HTTP/2 stream.
    h2: bool,
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

/// Whether `req` is an HTTP/2 extended CONNECT for a WebSocket (RFC 8441
/// section 4: `:protocol websocket`, which carries a `:path`).
pub(crate) fn is_h2_websocket<B>(req: &Request<B>) -> bool {
    req.version() == http::Version::HTTP_2
        && req.method() == http::Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
        && req.uri().path_and_query().is_some()
}

/// The client's side of WebSocket request `req` (either form), which is then
/// judged and forwarded as a `GET` of its path.
pub(crate) fn client<B>(req: &mut Request<B>) -> Option<ClientUpgrade> {
    let h2 = req.version() == http::Version::HTTP_2;
    let protocol = if h2 {
        HeaderValue::from_static("websocket")
    } else {
        req.headers().get(header::UPGRADE)?.clone()
    };
    let on = hyper::upgrade::on(&mut *req);
    if h2 {
        *req.method_mut() = http::Method::GET;
        req.extensions_mut().remove::<hyper::ext::Protocol>();
    }
    Some(ClientUpgrade { on, protocol, h2 })
}

/// The HTTP/1.1 handshake fields an HTTP/2 WebSocket lacks (RFC 6455 4.1): a
/// fresh `sec-websocket-key`, and `sec-websocket-version: 13` unless sent.
pub(crate) fn handshake_fields(headers: &mut HeaderMap) {
    let key = base64_16(rand::random());
    if let Ok(key) = HeaderValue::from_str(&key) {
        headers.insert(header::SEC_WEBSOCKET_KEY, key);
    }
    headers
        .entry(header::SEC_WEBSOCKET_VERSION)
        .or_insert(HeaderValue::from_static("13"));
}

/// Standard base64 of 16 bytes (24 characters, `==` padded).
fn base64_16(bytes: [u8; 16]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(24);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
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
    if client.h2 {
        // RFC 8441 section 5: a 2xx opens the stream's tunnel.
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        for name in [
            header::CONNECTION,
            header::UPGRADE,
            header::SEC_WEBSOCKET_ACCEPT,
        ] {
            headers.remove(name);
        }
    } else {
        restore(response.headers_mut(), client.protocol);
    }
    Some(Tunnel {
        client: client.on,
        upstream,
        h2: client.h2,
    })
}

/// Relays the tunnel's bytes both ways until either side closes, holding
/// `admission` (the call's permits) until then.
pub(crate) fn spawn<H: Send + 'static>(tunnel: Tunnel, admission: H, conns: Arc<Connections>) {
    tokio::spawn(async move {
        let form = usize::from(tunnel.h2);
        let (client, upstream) = match tokio::try_join!(tunnel.client, tunnel.upstream) {
            Ok(both) => both,
            Err(error) => {
                tracing::debug!(%error, "an accepted upgrade did not complete");
                return;
            }
        };
        conns.upgraded[form].fetch_add(1, Ordering::Relaxed);
        conns.upgraded_open[form].fetch_add(1, Ordering::Relaxed);
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
            Err(error) => tracing::debug!(%error, "upgraded connection ended"),
        }
        conns.upgraded_open[form].fetch_sub(1, Ordering::Relaxed);
        drop(admission);
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_of_16_bytes() {
        // RFC 6455 section 4.1's example nonce.
        let nonce = *b"the sample nonce";
        assert_eq!(super::base64_16(nonce), "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(super::base64_16([0xff; 16]), "/////////////////////w==");
    }
}
