//! Mutual TLS between agents: a caller's outbound agent calls the callee's
//! inbound agent over TLS, each presenting the certificate in force
//! ([`crate::identity::Credentials`]: issued by govd, or the platform's
//! files), so the inbound agent knows the calling service and instance from
//! a certificate rather than from a header anyone can set.
//!
//! The inbound listener's mode is `--inbound-mtls`: `off` (plain, the
//! default for a listener only the local app reaches), `permit` (TLS and
//! plain both, for a migration: the first byte tells a TLS handshake from
//! an HTTP request) or `require` (plain connections and TLS without a valid
//! agent certificate are refused). An agent tells govd its mode in its
//! hello; govd marks the instance in the endpoint sets it pushes, and a
//! caller with a certificate uses TLS to the marked instances ([`Targets`])
//! and checks that the certificate they present names the service it meant
//! to call.
//!
//! Certificates are checked against `--peer-ca` when given, else against
//! the CA that signed this agent's own certificate (the end of the chain
//! govd issued). The name a certificate gives is read as govd reads
//! agents' certificates ([`gov_proto::spiffe`]): a SPIFFE URI SAN
//! `spiffe://DOMAIN/.../service/NAME` in one strict form, else the CN.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use http::uri::Authority;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;

use crate::identity::{Credential, Credentials};

mod stream;
mod targets;
mod verify;

pub(crate) use self::stream::Stream;
pub use self::targets::{OutboundMtls, Targets};
use self::verify::AgentVerifier;

/// How long a TLS handshake may take, either way.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// `--inbound-mtls`: what the inbound listener accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InboundMtls {
    /// Plain connections only.
    #[default]
    Off,
    /// TLS (with or without an agent certificate) and plain connections.
    Permit,
    /// TLS with a valid agent certificate only.
    Require,
}

impl std::str::FromStr for InboundMtls {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Self::Off),
            "permit" => Ok(Self::Permit),
            "require" => Ok(Self::Require),
            _ => Err(format!(
                "`{s}` is not an mTLS mode: use `off`, `permit` or `require`"
            )),
        }
    }
}

impl InboundMtls {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Permit => "permit",
            Self::Require => "require",
        }
    }
}

/// The calling agent of an inbound connection, as its certificate names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub service: String,
    /// The instance a govd-issued certificate names.
    pub instance: Option<String>,
    /// The SPIFFE ID (empty: the service is the certificate's CN).
    pub spiffe_id: String,
}

/// Why mutual TLS cannot be set up with the certificate in force.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum MtlsError {
    #[error("--peer-ca `{path}` cannot be used: {reason}")]
    #[diagnostic(
        code(gov::agent::peer_ca),
        help("give the PEM file of the CA that signs the agents' certificates")
    )]
    PeerCa { path: String, reason: String },
}

/// What the listener and the connector count, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Inbound connections over TLS with a verified agent certificate.
    pub(crate) verified: AtomicU64,
    /// Inbound connections over TLS without a client certificate (`permit`).
    pub(crate) tls_anonymous: AtomicU64,
    /// Inbound plain connections (`permit`).
    pub(crate) plain: AtomicU64,
    /// Inbound connections refused: plain under `require`, a failed
    /// handshake, a certificate that names no service.
    pub(crate) refused: AtomicU64,
    /// Outbound connections to agents over mutual TLS.
    pub(crate) outbound: AtomicU64,
    /// Outbound handshakes that failed, or whose peer named another service.
    pub(crate) outbound_failed: AtomicU64,
}

/// The configs built for one certificate in force.
struct Built {
    credential: Arc<Credential>,
    /// `--inbound-tls-cert`, for clients that are not agents.
    ingress: Option<Arc<Credential>>,
    server: Option<Arc<ServerConfig>>,
    /// To HTTP/1.1 and to HTTP/2 upstreams (their ALPN).
    client: Option<[Arc<ClientConfig>; 2]>,
}

/// The protocol a connection to another agent speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alpn {
    Http1 = 0,
    Http2 = 1,
}

/// Mutual TLS between agents: the inbound mode, the trust anchors and the
/// certificate in force.
pub struct PeerTls {
    inbound: InboundMtls,
    outbound: OutboundMtls,
    /// `--peer-ca`: the CAs that sign agents' certificates.
    peer_ca: Option<Vec<CertificateDer<'static>>>,
    credentials: ArcSwapOption<Credentials>,
    /// `--inbound-tls-cert`/`--inbound-tls-key`: the certificate the inbound
    /// listener presents to a client that names a server (SNI), an ingress;
    /// agents name none and get the agent's own.
    ingress: ArcSwapOption<Credentials>,
    built: Mutex<Option<Arc<Built>>>,
    pub(crate) counts: Counts,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("inbound", &self.inbound)
            .field("outbound", &self.outbound)
            .field("peer_ca", &self.peer_ca.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

impl PeerTls {
    /// `inbound`, `outbound`, and the CA file of `--peer-ca` (`None`: the
    /// CA that signed this agent's own certificate).
    pub fn new(
        inbound: InboundMtls,
        outbound: OutboundMtls,
        peer_ca: Option<&std::path::Path>,
    ) -> Result<Self, MtlsError> {
        let peer_ca = match peer_ca {
            None => None,
            Some(path) => {
                let bad = |reason: String| MtlsError::PeerCa {
                    path: path.display().to_string(),
                    reason,
                };
                let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
                let certs = CertificateDer::pem_slice_iter(&pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(e.to_string()))?;
                if certs.is_empty() {
                    return Err(bad("it holds no PEM certificate".into()));
                }
                Some(certs)
            }
        };
        Ok(Self {
            inbound,
            outbound,
            peer_ca,
            ..Self::off()
        })
    }

    /// No mutual TLS: a plain inbound listener (calls to agents that take
    /// TLS stay plain until a certificate is in force).
    pub fn off() -> Self {
        Self {
            inbound: InboundMtls::Off,
            outbound: OutboundMtls::Auto,
            peer_ca: None,
            credentials: ArcSwapOption::empty(),
            ingress: ArcSwapOption::empty(),
            built: Mutex::new(None),
            counts: Counts::default(),
        }
    }

    /// The inbound listener's mode.
    pub fn inbound(&self) -> InboundMtls {
        self.inbound
    }

    /// The service of the endpoint at `authority`, when it is called over
    /// mutual TLS (by `--outbound-mtls` and `targets`).
    pub(crate) fn target(&self, targets: &Targets, authority: &Authority) -> Option<Arc<str>> {
        targets.service(authority, self.outbound)
    }

    /// From now on, connections use the certificate in force in `credentials`.
    pub fn use_credentials(&self, credentials: Credentials) {
        self.credentials.store(Some(Arc::new(credentials)));
    }

    /// The inbound listener presents the certificate in force in
    /// `credentials` to clients that name a server (an ingress over TLS).
    pub fn use_ingress_credentials(&self, credentials: Credentials) {
        self.ingress.store(Some(Arc::new(credentials)));
    }

    /// The configs for the certificates in force (built once per pair).
    fn built(&self) -> Option<Arc<Built>> {
        let credential = self.credentials.load().as_ref()?.current()?;
        let ingress = self.ingress.load().as_ref().and_then(|c| c.current());
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        let same = |a: &Option<Arc<Credential>>, b: &Option<Arc<Credential>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if let Some(b) = built.as_ref()
            && Arc::ptr_eq(&b.credential, &credential)
            && same(&b.ingress, &ingress)
        {
            return Some(b.clone());
        }
        let (server, client) = match self.configs(&credential, ingress.as_deref()) {
            Ok(configs) => configs,
            Err(error) => {
                tracing::warn!(%error, "cannot use this agent's certificate for mutual TLS between agents");
                (None, None)
            }
        };
        let b = Arc::new(Built {
            credential,
            ingress,
            server,
            client,
        });
        *built = Some(b.clone());
        Some(b)
    }

    /// The configs for the certificate in force, waiting for the first one
    /// (at most [`HANDSHAKE_TIMEOUT`]) when the agent has a source of
    /// certificates but none yet: right after start, `--identity` is still
    /// asking govd, and a call made then would go out plain and be refused
    /// by a callee that requires mutual TLS.
    async fn ready(&self) -> Option<Arc<Built>> {
        if let Some(built) = self.built() {
            return Some(built);
        }
        let credentials = self.credentials.load_full()?;
        let never = tokio_util::sync::CancellationToken::new();
        let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, credentials.wait(&never)).await;
        self.built()
    }

    #[allow(clippy::type_complexity)]
    fn configs(
        &self,
        credential: &Credential,
        ingress: Option<&Credential>,
    ) -> Result<(Option<Arc<ServerConfig>>, Option<[Arc<ClientConfig>; 2]>), String> {
        let chain = CertificateDer::pem_slice_iter(credential.chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the certificate is not PEM: {e}"))?;
        let key = || {
            PrivateKeyDer::from_pem_slice(credential.key_pem.as_bytes())
                .map_err(|e| format!("the key is not PEM: {e}"))
        };
        // Without --peer-ca: the CA at the end of the chain govd issued.
        let anchors: Vec<CertificateDer<'static>> = match &self.peer_ca {
            Some(ca) => ca.clone(),
            None if chain.len() > 1 => chain[1..].to_vec(),
            None => {
                return Err(
                    "no CA to check other agents' certificates against: give --peer-ca (the certificate has no CA after it)".into(),
                );
            }
        };
        let mut roots = RootCertStore::empty();
        for ca in anchors {
            roots
                .add(ca)
                .map_err(|e| format!("a CA certificate cannot be used: {e}"))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = &[&rustls::version::TLS13, &rustls::version::TLS12];

        let mut verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
        if self.inbound != InboundMtls::Require {
            verifier = verifier.allow_unauthenticated();
        }
        let verifier = verifier
            .build()
            .map_err(|e| format!("cannot check client certificates: {e}"))?;
        let certified = |chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>, what| {
            let signing = provider
                .key_provider
                .load_private_key(key)
                .map_err(|e| format!("{what}'s key cannot be used: {e}"))?;
            let certified = rustls::sign::CertifiedKey::new(chain, signing);
            certified
                .keys_match()
                .map_err(|e| format!("{what}'s key does not go with its certificate: {e}"))?;
            Ok::<_, String>(Arc::new(certified))
        };
        let ingress = match ingress {
            None => None,
            Some(c) => {
                let chain = CertificateDer::pem_slice_iter(c.chain_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--inbound-tls-cert is not PEM: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes())
                    .map_err(|e| format!("--inbound-tls-key is not PEM: {e}"))?;
                Some(certified(chain, key, "--inbound-tls-cert")?)
            }
        };
        let by_name = ByName {
            agent: certified(chain.clone(), key()?, "this agent's certificate")?,
            ingress,
        };
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(Arc::new(by_name));
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // An idle connection pooled by the caller stays silent.
        server.send_tls13_tickets = 0;

        let mut client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AgentVerifier { roots, provider }))
            .with_client_auth_cert(chain, key()?)
            .map_err(|e| format!("the key does not go with the certificate: {e}"))?;
        client.resumption = rustls::client::Resumption::disabled();
        // No SNI: a callee presents its agent certificate to agents, and an
        // ingress certificate only to clients that name a server.
        client.enable_sni = false;
        let mut h2 = client.clone();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        h2.alpn_protocols = vec![b"h2".to_vec()];
        Ok((
            Some(Arc::new(server)),
            Some([Arc::new(client), Arc::new(h2)]),
        ))
    }

    /// Accepts `stream` by the inbound mode: `Ok` with the connection and
    /// the verified caller (if any), `Err` when it is refused (the reason).
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
    ) -> Result<(Stream, Option<Arc<Caller>>), &'static str> {
        if self.inbound == InboundMtls::Off {
            return Ok((Stream::Plain(stream), None));
        }
        let mut first = [0_u8; 1];
        let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
        let tls = matches!(peeked, Ok(Ok(1))) && first[0] == TLS_HANDSHAKE;
        if !tls {
            if self.inbound == InboundMtls::Require {
                self.counts.refused.fetch_add(1, Ordering::Relaxed);
                refuse_plain(stream).await;
                return Err("a plain connection to a listener that requires mutual TLS");
            }
            self.counts.plain.fetch_add(1, Ordering::Relaxed);
            return Ok((Stream::Plain(stream), None));
        }
        let refused = |why| {
            self.counts.refused.fetch_add(1, Ordering::Relaxed);
            Err(why)
        };
        let Some(server) = self.ready().await.and_then(|b| b.server.clone()) else {
            return refused("a TLS connection before this agent has a certificate it can use");
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(_)) => return refused("the TLS handshake failed (no valid agent certificate)"),
            Err(_) => return refused("the TLS handshake timed out"),
        };
        let caller = match tls.get_ref().1.peer_certificates().and_then(|c| c.first()) {
            None => {
                self.counts.tls_anonymous.fetch_add(1, Ordering::Relaxed);
                None
            }
            Some(cert) => match gov_proto::spiffe::certificate_identity(cert) {
                Ok(id) => {
                    self.counts.verified.fetch_add(1, Ordering::Relaxed);
                    Some(Arc::new(Caller {
                        instance: id.instance().map(str::to_owned),
                        service: id.service,
                        spiffe_id: id.spiffe_id,
                    }))
                }
                Err(_) => return refused("the client certificate names no service"),
            },
        };
        Ok((
            Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(tls))),
            caller,
        ))
    }

    /// `stream` to an endpoint of `service`: over mutual TLS when the
    /// endpoint takes it ([`Targets`]) and this agent has a certificate,
    /// else as it is. A TLS peer must name `service`.
    pub(crate) async fn connect(
        &self,
        stream: TcpStream,
        authority: &Authority,
        service: Option<&str>,
        alpn: Alpn,
    ) -> io::Result<Stream> {
        let Some(service) = service else {
            return Ok(Stream::Plain(stream));
        };
        let Some(client) = self
            .ready()
            .await
            .and_then(|b| b.client.as_ref().map(|c| c[alpn as usize].clone()))
        else {
            return Ok(Stream::Plain(stream));
        };
        let failed = |error: String| {
            self.counts.outbound_failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%authority, service, %error, "mutual TLS to an agent failed");
            io::Error::other(error)
        };
        let connector = tokio_rustls::TlsConnector::from(client);
        let name = match authority
            .host()
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
        {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(authority.host().to_owned())
                .map_err(|e| failed(format!("`{authority}` is not a server name: {e}")))?,
        };
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, stream))
            .await
            .map_err(|_| failed("the TLS handshake timed out".into()))?
            .map_err(|e| failed(format!("the TLS handshake failed: {e}")))?;
        let named = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| gov_proto::spiffe::certificate_service(c));
        match named {
            Some(Ok(named)) if named == service => {
                self.counts.outbound.fetch_add(1, Ordering::Relaxed);
                Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(tls))))
            }
            Some(Ok(named)) => Err(failed(format!(
                "the endpoint's certificate names service `{named}`, not `{service}`"
            ))),
            Some(Err(error)) => Err(failed(error)),
            None => Err(failed("the endpoint presented no certificate".into())),
        }
    }
}

/// The inbound listener's certificates: the ingress one (`--inbound-tls-cert`)
/// for a client that names a server (SNI), the agent's to the others
/// (agents call by address and name none).
#[derive(Debug)]
struct ByName {
    agent: Arc<rustls::sign::CertifiedKey>,
    ingress: Option<Arc<rustls::sign::CertifiedKey>>,
}

impl rustls::server::ResolvesServerCert for ByName {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        match (&self.ingress, hello.server_name()) {
            (Some(ingress), Some(_)) => Some(ingress.clone()),
            _ => Some(self.agent.clone()),
        }
    }
}

/// The answer to a plain request on a listener that requires mutual TLS.
async fn refuse_plain(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt as _;
    const BODY: &str = "gov-agent: this listener requires mutual TLS between agents (--inbound-mtls require): call it through your own gov-agent\n";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    // Then read what the client sent (bounded) before closing: closing with
    // its request unread would reset the connection before it reads this.
    let answer = async {
        use tokio::io::AsyncReadExt as _;
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0_u8; 4096];
        let mut left = 64 * 1024_usize;
        while left > 0 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => left = left.saturating_sub(n),
            }
        }
        Ok::<_, io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}
