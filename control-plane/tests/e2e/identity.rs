//! govd issues agent identities (`--identity-ca`, issue 28): real
//! certificates made by rcgen, checked by rustls in govd and gov-agent.

use super::*;

/// An identity CA for govd's `--identity-ca`, as `CERT,KEY` files in `dir`.
pub(super) fn identity_ca(dir: &Path) -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gov e2e identity CA");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let (cert_path, key_path) = (dir.join("identity-ca.pem"), dir.join("identity-ca.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    format!("{},{}", cert_path.display(), key_path.display())
}

/// A CSR for `cn` that also asks for `sans` (which govd must ignore), and
/// its key.
fn csr(cn: &str, sans: Vec<String>) -> (Vec<u8>, rcgen::KeyPair) {
    let mut params = rcgen::CertificateParams::new(sans).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().unwrap();
    let der = params.serialize_request(&key).unwrap().der().to_vec();
    (der, key)
}

/// `Certify` as an agent with `token` would call it.
async fn certify(
    govd: &Govd,
    token: Option<&str>,
    csr_der: Vec<u8>,
    instance: &str,
) -> Result<pb::CertifyResponse, tonic::Status> {
    let tls = gov_common::tls::ClientTls::read(&gov_common::tls::ClientTlsFiles {
        ca: govd.ca.clone(),
        ..Default::default()
    })
    .unwrap();
    let mut client =
        gov_control_plane::client::connect_tls(&govd.url(), &tls, Duration::from_secs(5))
            .await
            .unwrap();
    let mut request = tonic::Request::new(pb::CertifyRequest {
        csr_der,
        instance: instance.into(),
    });
    if let Some(token) = token {
        gov_control_plane::auth::authorize(&mut request, token).unwrap();
    }
    client
        .certify(request)
        .await
        .map(tonic::Response::into_inner)
}

/// The audit records of `action`.
async fn audited(govd: &Govd, ca: &str, action: &str) -> Vec<serde_json::Value> {
    let audit = govc(
        govd,
        Some(VIEWER_TOKEN),
        &["audit", "-o", "json", "--tls-ca", ca],
    )
    .await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let records: Vec<serde_json::Value> = serde_json::from_str(&audit.stdout).unwrap();
    records
        .into_iter()
        .filter(|r| r["action"] == action)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govd_issues_an_agent_its_services_identity_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let id_ca = identity_ca(&dir.path().join("identity"));
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .args(&["--identity-ca", &id_ca, "--identity-lifetime", "1h"])
        .args(&["--identity-trust-domain", "prod.example"])
        .start()
        .await;
    let ca = pki.ca.display().to_string();

    // order's token gets order's identity, whatever names the CSR asks for.
    let (der, key) = csr("order", vec!["spiffe://evil/service/payment".into()]);
    let before = gov_control_plane::convert::now_unix_ms();
    let issued = certify(&govd, Some(&service_agent_token("order")), der, "order-1")
        .await
        .unwrap();
    assert_eq!(
        issued.spiffe_id,
        "spiffe://prod.example/instance/order-1/service/order"
    );
    let hour = 3_600_000;
    assert!(
        issued.not_after_unix_ms >= before - 1_000 + hour
            && issued.not_after_unix_ms <= gov_control_plane::convert::now_unix_ms() + hour,
        "{}",
        issued.not_after_unix_ms
    );
    assert!(!issued.cert_chain_pem.contains("payment"));
    assert_eq!(
        issued.cert_chain_pem.matches("BEGIN CERTIFICATE").count(),
        2
    );

    // A CSR for another service's identity, no token, a person's token, a
    // CSR that is not one: refused.
    let (der, _) = csr("payment", Vec::new());
    let other = certify(&govd, Some(&service_agent_token("order")), der, "order-1")
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::PermissionDenied);
    assert!(other.message().contains("not `payment`"), "{other:?}");
    let (der, _) = csr("order", Vec::new());
    let none = certify(&govd, None, der.clone(), "order-1")
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::Unauthenticated, "{none:?}");
    let person = certify(&govd, Some(TOKEN), der, "order-1")
        .await
        .unwrap_err();
    assert_eq!(person.code(), tonic::Code::PermissionDenied, "{person:?}");
    let garbage = certify(
        &govd,
        Some(&service_agent_token("order")),
        b"no".to_vec(),
        "o",
    )
    .await
    .unwrap_err();
    assert_eq!(garbage.code(), tonic::Code::InvalidArgument);

    // The issued certificate is the agent's identity at govd: it connects
    // with it (no token), and govd takes it as order's.
    let (cert_path, key_path) = (dir.path().join("order.pem"), dir.path().join("order.key"));
    std::fs::write(&cert_path, &issued.cert_chain_pem).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let up = upstream().await;
    let order = agent("order", "order-1")
        .upstream(up)
        .no_token()
        .control_plane(&govd)
        .tls(&pki, Some(&(cert_path, key_path)))
        .start(dir.path())
        .await;
    wait_until(
        "the agent connected with its issued certificate",
        Duration::from_secs(10),
        async || govd.status().await.agents.len() == 1,
    )
    .await;

    // Each issue and the refusal are audited, with who asked.
    let issued_records = audited(&govd, &ca, "certificate-issued").await;
    assert_eq!(issued_records.len(), 1, "{issued_records:?}");
    assert_eq!(
        issued_records[0]["who"],
        "agent with the token `order-agents`"
    );
    assert_eq!(
        issued_records[0]["targets"][0],
        "spiffe://prod.example/instance/order-1/service/order"
    );
    assert!(
        issued_records[0]["detail"]
            .as_str()
            .unwrap()
            .contains(&issued.not_after_unix_ms.to_string())
    );
    let refused = audited(&govd, &ca, "certificate-refused").await;
    assert!(
        refused.iter().any(|r| r["targets"][0] == "payment/order-1"
            && r["who"] == "agent with the token `order-agents`"),
        "{refused:?}"
    );
    order.stop().await;
    govd.stop().await;
}

/// `gauge`'s value in the agent's `/metrics` (0 without it).
pub(super) async fn agent_metric(agent: &Agent, series: &str) -> u64 {
    let (_, _, metrics) = http_get(agent.admin, "/metrics").await;
    sample(&metrics, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_renews_its_identity_under_load_without_a_failed_call() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let id_ca = identity_ca(&dir.path().join("identity"));
    let flags = ["--identity-ca", &id_ca, "--identity-lifetime", "6s"];
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .args(&flags)
        .start()
        .await;
    let ca = pki.ca.display().to_string();
    let v1 = write(dir.path(), "v1.gov", V1);
    let applied = govc(&govd, Some(TOKEN), &["apply", "--tls-ca", &ca, &v1]).await;
    assert_eq!(applied.code, 0, "{}", applied.stderr);

    // The agent has no certificate file: it asks govd for one with its
    // token, then connects with it.
    let up = upstream().await;
    let mut builder = agent("order", "order-1")
        .upstream(up)
        .control_plane(&govd)
        .tls(&pki, None);
    builder.args.push("--identity".into());
    let order = builder.start(dir.path()).await;
    wait_until(
        "the agent connected with an issued certificate",
        Duration::from_secs(10),
        async || all_synced(&govd, &["order-1"]).await,
    )
    .await;
    let first = agent_metric(&order, "gov_agent_certificate_not_after_timestamp_seconds").await;
    let now = gov_control_plane::convert::now_unix_ms() / 1000;
    assert!((now..=now + 7).contains(&first), "{first} against {now}");

    // 10s of calls through the proxy, four at a time: the certificate is
    // renewed at about 4s and 8s (two thirds of 6s), and no call fails.
    let inbound = order.inbound;
    let deadline = Instant::now() + Duration::from_secs(10);
    let load: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0_usize, Vec::new());
                while Instant::now() < deadline {
                    match http_get(inbound, "/").await {
                        (200, _, _) => ok += 1,
                        other => failed.push(other),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
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
    assert!(ok > 100, "only {ok} calls");
    // Renewed (at least twice), the gauge moved, and the stream that the
    // first certificate opened was never dropped.
    let log = read(&order.log);
    assert!(
        log.matches("certificate issued by the control plane")
            .count()
            >= 3,
        "{log}"
    );
    let later = agent_metric(&order, "gov_agent_certificate_not_after_timestamp_seconds").await;
    assert!(later >= first + 4, "{later} after {first}");
    assert_eq!(
        log.matches("connected to the control plane").count(),
        1,
        "{log}"
    );
    assert_eq!(
        agent_metric(&order, "gov_agent_certificate_failures_total").await,
        0
    );
    let issued = audited(&govd, &ca, "certificate-issued").await;
    assert!(issued.len() >= 3, "{issued:?}");

    // A new connection uses the new certificate: govd restarts when the
    // first one has long expired, and the agent connects again.
    let port = govd.addr.port();
    govd.stop().await;
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .args(&flags)
        .start_on(port)
        .await;
    wait_until(
        "the agent connected again with a renewed certificate",
        Duration::from_secs(15),
        async || all_synced(&govd, &["order-1"]).await,
    )
    .await;
    order.stop().await;
    govd.stop().await;
}

/// A certificate govd cannot trust is refused at the TLS handshake, and the
/// refusal is audited with the address it came from and what it claimed:
/// an expired certificate from govd's own CA, and one from another CA. A
/// refusing agent retries; the audit stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_or_foreign_certificate_is_refused_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let foreign = Pki::new(&dir.path().join("foreign"));
    let govd = control_plane(&dir.path().join("state"))
        .tls(&pki)
        .start()
        .await;
    let ca = pki.ca.display().to_string();
    let up = upstream().await;

    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names.push(rcgen::SanType::URI(
        "spiffe://gov.test/service/order".try_into().unwrap(),
    ));
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 2);
    let expired = pki.sign("expired-order", params);
    let stranger = foreign.agent("order", true);
    let mut agents = Vec::new();
    for (instance, cert) in [("order-old", &expired), ("order-odd", &stranger)] {
        agents.push(
            agent("order", instance)
                .upstream(up)
                .control_plane(&govd)
                .tls(&pki, Some(cert))
                .start(dir.path())
                .await,
        );
    }
    let mut refused = Vec::new();
    let log = govd.log.clone();
    let _dump = Defer(move || eprintln!("govd log:\n{}", read(&log)));
    wait_until(
        "both refusals audited",
        Duration::from_secs(15),
        async || {
            refused = audited(&govd, &ca, "certificate-refused").await;
            let detail = |r: &serde_json::Value| r["detail"].as_str().unwrap_or("").to_owned();
            // The foreign CA has the same name as govd's: its signature fails.
            refused.iter().any(|r| detail(r).contains("expired"))
                && refused.iter().any(|r| detail(r).contains("bad_signature"))
        },
    )
    .await;
    for record in &refused {
        let who = record["who"].as_str().unwrap();
        assert!(
            who.starts_with("unauthenticated peer 127.0.0.1:"),
            "{record}"
        );
        assert!(
            record["targets"][0]
                .as_str()
                .unwrap()
                .starts_with("spiffe://gov.test/"),
            "{record}"
        );
    }
    assert!(
        refused.iter().any(|r| r["detail"]
            .as_str()
            .unwrap()
            .contains("at the TLS handshake: expired")),
        "{refused:?}"
    );
    // Neither got a config or a place in the view.
    assert!(govd.status().await.agents.is_empty());
    // However often they retry, at most the per-minute bound is audited.
    assert!(
        refused.len() <= gov_control_plane::tls_server::AUDITED_PER_WINDOW as usize,
        "{}",
        refused.len()
    );
}

/// Runs its closure when dropped (a log dumped when a test fails).
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}
