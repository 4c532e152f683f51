//! The HTTP/1 connection driven over in-memory I/O (`tokio::io::duplex`): the
//! client side is a byte pipe, the upstream a real listener on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::Authority;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpListener;

use super::*;
use tokio_util::sync::CancellationToken;

use crate::sidecar::listener::Shared;
use crate::sidecar::serve::Connections;
use crate::sidecar::upstream::{Balance, Clients, Directory, UpstreamProtocol};

/// How long any one step of a test may take.
const STEP: Duration = Duration::from_secs(5);

/// An HTTP/1.1 upstream on loopback that answers every request head with
/// `200 ok` (bodiless requests only) and counts them.
async fn upstream() -> (Authority, Arc<AtomicUsize>) {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while let Ok(n @ 1..) = stream.read(&mut chunk).await {
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        seen.fetch_add(1, Ordering::SeqCst);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (
        Authority::try_from(addr).unwrap_or_else(|e| panic!("{e}")),
        count,
    )
}

/// An inbound HTTP/1 connection to `local` served over an in-memory pipe;
/// returns the client's end.
fn connect(local: Authority) -> DuplexStream {
    let directory = Arc::new(Directory::new(Balance::default(), &[]));
    let mtls = Arc::new(crate::sidecar::mtls::PeerTls::off());
    let shared = Arc::new(Shared {
        engine: gov_engine::Engine::empty("order"),
        clients: Clients::new(UpstreamProtocol::Http1, mtls.clone(), directory.clone()),
        local,
        directory,
        log: None,
        client_gone_hold: std::time::Duration::from_secs(60),
        verifier: Default::default(),
        mtls,
    });
    let cx = Listener::new(
        shared,
        Side::Inbound,
        CancellationToken::new(),
        Some(STEP),
        Some(STEP),
        Arc::new(Connections::new(16, 16)),
        Arc::new(IdlePool::default()),
    );
    let (client, server) = tokio::io::duplex(64 * 1024);
    let peer = SocketAddr::from(([127, 0, 0, 1], 40_000));
    tokio::spawn(serve(server, peer, None, cx, |_handed_over| async {}));
    client
}

/// Reads until `done` says the bytes so far are a whole answer, or the end.
async fn read_until(client: &mut DuplexStream, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 1024];
    while !done(&out) {
        match tokio::time::timeout(STEP, client.read(&mut chunk)).await {
            Ok(Ok(n @ 1..)) => out.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    out
}

#[tokio::test]
async fn forwards_requests_over_in_memory_io_and_keeps_the_connection() {
    let (local, count) = upstream().await;
    let mut client = connect(local);
    for _ in 0..2 {
        let sent = client.write_all(b"GET /orders/7 HTTP/1.1\r\nhost: order\r\n\r\n");
        assert!(sent.await.is_ok());
        let answer = read_until(&mut client, |b| b.ends_with(b"\r\n\r\nok")).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        2,
        "both requests on one connection"
    );
}

#[tokio::test]
async fn refuses_an_ambiguous_framing_without_reaching_the_upstream() {
    let (local, count) = upstream().await;
    let mut client = connect(local);
    let smuggle = b"POST /orders HTTP/1.1\r\nhost: order\r\ncontent-length: 5\r\n\
        transfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nhost: order\r\n\r\n";
    assert!(client.write_all(smuggle).await.is_ok());
    // The connection closes after the answer: read to its end.
    let answer = read_until(&mut client, |_| false).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    assert_eq!(text.matches("HTTP/1.1").count(), 1, "one answer: {text}");
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn refuses_a_head_with_bare_lf_line_ends() {
    let (local, count) = upstream().await;
    let mut client = connect(local);
    assert!(
        client
            .write_all(b"GET / HTTP/1.1\nhost: order\n\n")
            .await
            .is_ok()
    );
    let answer = read_until(&mut client, |_| false).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

/// The head bound docs/operations.md states: a head under 64 KiB is
/// forwarded, a larger one is answered 431 and never reaches the upstream.
#[tokio::test]
async fn a_head_under_64_kib_is_forwarded_and_a_larger_one_refused() {
    let (local, count) = upstream().await;
    for (filler, answer) in [
        (60 * 1024, "HTTP/1.1 200 OK\r\n"),
        (65 * 1024, "HTTP/1.1 431 "),
    ] {
        let (mut read, mut write) = tokio::io::split(connect(local.clone()));
        let head = format!(
            "GET / HTTP/1.1\r\nhost: order\r\nx-big: {}\r\n\r\n",
            "a".repeat(filler)
        );
        // The pipe holds 64 KiB: write while the answer is read (the agent
        // may close before it has read a refused head to its end).
        let writer = tokio::spawn(async move {
            let _ = write.write_all(head.as_bytes()).await;
            write
        });
        let mut out = Vec::new();
        let mut chunk = [0u8; 1024];
        while !out.windows(4).any(|w| w == b"\r\n\r\n") {
            match tokio::time::timeout(STEP, read.read(&mut chunk)).await {
                Ok(Ok(n @ 1..)) => out.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with(answer), "{filler} bytes: {text}");
        drop(writer.await);
    }
    assert_eq!(count.load(Ordering::SeqCst), 1, "only the smaller one");
}
