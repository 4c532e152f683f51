//! Mutual TLS between two agents without a control plane (issue 29):
//! platform certificates (`--tls-cert`/`--tls-key`, `--peer-ca`), static
//! `--instances` with `--outbound-mtls always`, on the HTTP/1 path's pool
//! and on hyper's connector (HTTP/2, ALPN `h2`).

use std::path::{Path, PathBuf};

use gov_agent::sidecar::{InboundMtls, OutboundMtls, PeerTls, UpstreamProtocol};

use crate::h1::Wire;
use crate::strict::RawUpstream;
use crate::support::{Agent, Upstream, agent};

/// The callee (the service behind `inv`'s address; every agent here runs
/// beside `shop`) believes only what a certificate says.
const PEER: &str = r#"
service: shop
version: mtls-v1
consumer_source: { peer: { on_invalid: ON_INVALID_REJECT } }
rules:
  - name: shop/all
    on: { path: { kind: PATH_KIND_PREFIX, value: / } }
    limit:
      calls: { amount: 1000000, window_ms: 3600000 }
"#;

/// A CA, and certificates it signs for services (SPIFFE IDs).
struct Pki {
    dir: PathBuf,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(dir: &Path, name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), issuer.pem()).unwrap();
        Self {
            dir: dir.to_owned(),
            issuer,
        }
    }

    fn ca(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    /// A certificate for `service`, as (cert, key) files.
    fn agent(&self, service: &str) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let id = format!("spiffe://gov.test/ns/default/service/{service}");
        params
            .subject_alt_names
            .push(rcgen::SanType::URI(id.try_into().unwrap()));
        self.sign(params, service)
    }

    /// A server certificate for the DNS name `name` (an ingress's view).
    fn server(&self, name: &str) -> (PathBuf, PathBuf) {
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        self.sign(params, name)
    }

    fn sign(&self, params: rcgen::CertificateParams, service: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stem = format!("{service}-{n}");
        let (c, k) = (
            self.dir.join(format!("{stem}.crt")),
            self.dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// The callee: `inv`'s agent requiring mTLS, presenting `cert`.
async fn callee(pki_ca: &Path, cert: &(PathBuf, PathBuf), up: &RawUpstream) -> Agent {
    let mtls = PeerTls::new(InboundMtls::Require, OutboundMtls::Auto, Some(pki_ca)).unwrap();
    agent()
        .config(PEER)
        .upstream(&Upstream::at(up.addr))
        .mtls(mtls, &cert.0, &cert.1)
        .start()
        .await
}

/// A caller of `inv` at `callee`, presenting `cert`, over `protocol`.
async fn caller(
    pki_ca: &Path,
    cert: &(PathBuf, PathBuf),
    callee: &Agent,
    protocol: UpstreamProtocol,
) -> Agent {
    let mtls = PeerTls::new(InboundMtls::Off, OutboundMtls::Always, Some(pki_ca)).unwrap();
    agent()
        .mtls(mtls, &cert.0, &cert.1)
        .upstream_protocol(protocol)
        .instance_addrs("inv", &[callee.sidecar.inbound_addr()])
        .start()
        .await
}

/// One GET through `caller`'s outbound listener to `inv`, claiming `crm`.
async fn call(caller: &Agent) -> u16 {
    let mut wire = Wire::connect(caller.sidecar.outbound_addr().unwrap()).await;
    wire.send(b"GET /x HTTP/1.1\r\nhost: inv\r\nx-gov-consumer: crm\r\n\r\n")
        .await;
    wire.response().await.status
}

async fn metric(agent: &Agent, series: &str) -> u64 {
    let text = metrics_text(agent).await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

async fn metrics_text(agent: &Agent) -> String {
    crate::support::http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_speak_mtls_on_both_paths_and_the_callee_knows_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let up = RawUpstream::start().await;
    let inv = callee(&pki.ca("ca"), &pki.agent("inv"), &up).await;

    // The HTTP/1 path's pool, then hyper's connector with ALPN h2: the
    // callee judges and forwards the caller's service, not its claim.
    for protocol in [UpstreamProtocol::Http1, UpstreamProtocol::Http2] {
        let web = caller(&pki.ca("ca"), &pki.agent("web"), &inv, protocol).await;
        assert_eq!(call(&web).await, 200, "{protocol:?}");
        let received = up.take();
        let last = received.last().unwrap().as_ref().unwrap();
        assert_eq!(
            last.header("x-gov-consumer"),
            Some(&b"web"[..]),
            "{protocol:?}"
        );
        assert_eq!(last.count("x-gov-consumer"), 1);
        let mtls = "gov_agent_mtls_connections_total{listener=\"outbound\",result=\"mtls\"}";
        assert!(metric(&web, mtls).await >= 1, "{protocol:?}");
    }

    // A caller whose certificate another CA signed: refused by the callee's
    // handshake, so the caller answers 502 and nothing reaches the upstream.
    let other = Pki::new(dir.path(), "other");
    let forged = caller(
        &other.ca("other"),
        &other.agent("web"),
        &inv,
        UpstreamProtocol::Http1,
    )
    .await;
    assert_eq!(call(&forged).await, 502);
    assert!(up.take().is_empty());
    let refused = "gov_agent_mtls_connections_total{listener=\"inbound\",result=\"refused\"}";
    assert!(metric(&inv, refused).await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callee_whose_certificate_names_another_service_is_not_called() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let up = RawUpstream::start().await;
    // `inv`'s address, but a certificate of `payment`.
    let impostor = callee(&pki.ca("ca"), &pki.agent("payment"), &up).await;
    let web = caller(
        &pki.ca("ca"),
        &pki.agent("web"),
        &impostor,
        UpstreamProtocol::Http1,
    )
    .await;
    assert_eq!(call(&web).await, 502);
    assert!(up.take().is_empty());
    let failed = "gov_agent_mtls_connections_total{listener=\"outbound\",result=\"failed\"}";
    assert!(metric(&web, failed).await >= 1);
}

/// A caller whose certificate is not there yet when it starts (`--identity`
/// still asking govd, a secret not mounted yet) waits for it, within the
/// handshake bound, instead of calling plain and being refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_before_the_certificate_arrives_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let up = RawUpstream::start().await;
    let inv = callee(&pki.ca("ca"), &pki.agent("inv"), &up).await;
    let (cert, key) = (dir.path().join("late.crt"), dir.path().join("late.key"));
    let mtls = PeerTls::new(InboundMtls::Off, OutboundMtls::Always, Some(&pki.ca("ca"))).unwrap();
    let web = agent()
        .mtls(mtls, &cert, &key)
        .certificate_later()
        .instance_addrs("inv", &[inv.sidecar.inbound_addr()])
        .start()
        .await;
    // The files appear a moment after the first call is made; the next
    // read (every 2 s) puts them in force.
    let issued = pki.agent("web");
    let write = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        std::fs::copy(&issued.0, &cert).unwrap();
        std::fs::copy(&issued.1, &key).unwrap();
    });
    assert_eq!(call(&web).await, 200);
    write.await.unwrap();
    let received = up.take();
    let last = received.last().unwrap().as_ref().unwrap();
    assert_eq!(last.header("x-gov-consumer"), Some(&b"web"[..]));
}

/// `consumer from peer on invalid count`: a client without an agent
/// certificate is served, as no consumer.
const PEER_OR_NONE: &str = r#"
service: shop
version: mtls-count-v1
consumer_source: { peer: { on_invalid: ON_INVALID_COUNT } }
"#;

/// An ingress that names the service (SNI) gets the listener's ingress
/// certificate and is served as no peer; an agent, naming none, still gets
/// the agent certificate and is verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_gets_its_own_certificate_and_agents_theirs() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let public = Pki::new(dir.path(), "public");
    let up = RawUpstream::start().await;
    let site = public.server("inv.example");
    let inv_cert = pki.agent("inv");
    let mtls = PeerTls::new(InboundMtls::Permit, OutboundMtls::Auto, Some(&pki.ca("ca"))).unwrap();
    let inv = agent()
        .config(PEER_OR_NONE)
        .upstream(&Upstream::at(up.addr))
        .mtls(mtls, &inv_cert.0, &inv_cert.1)
        .ingress(&site.0, &site.1)
        .start()
        .await;

    // The ingress checks the certificate against the public CA and its name.
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(public.ca("public")).unwrap();
    use rustls::pki_types::pem::PemObject as _;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(inv.sidecar.inbound_addr())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("inv.example").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the ingress certificate verifies for inv.example");
    tls.write_all(
        b"GET /x HTTP/1.1\r\nhost: inv.example\r\nx-gov-consumer: crm\r\nconnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let received = up.take();
    let last = received.last().unwrap().as_ref().unwrap();
    assert_eq!(last.header("x-gov-consumer"), None, "an ingress is no peer");

    // An agent still meets the agent certificate, and is its caller.
    let web = caller(
        &pki.ca("ca"),
        &pki.agent("web"),
        &inv,
        UpstreamProtocol::Http1,
    )
    .await;
    assert_eq!(call(&web).await, 200);
    let received = up.take();
    let last = received.last().unwrap().as_ref().unwrap();
    assert_eq!(last.header("x-gov-consumer"), Some(&b"web"[..]));
}
