//! Mutual TLS between agents and the consumer sources it verifies (issue
//! 29): real govd issuing identities, real gov-agents calling each other,
//! real upstreams that echo the consumer header they received.

use super::identity::{agent_metric, identity_ca};
use super::*;

/// `inv` knows its callers from their certificates; `payment` believes the
/// consumer header only from `web`.
const POLICY: &str = r#"service inv {
  consumer from peer on invalid reject
  match limited = path prefix "/limited"
  limit per_caller on limited {
    calls 3 per 1h
    per consumer
  }
  fuse order_failures on path prefix "/fail" and consumer "order" {
    trip when errors > 3 over 1m
  }
}
service payment {
  consumer from header "x-gov-consumer" trusted from peer "web"
}
service web {
  capacity workers 10
}
service order {
  capacity workers 10
}
"#;

/// An upstream that answers with the `x-gov-consumer` it received (`-`:
/// none), one line per copy.
async fn consumer_echo() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| {
                        let seen: Vec<String> = req
                            .headers()
                            .get_all("x-gov-consumer")
                            .iter()
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            .collect();
                        let body = if seen.is_empty() {
                            "-".to_owned()
                        } else {
                            seen.join("\n")
                        };
                        let status = if req.uri().path().starts_with("/fail") {
                            500
                        } else {
                            200
                        };
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    addr
}

/// A TLS client of `addr` presenting `cert` (None: no certificate) and
/// trusting any server: whether its GET got an HTTP answer.
async fn tls_get(addr: SocketAddr, cert: Option<(&Path, &Path)>) -> Result<String, String> {
    use rustls::pki_types::pem::PemObject as _;
    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    let config = match cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                rustls::pki_types::CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tls.write_all(b"GET /probe HTTP/1.1\r\nHost: inv\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        tls.read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        if text.is_empty() {
            Err("closed without an answer".to_owned())
        } else {
            Ok(text)
        }
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_call_each_other_over_mtls_and_no_caller_can_claim_another() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let id_ca = identity_ca(&dir.path().join("identity"));
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .args(&["--identity-ca", &id_ca, "--identity-lifetime", "1h"])
        .start()
        .await;
    let ca = pki.ca.display().to_string();
    let policy = write(dir.path(), "p.gov", POLICY);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--tls-ca", &ca, &policy]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);

    let start = async |service: &str, instance: &str, extra: &[&str], outbound: bool| {
        let mut builder = agent(service, instance)
            .upstream(consumer_echo().await)
            .control_plane(&govd)
            .tls(&pki, None);
        if outbound {
            builder = builder.outbound();
        }
        builder.args.push("--identity".into());
        builder.args.extend(extra.iter().map(Into::into));
        builder.start(dir.path()).await
    };
    let inv = start("inv", "inv-1", &["--inbound-mtls", "require"], false).await;
    let payment = start("payment", "payment-1", &["--inbound-mtls", "permit"], false).await;
    let web = start("web", "web-1", &[], true).await;
    let order = start("order", "order-1", &[], true).await;
    let (web_out, order_out) = (web.outbound.unwrap(), order.outbound.unwrap());
    wait_until(
        "both callers reach both callees over mutual TLS",
        Duration::from_secs(30),
        async || {
            for caller in [web_out, order_out] {
                for callee in ["inv", "payment"] {
                    if call_with(caller, callee, "/probe", "").await.0 != 200 {
                        return false;
                    }
                }
            }
            true
        },
    )
    .await;

    // `consumer from peer`: the consumer is the calling service, whatever
    // header the client sends; the upstream gets the verified one only.
    let (status, body) = call_with(web_out, "inv", "/probe", "x-gov-consumer: order\r\n").await;
    assert_eq!((status, body.as_str()), (200, "web"));
    let (status, body) = call_with(order_out, "inv", "/probe", "").await;
    assert_eq!((status, body.as_str()), (200, "order"));

    // web's quota of 3 is web's: rotating names does not escape it, and
    // claiming to be `order` does not spend order's.
    for (i, claim) in ["web-0", "web-1", "order"].iter().enumerate() {
        let header = format!("x-gov-consumer: {claim}\r\n");
        let (status, body) = call_with(web_out, "inv", "/limited", &header).await;
        assert_eq!((status, body.as_str()), (200, "web"), "call {i}");
    }
    for claim in ["web-3", "order", "crm"] {
        let header = format!("x-gov-consumer: {claim}\r\n");
        let (status, _) = call_with(web_out, "inv", "/limited", &header).await;
        assert_eq!(status, 429, "claiming {claim}");
    }
    let (status, body) = call_with(order_out, "inv", "/limited", "").await;
    assert_eq!((status, body.as_str()), (200, "order"));

    // A fuse scoped to `order`: web failing while claiming to be order does
    // not trip it; order's own failures do, and order cannot evade it by
    // claiming to be web.
    for _ in 0..6 {
        let (status, body) = call_with(web_out, "inv", "/fail", "x-gov-consumer: order\r\n").await;
        assert_eq!((status, body.as_str()), (500, "web"));
    }
    let mut statuses = Vec::new();
    while statuses.len() < 10 && statuses.last() != Some(&503) {
        statuses.push(call_with(order_out, "inv", "/fail", "").await.0);
    }
    assert_eq!(
        statuses.last(),
        Some(&503),
        "order's own failures: {statuses:?}"
    );
    let (status, _) = call_with(order_out, "inv", "/fail", "x-gov-consumer: web\r\n").await;
    assert_eq!(status, 503, "order claiming to be web");
    assert_eq!(call_with(web_out, "inv", "/fail", "").await.0, 500);

    // `trusted from peer "web"`: web's header passes, anyone else's is
    // removed before the rules and before the upstream.
    let alice = "x-gov-consumer: alice\r\n";
    assert_eq!(
        call_with(web_out, "payment", "/", alice).await,
        (200, "alice".to_owned())
    );
    assert_eq!(
        call_with(order_out, "payment", "/", alice).await,
        (200, "-".to_owned())
    );
    // A plain client (the listener permits it) is no trusted peer either.
    let (status, _, body) = http_get_with(payment.inbound, "/", alice).await;
    assert_eq!((status, body.as_str()), (200, "-"));

    // `require`: a plain client, a TLS client without a certificate and one
    // whose certificate another CA signed are all refused.
    let (status, _, body) = http_get_with(inv.inbound, "/probe", alice).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("requires mutual TLS"), "{body}");
    let anonymous = tls_get(inv.inbound, None).await;
    assert!(anonymous.is_err(), "{anonymous:?}");
    let foreign = Pki::new(&dir.path().join("foreign")).agent("web", true);
    let forged = tls_get(inv.inbound, Some((&foreign.0, &foreign.1))).await;
    assert!(forged.is_err(), "{forged:?}");
    // Under `permit`, TLS without a certificate is served (an ingress), as
    // no peer.
    let ingress = tls_get(payment.inbound, None).await.unwrap();
    assert!(ingress.starts_with("HTTP/1.1 200"), "{ingress}");

    let inbound = |result: &str| {
        format!("gov_agent_mtls_connections_total{{listener=\"inbound\",result=\"{result}\"}}")
    };
    assert!(agent_metric(&inv, &inbound("verified")).await >= 2);
    assert!(agent_metric(&inv, &inbound("refused")).await >= 3);
    assert_eq!(agent_metric(&inv, &inbound("plain")).await, 0);
    assert!(agent_metric(&payment, &inbound("plain")).await >= 1);
    assert!(agent_metric(&payment, &inbound("anonymous")).await >= 1);
    let outbound = "gov_agent_mtls_connections_total{listener=\"outbound\",result=\"mtls\"}";
    assert!(agent_metric(&web, outbound).await >= 2);
    assert_eq!(
        agent_metric(&inv, "gov_agent_consumer_source{source=\"peer\"}").await,
        1
    );

    // govc status says where each service's consumers come from and which
    // instances verify their callers.
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status", "--tls-ca", &ca]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let row = |service: &str| {
        status
            .stdout
            .lines()
            .find(|l| l.starts_with(service) && l.contains("instances"))
            .unwrap_or_else(|| panic!("no consumer row of {service}: {}", status.stdout))
            .to_owned()
    };
    let inv_row = row("inv ");
    assert!(
        inv_row.contains("peer on invalid reject") && inv_row.contains("1 of 1"),
        "{inv_row}"
    );
    let payment_row = row("payment ");
    assert!(
        payment_row.contains("trusted from peer \"web\""),
        "{payment_row}"
    );
    assert!(row("web ").contains("no (any client"), "{}", status.stdout);

    for a in [inv, payment, web, order] {
        a.stop().await;
    }
}

/// Certificates that expire every 6 s under a steady load between two
/// agents: renewals (at two thirds of the life) replace them, callee-closed
/// idle connections make callers handshake again with the renewed ones, and
/// no call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_certificates_rotate_under_load_between_agents_without_a_failed_call() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let id_ca = identity_ca(&dir.path().join("identity"));
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .args(&["--identity-ca", &id_ca, "--identity-lifetime", "6s"])
        .start()
        .await;
    let ca = pki.ca.display().to_string();
    let policy = write(dir.path(), "p.gov", POLICY);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--tls-ca", &ca, &policy]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    let mut callee = agent("inv", "inv-1")
        .upstream(consumer_echo().await)
        .control_plane(&govd)
        .tls(&pki, None);
    // Idle connections close after 1 s: callers connect again all along.
    for arg in [
        "--identity",
        "--inbound-mtls",
        "require",
        "--header-read-timeout",
        "1s",
    ] {
        callee.args.push(arg.into());
    }
    let inv = callee.start(dir.path()).await;
    let mut caller = agent("web", "web-1")
        .upstream(consumer_echo().await)
        .control_plane(&govd)
        .tls(&pki, None)
        .outbound();
    caller.args.push("--identity".into());
    let web = caller.start(dir.path()).await;
    let web_out = web.outbound.unwrap();
    wait_until(
        "web reaches inv over mutual TLS",
        Duration::from_secs(30),
        async || call_with(web_out, "inv", "/probe", "").await == (200, "web".to_owned()),
    )
    .await;
    let verified = "gov_agent_mtls_connections_total{listener=\"inbound\",result=\"verified\"}";
    let started = Instant::now();

    // 12 s of calls, four loops; each pauses 1.5 s after every 20 calls.
    let deadline = started + Duration::from_secs(12);
    let load: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0_usize, Vec::new());
                while Instant::now() < deadline {
                    match call_with(web_out, "inv", "/probe", "").await {
                        (200, body) if body == "web" => ok += 1,
                        other => failed.push(other),
                    }
                    if ok % 20 == 0 {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    // Once every first certificate has expired (6 s), count the handshakes.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let after_expiry = agent_metric(&inv, verified).await;
    let (mut ok, mut failed) = (0, Vec::new());
    for task in load {
        let (o, f) = task.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {failed:?}",
        failed.len(),
        ok + failed.len()
    );
    assert!(ok > 50, "only {ok} calls");
    let handshakes = agent_metric(&inv, verified).await;
    assert!(
        handshakes > after_expiry,
        "no handshake after the first certificates expired ({after_expiry} then {handshakes})"
    );
    for a in [&inv, &web] {
        let log = read(&a.log);
        assert!(
            log.matches("certificate issued by the control plane")
                .count()
                >= 3,
            "{log}"
        );
    }
    assert_eq!(
        agent_metric(
            &web,
            "gov_agent_mtls_connections_total{listener=\"outbound\",result=\"failed\"}"
        )
        .await,
        0
    );
    inv.stop().await;
    web.stop().await;
}
