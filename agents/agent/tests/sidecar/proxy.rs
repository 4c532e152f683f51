//! Forwarding without rules: bodies, headers, protocols, errors, admin endpoints.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use gov_agent::sidecar::UpstreamProtocol;

use crate::support::{Upstream, agent, http, ms, upstream};

#[tokio::test]
async fn forwards_requests_and_streams_bodies_both_ways() {
    let up = upstream()
        .fast("/hello", ms(0))
        .echo("/echo")
        .sized("/big", 1 << 20)
        .start()
        .await;
    let agent = agent().upstream(&up).start().await;
    let client = http();

    let reply = client.get(&agent.url("/hello")).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "/hello");
    assert_eq!(reply.header("x-upstream"), Some("1"));

    let body = Bytes::from(vec![7_u8; 300_000]);
    let reply = client
        .post(&agent.url("/echo"), body.clone())
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, body);

    let reply = client.get(&agent.url("/big")).await.unwrap();
    assert_eq!(reply.body.len(), 1 << 20);

    let reply = client.get(&agent.url("/missing")).await.unwrap();
    assert_eq!(
        reply.status,
        StatusCode::NOT_FOUND,
        "upstream statuses pass through"
    );
}

#[tokio::test]
async fn serves_http2_clients_with_prior_knowledge() {
    let up = upstream().echo("/echo").start().await;
    let agent = agent().upstream(&up).start().await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::post(agent.url("/echo"))
        .body(Full::new(Bytes::from_static(b"over h2")))
        .unwrap();
    let response = client.request(req).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["x-upstream-version"],
        "HTTP/1.1",
        "by default the upstream is spoken to in HTTP/1.1"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"over h2");
}

#[tokio::test]
async fn grpc_style_calls_keep_http2_and_trailers_when_the_upstream_follows_the_client() {
    let up = upstream().trailers("/shop.Orders/Get").start().await;
    let agent = agent()
        .upstream(&up)
        .upstream_protocol(UpstreamProtocol::Downstream)
        .start()
        .await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = Request::post(agent.url("/shop.Orders/Get"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x02hi")))
        .unwrap();
    let response = h2.request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-upstream-version"], "HTTP/2.0");
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
    assert_eq!(&collected.to_bytes()[..], b"\0\0\0\0\x02hi");

    // An HTTP/1.1 client of the same agent still gets an HTTP/1.1 upstream.
    let reply = http()
        .post(&agent.url("/shop.Orders/Get"), "plain")
        .await
        .unwrap();
    assert_eq!(reply.header("x-upstream-version"), Some("HTTP/1.1"));
    assert_eq!(reply.text(), "plain");
}

#[tokio::test]
async fn strips_hop_by_hop_headers_and_appends_forwarded_for() {
    // A one-shot raw upstream that records the request head it receives.
    let raw = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let raw_upstream = Upstream::at(raw.local_addr().unwrap());
    let head = tokio::spawn(async move {
        let (mut s, _) = raw.accept().await.unwrap();
        let mut buf = vec![0_u8; 4096];
        let mut n = 0;
        while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            n += s.read(&mut buf[n..]).await.unwrap();
        }
        s.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: x-up-secret\r\nx-up-secret: 1\r\n\r\nok",
        )
        .await
        .unwrap();
        String::from_utf8_lossy(&buf[..n]).to_lowercase()
    });
    let agent = agent().upstream(&raw_upstream).start().await;
    let reply = http()
        .get_with(
            &agent.url("/x"),
            &[
                ("connection", "x-secret"),
                ("x-secret", "1"),
                ("x-forwarded-for", "10.1.2.3"),
                ("proxy-authorization", "basic abc"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "ok");
    assert!(
        reply.header("x-up-secret").is_none(),
        "a response hop-by-hop header leaked"
    );
    let head = head.await.unwrap();
    assert!(!head.contains("x-secret"), "{head}");
    assert!(!head.contains("proxy-authorization"), "{head}");
    assert!(
        head.contains("x-forwarded-for: 10.1.2.3, 127.0.0.1"),
        "{head}"
    );
    assert!(head.starts_with("get /x http/1.1"), "{head}");
}

#[tokio::test]
async fn upstream_down_is_a_502_with_a_short_body() {
    // Bind and drop to get a port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let fake = Upstream::at(port);
    let agent = agent().upstream(&fake).start().await;
    let reply = http().get(&agent.url("/x")).await.unwrap();
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(
        reply.text().contains("upstream connection failed"),
        "{}",
        reply.text()
    );
}

#[tokio::test]
async fn malformed_requests_get_400_and_the_agent_keeps_serving() {
    let up = upstream().fast("/ok", ms(0)).start().await;
    let agent = agent().upstream(&up).start().await;
    let garbage: [&[u8]; 4] = [
        b"THIS IS NOT HTTP\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nbad header line\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\ncontent-length: nope\r\n\r\n",
        b"CONNECT example.org:443 HTTP/1.1\r\nhost: example.org:443\r\n\r\n",
    ];
    for bytes in garbage {
        let mut s = TcpStream::connect(agent.sidecar.inbound_addr())
            .await
            .unwrap();
        s.write_all(bytes).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            let mut chunk = [0_u8; 1024];
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                }
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "no answer to {:?}",
            String::from_utf8_lossy(bytes)
        );
        let text = String::from_utf8_lossy(&buf);
        assert!(
            text.starts_with("HTTP/1.1 400"),
            "{:?} got {text:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    let reply = http().get(&agent.url("/ok")).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        up.received(),
        1,
        "no malformed request reached the upstream"
    );
}

#[tokio::test]
async fn a_client_that_never_finishes_its_request_head_is_disconnected() {
    let up = upstream().fast("/ok", ms(0)).start().await;
    let agent = agent()
        .upstream(&up)
        .header_read_timeout(ms(200))
        .start()
        .await;
    let mut s = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    s.write_all(b"GET /ok HTTP/1.1\r\nhost: a\r\n")
        .await
        .unwrap();
    // Bounded wait for the agent to give up on the slow head (a slowloris guard).
    let mut buf = [0_u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("the connection with a half-sent head stayed open");
    // A clean close (FIN), not a reset or another read error.
    assert!(closed.is_ok(), "{closed:?}");
    assert_eq!(up.received(), 0);
}

#[tokio::test]
async fn outbound_calls_are_routed_round_robin_by_service_name() {
    let a = upstream().fast("/who", ms(0)).start().await;
    let b = upstream().fast("/who", ms(0)).start().await;
    let local = upstream().start().await;
    let agent = agent()
        .upstream(&local)
        .balance(gov_agent::sidecar::Balance::RoundRobin)
        .instances("inventory", &[&a, &b])
        .start()
        .await;
    let client = http();
    for _ in 0..4 {
        let reply = client
            .get_with(&agent.outbound_url("/who"), &[("gov-service", "inventory")])
            .await
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = client
        .get_with(&agent.outbound_url("/who"), &[("host", "inventory:80")])
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!((a.received(), b.received()), (3, 2));

    let reply = client
        .get_with(&agent.outbound_url("/who"), &[("gov-service", "billing")])
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(reply.text().contains("no instances"), "{}", reply.text());
}

#[tokio::test]
async fn admin_answers_live_ready_and_shutdown_drains_in_flight_requests() {
    let up = upstream().slow("/slow", ms(400)).start().await;
    let agent = agent().upstream(&up).start().await;
    let client = http();
    assert_eq!(
        client.get(&agent.admin_url("/live")).await.unwrap().status,
        StatusCode::OK
    );
    assert_eq!(
        client.get(&agent.admin_url("/ready")).await.unwrap().status,
        StatusCode::OK
    );
    assert_eq!(
        client.get(&agent.admin_url("/nope")).await.unwrap().status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client
            .get(&agent.admin_url("/shutdown"))
            .await
            .unwrap()
            .status,
        StatusCode::METHOD_NOT_ALLOWED
    );

    let in_flight = tokio::spawn({
        let client = client.clone();
        let url = agent.url("/slow");
        async move { client.get(&url).await }
    });
    while up.received() == 0 {
        tokio::time::sleep(ms(5)).await;
    }
    // A web page's form post (it carries an origin) does not stop the agent.
    let mut form = Request::post(agent.admin_url("/shutdown"))
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from_static(b"x=1")))
        .unwrap();
    let refused = client
        .send(std::mem::replace(&mut form, Request::new(Full::default())))
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(
        client.get(&agent.admin_url("/ready")).await.unwrap().status,
        StatusCode::OK,
        "still serving"
    );
    let tool = Request::post(agent.admin_url("/shutdown"))
        .header("gov-admin", "shutdown")
        .body(Full::default())
        .unwrap();
    let reply = client.send(tool).await.unwrap();
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    // Draining: not ready, no new connections, the slow request still in flight.
    let ready = client.get(&agent.admin_url("/ready")).await.unwrap();
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(ready.text().contains("draining"), "{}", ready.text());
    assert!(
        tokio::net::TcpStream::connect(agent.sidecar.inbound_addr())
            .await
            .is_err(),
        "the inbound listener still accepts while draining"
    );
    let reply = in_flight.await.unwrap().unwrap();
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "the in-flight request was not finished"
    );
    tokio::time::timeout(Duration::from_secs(10), agent.sidecar.stopped())
        .await
        .expect("the agent stops after POST /shutdown");
}

/// The admin listener can stop the agent: a non-loopback `--admin-listen` is a
/// usage error (exit 64, before anything is bound) unless allowed by flag.
#[test]
fn a_remote_admin_listener_needs_an_explicit_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gov-agent"))
        .args(["--service", "x", "--upstream", "127.0.0.1:1"])
        .args(["--admin-listen", "0.0.0.0:0", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a loopback address"), "{stderr}");
    assert!(stderr.contains("--admin-allow-remote"), "{stderr}");
}

/// The agent token proves a service: the agent will not send it over
/// `http://` to a govd that is not on loopback (exit 64, before anything is
/// bound or sent) unless allowed by flag; to loopback it goes.
#[test]
fn the_agent_token_goes_in_clear_only_to_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0k3n\n").unwrap();
    let run = |control_plane: &str, extra: &[&str]| {
        let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_gov-agent"));
        agent
            .args(["--service", "x", "--upstream", "127.0.0.1:1"])
            .args(["--admin-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"])
            .args(["--control-plane", control_plane])
            .arg("--control-plane-token-file")
            .arg(&token)
            .args(extra)
            .env_remove("GOV_ALLOW_CLEARTEXT_TOKEN");
        agent
    };
    // One remote replica in the list is enough to refuse. (0.0.0.0 is not
    // loopback to the check, yet a connection to it stays on this host.)
    let out = run("http://127.0.0.1:1, http://0.0.0.0:1", &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`http://0.0.0.0:1`"), "{stderr}");
    assert!(stderr.contains("--allow-cleartext-token"), "{stderr}");
    // Allowed, or to loopback only: the agent starts (and is stopped here).
    for (url, extra) in [
        ("http://0.0.0.0:1", &["--allow-cleartext-token"][..]),
        ("http://127.0.0.1:1", &[][..]),
    ] {
        let mut child = run(url, extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the agent stopped for {url} {extra:?}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// hyper's path (HTTP/2) runs the engine's `Govern`: a call that outlives its rule's
/// timeout is answered 504 naming the rule and gives its permit back; one whose
/// upstream cannot be reached is a 502 recorded as a connect failure (a fuse that
/// counts only those trips on it).
#[tokio::test]
async fn hyper_path_timeouts_are_504s_and_connect_failures_counted_502s() {
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let send = |url: String, body: &'static [u8]| {
        let h2 = h2.clone();
        async move {
            let req = Request::post(url)
                .body(Full::new(Bytes::from_static(body)))
                .unwrap();
            let response = tokio::time::timeout(Duration::from_secs(10), h2.request(req))
                .await
                .expect("answered in time")
                .unwrap();
            let status = response.status();
            let by = response
                .headers()
                .get(gov_engine::REJECTED_BY)
                .map(|v| v.to_str().unwrap().to_owned());
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, by, String::from_utf8_lossy(&body).into_owned())
        }
    };

    let up = upstream()
        .slow("/slow", Duration::from_secs(3))
        .start()
        .await;
    let timing = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/quick
    on: { path: { kind: PATH_KIND_PREFIX, value: /slow } }
    bulkhead:
      max_concurrent: 1
      timeout_ms: 100
"#,
        )
        .upstream(&up)
        .start()
        .await;
    // The second call finds the permit free again: a 504 too, not a 408.
    for _ in 0..2 {
        let (status, by, _) = send(timing.url("/slow"), b"order").await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(by.as_deref(), Some("shop/quick"));
    }

    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Upstream::at(l.local_addr().unwrap())
    };
    let agent = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/down
    on: { any: true }
    fuse:
      trips:
        - { metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 2, window_ms: 60000 }
      system: { connect_failure: true }
      reject_status: 503
"#,
        )
        .upstream(&dead)
        .start()
        .await;
    for _ in 0..2 {
        let (status, by, text) = send(agent.url("/x"), b"order").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(by, None);
        assert!(text.contains("upstream connection failed"), "{text}");
    }
    let (status, by, _) = send(agent.url("/x"), b"order").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(by.as_deref(), Some("shop/down"));
}
