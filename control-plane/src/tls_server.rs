//! govd's TLS, with the handshake done here (tokio-rustls) rather than
//! inside tonic, so that a client certificate refused at the handshake
//! (expired, not yet valid, signed by a CA govd does not trust) is logged,
//! counted and audited with the address it came from and the identity it
//! claimed. tonic serves the finished streams: its `Connected` impl for
//! them gives calls their `peer_certs()` and `remote_addr()` as before.
//!
//! Each connection gets its own rustls config around shared parts (the
//! server's key, the verifier of agents' certificates): the verifier is
//! wrapped in one that keeps what it refused for the connection's task,
//! which knows the peer address. A refusal is handed to [`OnRefused`]; the
//! rate of audit records is bounded by [`Refusals`].

use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// At most this many refused certificates are audited one by one per
/// [`AUDIT_WINDOW`]; the rest are counted and summed up in the next record.
pub const AUDITED_PER_WINDOW: u32 = 10;
pub const AUDIT_WINDOW: Duration = Duration::from_secs(60);

/// TLS settings govd cannot serve.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TlsConfigError {
    #[error("the {what} is not usable PEM: {reason}")]
    #[diagnostic(
        code(gov::govd::tls),
        help(
            "--tls-cert and --tls-key must be the PEM certificate (chain, leaf first) and its private key (PKCS#8, or RSA PKCS#1, or SEC1 EC); --tls-client-ca and --identity-ca PEM CA certificates"
        )
    )]
    Pem { what: &'static str, reason: String },

    #[error("--tls-key does not go with --tls-cert, or cannot be used")]
    #[diagnostic(
        code(gov::govd::tls_key),
        help("give the private key of the first certificate of --tls-cert")
    )]
    Key(#[source] rustls::Error),

    #[error("the CA certificates for agents cannot be used: {0}")]
    #[diagnostic(
        code(gov::govd::tls_client_ca),
        help("--tls-client-ca (and --identity-ca) must hold CA certificates (PEM)")
    )]
    Roots(String),
}

/// A client certificate refused at the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub peer: Option<SocketAddr>,
    /// `expired`, `not_yet_valid`, `unknown_issuer`, `bad_signature` or
    /// `invalid`.
    pub reason: &'static str,
    /// What the certificate claims (its SPIFFE ID or CN) and when it
    /// expires, escaped for printing.
    pub claimed: String,
    /// rustls's words.
    pub detail: String,
}

/// Told of every refused certificate.
pub type OnRefused = Arc<dyn Fn(Refused) + Send + Sync>;

/// What govd serves TLS with: its certificate and key, and the CAs whose
/// client certificates it takes (optional at the handshake: people
/// authenticate with tokens; `Connect` requires a certificate where it must).
#[derive(Clone)]
pub struct ServerTls {
    provider: Arc<CryptoProvider>,
    key: Arc<CertifiedKey>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    pub handshake_timeout: Duration,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("client_certificates", &self.verifier.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// From PEM: the certificate chain, its key, and the CAs of agents'
    /// certificates (empty: none asked for).
    pub fn from_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        client_roots_pem: &[u8],
    ) -> Result<Self, TlsConfigError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates("certificate (--tls-cert)", cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsConfigError::Pem {
            what: "private key (--tls-key)",
            reason: e.to_string(),
        })?;
        let key = CertifiedKey::from_der(chain, key, &provider).map_err(TlsConfigError::Key)?;
        let verifier = if client_roots_pem.is_empty() {
            None
        } else {
            let mut roots = RootCertStore::empty();
            for ca in certificates("client CA", client_roots_pem)? {
                roots
                    .add(ca)
                    .map_err(|e| TlsConfigError::Roots(e.to_string()))?;
            }
            Some(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| TlsConfigError::Roots(e.to_string()))?,
            )
        };
        Ok(Self {
            provider,
            key: Arc::new(key),
            verifier,
            handshake_timeout: Duration::from_secs(10),
        })
    }

    /// The rustls config of one connection; a certificate its verifier
    /// refuses is kept in `refused`.
    fn config(&self, refused: &Arc<Mutex<Option<Refused>>>) -> Result<ServerConfig, rustls::Error> {
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.verifier {
            Some(inner) => builder.with_client_cert_verifier(Arc::new(Recording {
                inner: inner.clone(),
                refused: refused.clone(),
            })),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::new(Fixed(self.key.clone())));
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// `incoming` with the TLS handshake done, each on its own task (a slow
    /// one holds up no other) within `handshake_timeout`. Connections whose
    /// handshake fails are closed; a refused certificate goes to
    /// `on_refused`. Stops accepting when the returned stream is dropped.
    pub fn accept<S, IO>(
        self,
        incoming: S,
        on_refused: OnRefused,
    ) -> impl Stream<Item = io::Result<TlsStream<IO>>> + Send + 'static
    where
        S: Stream<Item = io::Result<IO>> + Send + 'static,
        IO: AsyncRead
            + AsyncWrite
            + Connected<ConnectInfo = TcpConnectInfo>
            + Unpin
            + Send
            + 'static,
    {
        let (tx, rx) = mpsc::channel(64);
        let this = Arc::new(self);
        tokio::spawn(async move {
            let mut incoming = pin!(incoming);
            loop {
                let next = tokio::select! {
                    next = incoming.next() => next,
                    () = tx.closed() => break,
                };
                match next {
                    None => break,
                    Some(Err(error)) => {
                        if tx.send(Err(error)).await.is_err() {
                            break;
                        }
                    }
                    Some(Ok(stream)) => {
                        let (this, tx, on_refused) = (this.clone(), tx.clone(), on_refused.clone());
                        tokio::spawn(async move {
                            if let Some(tls) = this.handshake(stream, &on_refused).await {
                                let _ = tx.send(Ok(tls)).await;
                            }
                        });
                    }
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    async fn handshake<IO>(&self, stream: IO, on_refused: &OnRefused) -> Option<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Connected<ConnectInfo = TcpConnectInfo> + Unpin,
    {
        let peer = stream.connect_info().remote_addr();
        let refused = Arc::new(Mutex::new(None));
        let config = match self.config(&refused) {
            Ok(config) => Arc::new(config),
            Err(error) => {
                tracing::error!(%error, "cannot make a TLS config; closing the connection");
                return None;
            }
        };
        let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
        match tokio::time::timeout(self.handshake_timeout, accept).await {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(error)) => {
                let taken = refused.lock().unwrap_or_else(|e| e.into_inner()).take();
                match taken {
                    Some(mut refusal) => {
                        refusal.peer = peer;
                        on_refused(refusal);
                    }
                    None => tracing::debug!(?peer, %error, "TLS handshake failed"),
                }
                None
            }
            Err(_) => {
                tracing::debug!(?peer, timeout = ?self.handshake_timeout, "TLS handshake timed out");
                None
            }
        }
    }
}

/// Every certificate in `pem`, at least one.
fn certificates(
    what: &'static str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsConfigError::Pem {
            what,
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsConfigError::Pem {
            what,
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// The server's one certificate, whatever the client asks for.
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The agents' verifier, keeping what it refuses for the connection's task.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn ClientCertVerifier>,
    refused: Arc<Mutex<Option<Refused>>>,
}

impl ClientCertVerifier for Recording {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|error| {
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(Refused {
                    peer: None,
                    reason: reason(error),
                    claimed: claimed(end_entity),
                    detail: error.to_string(),
                });
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A short label of why a certificate was refused.
fn reason(error: &rustls::Error) -> &'static str {
    match error {
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "expired",
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
        ) => "not_yet_valid",
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => "unknown_issuer",
        // A CA of the same name that did not sign it.
        rustls::Error::InvalidCertificate(CertificateError::BadSignature) => "bad_signature",
        _ => "invalid",
    }
}

/// What `der` claims to be: its URI SANs (a SPIFFE ID) or else its CN, and
/// its not-after, escaped for printing (it comes from anyone).
fn claimed(der: &CertificateDer<'_>) -> String {
    use x509_parser::prelude::*;
    let Ok((_, cert)) = X509Certificate::from_der(der.as_ref()) else {
        return "a certificate that does not parse".into();
    };
    let uris: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(uri) => Some((*uri).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let name = match uris.first() {
        Some(_) => uris.join(" "),
        None => cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map_or_else(|| "no name".to_owned(), |cn| format!("CN={cn}")),
    };
    let not_after = cert.validity().not_after.to_string();
    let name = gov_proto::printable::printable(&name);
    let name: String = name.chars().take(256).collect();
    format!("{name} (not after {not_after})")
}

/// Bounds the audit records of refused certificates: at most
/// [`AUDITED_PER_WINDOW`] per [`AUDIT_WINDOW`], the rest counted and named
/// in the next record audited.
#[derive(Debug)]
pub struct Refusals {
    window_started: Option<tokio::time::Instant>,
    audited: u32,
    unaudited: u64,
}

impl Default for Refusals {
    fn default() -> Self {
        Self::new()
    }
}

impl Refusals {
    pub fn new() -> Self {
        Self {
            window_started: None,
            audited: 0,
            unaudited: 0,
        }
    }

    /// Whether to audit this refusal now and, if so, how many earlier ones
    /// went unaudited.
    pub fn admit(&mut self) -> Option<u64> {
        let now = tokio::time::Instant::now();
        if self
            .window_started
            .is_none_or(|started| now.duration_since(started) >= AUDIT_WINDOW)
        {
            self.window_started = Some(now);
            self.audited = 0;
        }
        if self.audited >= AUDITED_PER_WINDOW {
            self.unaudited += 1;
            return None;
        }
        self.audited += 1;
        Some(std::mem::take(&mut self.unaudited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn refusals_are_audited_at_a_bounded_rate_and_none_is_forgotten() {
        let mut r = Refusals::new();
        for _ in 0..AUDITED_PER_WINDOW {
            assert_eq!(r.admit(), Some(0));
        }
        for _ in 0..500 {
            assert_eq!(r.admit(), None, "a flood is counted, not audited");
        }
        tokio::time::advance(AUDIT_WINDOW).await;
        assert_eq!(r.admit(), Some(500), "the next record names the rest");
        assert_eq!(r.admit(), Some(0));
    }

    #[test]
    fn bad_settings_say_which_file() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["govd".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        let key = key.serialize_pem();
        ServerTls::from_pem(cert.as_bytes(), key.as_bytes(), b"").unwrap();
        let other = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert!(matches!(
            ServerTls::from_pem(cert.as_bytes(), other.as_bytes(), b""),
            Err(TlsConfigError::Key(_))
        ));
        assert!(matches!(
            ServerTls::from_pem(b"junk", key.as_bytes(), b""),
            Err(TlsConfigError::Pem {
                what: "certificate (--tls-cert)",
                ..
            })
        ));
        assert!(matches!(
            ServerTls::from_pem(cert.as_bytes(), key.as_bytes(), b"junk"),
            Err(TlsConfigError::Pem {
                what: "client CA",
                ..
            })
        ));
    }
}
