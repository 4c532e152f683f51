//! TLS to etcd (`--store etcds://...`): the members' CA (`--etcd-ca`) and,
//! for members started with `--client-cert-auth`, this replica's client
//! certificate (`--etcd-cert`, `--etcd-key`), read at connect into tonic's
//! settings (rustls on ring, as govd's own TLS).

use std::path::PathBuf;

use gov_common::tls::read_pem;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::Error;

/// The TLS files given for etcd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    /// The CA (PEM) that signed the members' server certificates.
    pub ca: Option<PathBuf>,
    /// This replica's client certificate (PEM); goes with `key`.
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of `cert`.
    pub key: Option<PathBuf>,
}

impl EtcdTlsFiles {
    /// Whether any file was given.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Checks the combination for a store URL (`tls`: `etcds://`).
    pub(super) fn check(&self, tls: bool) -> Result<(), Error> {
        let problem = if !tls && !self.is_empty() {
            "--etcd-ca, --etcd-cert and --etcd-key are for `etcds://`, but --store is `etcd://` (plain)"
        } else if tls && self.ca.is_none() {
            "`etcds://` needs --etcd-ca, the CA that signed the members' certificates"
        } else if self.cert.is_some() != self.key.is_some() {
            "--etcd-cert and --etcd-key go together"
        } else {
            return Ok(());
        };
        Err(Error::EtcdTls {
            problem: problem.to_owned(),
        })
    }

    /// tonic's TLS settings from the files.
    pub(super) fn read(&self) -> Result<ClientTlsConfig, Error> {
        let mut options = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            options =
                options.ca_certificate(Certificate::from_pem(read_pem("etcd CA certificate", ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            let pem = read_pem("etcd client certificate", cert)?;
            if let Some(version) = old_version(&pem) {
                return Err(Error::EtcdTls {
                    problem: format!(
                        "the etcd client certificate `{}` is X.509 v{version}: rustls takes v3 only \
                         (`openssl x509 -req` makes v3 when given -extfile, e.g. with \
                         `extendedKeyUsage=clientAuth`)",
                        cert.display()
                    ),
                });
            }
            options = options.identity(Identity::from_pem(pem, read_pem("etcd client key", key)?));
        }
        Ok(options)
    }
}

/// The version of the first certificate in `pem` when it is older than v3
/// (tonic's rustls refuses such a client certificate with nothing but
/// "transport error"); `None` for v3 or what it cannot read (left to tonic).
fn old_version(pem: &[u8]) -> Option<u32> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = block.parse_x509().ok()?;
    let version = cert.version().0;
    (version < 2).then_some(version + 1)
}
