//! `--worker-threads 2` against the real binary: connections served on two
//! threads, each with its own runtime (no work stealing), enforce one set of
//! rules exactly, over HTTP/1.1 and h2c alike.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{binary, ms, upstream};

const CONFIG: &str = r#"
service: shop
version: workers-v1
rules:
  - name: shop/limited
    on: { path: { kind: PATH_KIND_EXACT, value: /limited } }
    limit:
      calls: { amount: 20, window_ms: 600000 }
"#;

/// One HTTP/1.1 request on a connection of its own (so that the calls are
/// spread over the workers): the response's status.
async fn status_on_new_connection(addr: SocketAddr, path: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nhost: shop\r\nconnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&response);
    let status = text.split(' ').nth(1).unwrap_or_default();
    status
        .parse()
        .unwrap_or_else(|_| panic!("no status in {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_threads_serve_every_protocol_and_keep_a_limit_exact() {
    let up = upstream()
        .fast("/fast", ms(1))
        .fast("/limited", ms(1))
        .start()
        .await;
    let agent = binary().upstream(&up).workers(2).config(CONFIG).spawn();

    // HTTP/1.1, 100 calls on 100 connections, 10 at a time.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..100 {
        let addr = agent.inbound;
        calls.spawn(async move { status_on_new_connection(addr, "/fast").await });
        if i % 10 == 9 {
            while let Some(status) = calls.join_next().await {
                assert_eq!(status.unwrap(), 200);
            }
        }
    }

    // The limit holds across the workers: 20 of 40 calls, whichever thread
    // served each.
    let mut limited = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let addr = agent.inbound;
        limited.spawn(async move { status_on_new_connection(addr, "/limited").await });
    }
    let mut statuses = Vec::new();
    while let Some(status) = limited.join_next().await {
        statuses.push(status.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        20,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        20,
        "{statuses:?}"
    );

    // h2c: four connections, 25 concurrent streams each.
    let mut conns = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let addr = agent.inbound;
        conns.spawn(async move {
            let client: hyper_util::client::legacy::Client<_, Empty<Bytes>> =
                hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .build_http();
            let mut streams = tokio::task::JoinSet::new();
            for _ in 0..25 {
                let client = client.clone();
                streams.spawn(async move {
                    let req = Request::get(format!("http://{addr}/fast"))
                        .body(Empty::new())
                        .unwrap();
                    let response = client.request(req).await.unwrap();
                    let status = response.status();
                    let _ = response.into_body().collect().await;
                    status
                });
            }
            let mut ok = 0;
            while let Some(status) = streams.join_next().await {
                assert_eq!(status.unwrap(), 200);
                ok += 1;
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(n) = conns.join_next().await {
        ok += n.unwrap();
    }
    assert_eq!(ok, 100);

    // Both workers served: the agent's threads include them.
    let threads = std::fs::read_dir(format!("/proc/{}/task", agent.pid()))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("gov-worker-"))
                })
                .count()
        })
        .expect("the agent's threads in /proc");
    assert_eq!(threads, 2, "two gov-worker threads");
}
