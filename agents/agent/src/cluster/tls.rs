//! TLS to Redis: the files of `--redis-ca`, `--redis-cert` and `--redis-key`,
//! read once at start into the redis crate's [`redis::TlsCertificates`]
//! (rustls on ring, the stack the rest of the agent uses).

use std::path::PathBuf;

use gov_common::tls::{TlsError, read_pem};

/// TLS files for Redis that cannot be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RedisTlsError {
    #[error("--redis-cert and --redis-key go together: {missing} is missing")]
    #[diagnostic(
        code(gov::agent::redis_tls),
        help("give both (the agent's client certificate and its key, PEM) or neither")
    )]
    HalfIdentity { missing: &'static str },

    #[error(transparent)]
    #[diagnostic(transparent)]
    File(#[from] TlsError),
}

/// The TLS files given for Redis; all optional.
#[derive(Clone, Debug, Default)]
pub struct RedisTlsFiles {
    /// The CA (PEM) that signed the Redis servers' certificates. Unset: the
    /// system's roots.
    pub ca: Option<PathBuf>,
    /// This agent's client certificate (PEM), for servers that ask for one
    /// (`tls-auth-clients yes`); goes with `key`.
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of `cert`.
    pub key: Option<PathBuf>,
}

impl RedisTlsFiles {
    /// Whether any file was given.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Reads the files; `Ok(None)` when none was given.
    pub(super) fn read(&self) -> Result<Option<redis::TlsCertificates>, RedisTlsError> {
        if self.is_empty() {
            return Ok(None);
        }
        let client_tls = match (&self.cert, &self.key) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(RedisTlsError::HalfIdentity {
                    missing: "--redis-key",
                });
            }
            (None, Some(_)) => {
                return Err(RedisTlsError::HalfIdentity {
                    missing: "--redis-cert",
                });
            }
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read_pem("Redis client certificate", cert)?,
                client_key: read_pem("Redis client key", key)?,
            }),
        };
        let root_cert = self
            .ca
            .as_deref()
            .map(|ca| read_pem("Redis CA certificate", ca))
            .transpose()?;
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}
