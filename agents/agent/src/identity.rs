//! The agent's certificate: issued by govd (`--identity`), or the
//! platform's files (`--tls-cert`/`--tls-key` from cert-manager or SPIRE),
//! re-read when they change.
//!
//! With `--identity` the agent makes its key in memory (it never touches
//! the disk), sends govd a CSR with its service's agent token (`Certify`),
//! and renews at two thirds of the certificate's life, as Linkerd's proxy
//! does. A renewal that fails is retried with backoff and logged; the
//! certificate in force stays until a new one arrives. [`Credentials`]
//! holds the certificate in force: each new connection to govd takes the
//! latest one, a stream already open keeps going on the old one, and the
//! proxy's calls never wait on any of it. Inter-agent mutual TLS reads the
//! same [`Credentials`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as proto;
use gov_proto::v1::control_plane_client::ControlPlaneClient;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::control::backoff::Backoff;

/// How often `--tls-cert`/`--tls-key` are read for a change. Reading two
/// small files is cheap, and it sees a Kubernetes secret volume's symlink
/// swap, which a file watch on the old target can miss.
pub const FILE_POLL: Duration = Duration::from_secs(2);

/// A certificate and its key, as the agent presents them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The certificate chain, leaf first (PEM).
    pub chain_pem: String,
    /// Its private key (PKCS#8 PEM).
    pub key_pem: String,
    /// When the leaf expires (0: unknown).
    pub not_after_unix_ms: u64,
    /// Issued by govd: the SPIFFE ID it names (else empty).
    pub spiffe_id: String,
}

/// The certificate in force (cheap to clone): the latest one issued or
/// read, `None` until the first.
#[derive(Clone, Debug)]
pub struct Credentials(watch::Receiver<Option<Arc<Credential>>>);

/// What happened to the agent's certificate, for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateEvent {
    /// A certificate is in force, valid until then (unix ms; 0: unknown).
    InForce { not_after_unix_ms: u64 },
    /// A request for one (or a reload) failed.
    Failed,
}

/// Told of each [`CertificateEvent`].
pub type OnCertificate = Arc<dyn Fn(CertificateEvent) + Send + Sync>;

/// How to get certificates from govd.
#[derive(Clone)]
pub struct IdentityOptions {
    /// The control plane URL list (as `--control-plane`): each retry tries
    /// the next.
    pub url: String,
    pub service: String,
    /// Named in the certificate's SPIFFE ID.
    pub instance: String,
    /// The service's agent token, which `Certify` needs.
    pub token: String,
    /// TLS to govd: its CA (no client certificate is needed to ask).
    pub tls: gov_common::tls::ClientTls,
    /// Retries of a failed request.
    pub backoff: Backoff,
    pub on_certificate: Option<OnCertificate>,
}

/// Why the agent has no certificate from govd.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum IdentityError {
    #[error("cannot make this agent's key or CSR: {0}")]
    #[diagnostic(code(gov::agent::identity_key))]
    Key(String),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Url(#[from] gov_common::tls::TlsError),
    #[error("cannot reach the control plane at `{url}` for a certificate: {reason}")]
    #[diagnostic(
        code(gov::agent::identity_connect),
        help("the agent retries with backoff; its current certificate stays in use")
    )]
    Connect { url: String, reason: String },
    #[error("the control plane refused a certificate: {0}")]
    #[diagnostic(
        code(gov::agent::identity_refused),
        help(
            "check --control-plane-token-file (the token of govd's `agent` line for this --service) and that govd runs with --identity-ca"
        )
    )]
    Refused(tonic::Status),
}

// === impl Credential ===

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Credential")
            .field("not_after_unix_ms", &self.not_after_unix_ms)
            .field("spiffe_id", &self.spiffe_id)
            .finish_non_exhaustive()
    }
}

// === impl Credentials ===

impl Credentials {
    /// The certificate in force now.
    pub fn current(&self) -> Option<Arc<Credential>> {
        self.0.borrow().clone()
    }

    /// The certificate in force, waiting for the first; `None` when
    /// `shutdown` comes first (or nothing will ever provide one).
    pub async fn wait(&self, shutdown: &CancellationToken) -> Option<Arc<Credential>> {
        let mut rx = self.0.clone();
        tokio::select! {
            () = shutdown.cancelled() => None,
            current = rx.wait_for(Option::is_some) => current.ok().and_then(|c| c.clone()),
        }
    }
}

fn notify(on: Option<&OnCertificate>, event: CertificateEvent) {
    if let Some(f) = on {
        f(event);
    }
}

// === issued by govd ===

/// Makes this agent's key and CSR, and keeps a certificate from govd in
/// [`Credentials`] until `shutdown`: the first at once, then renewed at two
/// thirds of each one's life.
pub fn start(
    options: IdentityOptions,
    shutdown: CancellationToken,
) -> Result<Credentials, IdentityError> {
    let key = rcgen::KeyPair::generate().map_err(|e| IdentityError::Key(e.to_string()))?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, options.service.as_str());
    let csr = params
        .serialize_request(&key)
        .map_err(|e| IdentityError::Key(e.to_string()))?
        .der()
        .to_vec();
    let (tx, rx) = watch::channel(None);
    tokio::spawn(keep_issued(options, csr, key.serialize_pem(), tx, shutdown));
    Ok(Credentials(rx))
}

async fn keep_issued(
    mut options: IdentityOptions,
    csr: Vec<u8>,
    key_pem: String,
    tx: watch::Sender<Option<Arc<Credential>>>,
    shutdown: CancellationToken,
) {
    let urls: Vec<String> = crate::control::reach::urls(&options.url)
        .into_iter()
        .map(str::to_owned)
        .collect();
    for attempt in 0.. {
        let url = &urls[attempt % urls.len()];
        let wait = match certify(&options, url, &csr).await {
            Ok(issued) => {
                options.backoff.reset();
                let left = issued
                    .not_after_unix_ms
                    .saturating_sub(crate::control::reach::now_unix_ms());
                let renew_in = Duration::from_millis(left / 3 * 2);
                tracing::info!(spiffe_id = %issued.spiffe_id, not_after_unix_ms = issued.not_after_unix_ms, ?renew_in, "certificate issued by the control plane");
                notify(
                    options.on_certificate.as_ref(),
                    CertificateEvent::InForce {
                        not_after_unix_ms: issued.not_after_unix_ms,
                    },
                );
                tx.send_replace(Some(Arc::new(Credential {
                    chain_pem: issued.cert_chain_pem,
                    key_pem: key_pem.clone(),
                    not_after_unix_ms: issued.not_after_unix_ms,
                    spiffe_id: issued.spiffe_id,
                })));
                renew_in
            }
            Err(error) => {
                notify(options.on_certificate.as_ref(), CertificateEvent::Failed);
                let delay = options.backoff.next_delay();
                tracing::warn!(%error, ?delay, "cannot get a certificate from the control plane; retrying (the certificate in force, if any, stays in use until it expires)");
                delay
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One `Certify` call.
async fn certify(
    options: &IdentityOptions,
    url: &str,
    csr: &[u8],
) -> Result<proto::CertifyResponse, IdentityError> {
    let connect = |e: &dyn std::error::Error| IdentityError::Connect {
        url: url.to_owned(),
        reason: crate::control::reach::chain(e),
    };
    let channel = options
        .tls
        .endpoint(url)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| connect(&e))?;
    let mut request = tonic::Request::new(proto::CertifyRequest {
        csr_der: csr.to_vec(),
        instance: options.instance.clone(),
    });
    let value = format!("Bearer {}", options.token.trim())
        .parse()
        .map_err(|_| {
            IdentityError::Refused(tonic::Status::invalid_argument(
                "the agent token is not a valid header value",
            ))
        })?;
    request.metadata_mut().insert("authorization", value);
    ControlPlaneClient::new(channel)
        .certify(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(IdentityError::Refused)
}

// === the platform's files ===

/// The certificate of `cert` and `key` (PEM files), read now and again
/// every `every` until `shutdown`: a change (cert-manager or SPIRE writing
/// a renewed one) is in force for the next connection. A file that cannot
/// be read, or is not PEM, is logged and the certificate in force kept.
pub fn watch_files(
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    on_certificate: Option<OnCertificate>,
    shutdown: CancellationToken,
) -> Credentials {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let read = read_files(&cert, &key).await;
            let changed = match &read {
                Ok(new) => tx.borrow().as_deref() != Some(new),
                Err(_) => false,
            };
            match read {
                Ok(new) if changed => {
                    let first = tx.borrow().is_none();
                    if !first {
                        tracing::info!(cert = %cert.display(), not_after_unix_ms = new.not_after_unix_ms, "--tls-cert changed: the next connection to the control plane uses the new certificate");
                    }
                    notify(
                        on_certificate.as_ref(),
                        CertificateEvent::InForce {
                            not_after_unix_ms: new.not_after_unix_ms,
                        },
                    );
                    tx.send_replace(Some(Arc::new(new)));
                }
                Ok(_) => {}
                Err(reason) => {
                    notify(on_certificate.as_ref(), CertificateEvent::Failed);
                    tracing::warn!(%reason, "cannot reload --tls-cert/--tls-key; keeping the certificate in force");
                }
            }
        }
    });
    Credentials(rx)
}

async fn read_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Credential, String> {
    let read = async |path: &std::path::Path| {
        let text = tokio::fs::read_to_string(path)
            .await
            .map_err(|e| format!("`{}`: {e}", path.display()))?;
        if text.contains("-----BEGIN") {
            Ok(text)
        } else {
            Err(format!("`{}` is not PEM", path.display()))
        }
    };
    let chain_pem = read(cert).await?;
    let key_pem = read(key).await?;
    Ok(Credential {
        not_after_unix_ms: not_after(&chain_pem).unwrap_or(0),
        chain_pem,
        key_pem,
        spiffe_id: String::new(),
    })
}

/// When the first certificate of `pem` expires (unix ms).
fn not_after(pem: &str) -> Option<u64> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).ok()?;
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some(secs.saturating_mul(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(cn: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec![cn.to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2040, 1, 2);
        let key = rcgen::KeyPair::generate().unwrap();
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    #[tokio::test]
    async fn changed_certificate_files_are_in_force_for_the_next_connection() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, k1) = self_signed("one");
        std::fs::write(&cert, &c1).unwrap();
        std::fs::write(&key, &k1).unwrap();
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = events.clone();
        let on: OnCertificate = Arc::new(move |e| seen.lock().unwrap().push(e));
        let shutdown = CancellationToken::new();
        let every = Duration::from_millis(20);
        let creds = watch_files(cert.clone(), key.clone(), every, Some(on), shutdown.clone());
        let first = creds.wait(&shutdown).await.unwrap();
        assert_eq!(first.chain_pem, c1);
        // 2040-01-02T00:00:00Z
        assert_eq!(first.not_after_unix_ms, 2_209_075_200_000);
        // A half-written file is not taken; the certificate in force stays.
        std::fs::write(&cert, "").unwrap();
        tokio::time::sleep(every * 5).await;
        assert_eq!(creds.current().unwrap().chain_pem, c1);
        let (c2, k2) = self_signed("two");
        std::fs::write(&key, &k2).unwrap();
        std::fs::write(&cert, &c2).unwrap();
        let mut rx = creds.0.clone();
        tokio::time::timeout(
            Duration::from_secs(5),
            rx.wait_for(|c| {
                c.as_ref()
                    .is_some_and(|c| c.chain_pem == c2 && c.key_pem == k2)
            }),
        )
        .await
        .unwrap()
        .unwrap();
        let events = events.lock().unwrap();
        assert!(events.contains(&CertificateEvent::Failed), "{events:?}");
        assert!(matches!(
            events.last(),
            Some(CertificateEvent::InForce { .. })
        ));
        shutdown.cancel();
    }
}
