//! TLS for the `ControlPlane` gRPC API, as all three binaries read it: PEM
//! files named by flags (`--tls-ca`, `--tls-cert`, `--tls-key`), and the one
//! rule that keeps a token off the wire in clear text: a TLS setting goes
//! with an `https://` URL and an `https://` URL with a CA.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A TLS file or flag combination that cannot be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TlsError {
    #[error("cannot read the {what} `{path}`")]
    #[diagnostic(
        code(gov::tls::read),
        help("check the path and that this user may read it")
    )]
    Read {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("the {what} `{path}` is not PEM (no `-----BEGIN` line)")]
    #[diagnostic(
        code(gov::tls::not_pem),
        help("give the PEM file (`openssl x509 -inform der -in FILE -out FILE.pem` converts DER)")
    )]
    NotPem { what: &'static str, path: String },

    #[error("--tls-cert and --tls-key go together: {missing} is missing")]
    #[diagnostic(code(gov::tls::half_identity))]
    HalfIdentity { missing: &'static str },

    #[error("`{url}` is plain HTTP, but TLS files were given")]
    #[diagnostic(
        code(gov::tls::http_url),
        help(
            "use `https://` in the control plane URL: with `http://` the token would travel in clear text"
        )
    )]
    HttpWithTls { url: String },

    #[error("`{url}` is HTTPS, but no CA to check govd's certificate was given")]
    #[diagnostic(
        code(gov::tls::no_ca),
        help("pass --tls-ca FILE (the CA that signed govd's --tls-cert)")
    )]
    HttpsWithoutCa { url: String },

    #[error("`{url}` is not an `http://` or `https://` URL")]
    #[diagnostic(
        code(gov::tls::url),
        help("write it as `https://HOST:PORT` or `http://HOST:PORT`")
    )]
    Scheme { url: String },

    #[error("`{url}` is not a valid URL")]
    #[diagnostic(
        code(gov::tls::url),
        help("write it as `https://HOST:PORT` or `http://HOST:PORT`")
    )]
    Url {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// The TLS files a client was given.
#[derive(Clone, Debug, Default)]
pub struct ClientTlsFiles {
    /// The CA that signed govd's certificate.
    pub ca: Option<PathBuf>,
    /// The client's own certificate and key (agents, for mutual TLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A client's TLS settings, read from its files.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    config: Option<ClientTlsConfig>,
}

/// Reads a PEM file (`what` names it in errors).
pub fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.display().to_string(),
        source,
    })?;
    if !bytes.windows(10).any(|w| w == b"-----BEGIN") {
        return Err(TlsError::NotPem {
            what,
            path: path.display().to_string(),
        });
    }
    Ok(bytes)
}

/// Reads `cert` and `key` (both or neither).
pub fn read_identity(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<Identity>, TlsError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::HalfIdentity {
            missing: "--tls-key",
        }),
        (None, Some(_)) => Err(TlsError::HalfIdentity {
            missing: "--tls-cert",
        }),
        (Some(cert), Some(key)) => Ok(Some(Identity::from_pem(
            read_pem("certificate", cert)?,
            read_pem("private key", key)?,
        ))),
    }
}

// === impl ClientTls ===

impl ClientTls {
    /// Reads the files; none given: plain HTTP/2.
    pub fn read(files: &ClientTlsFiles) -> Result<Self, TlsError> {
        let identity = read_identity(files.cert.as_deref(), files.key.as_deref())?;
        let ca = files
            .ca
            .as_deref()
            .map(|p| read_pem("CA certificate", p))
            .transpose()?;
        if ca.is_none() && identity.is_none() {
            return Ok(Self::default());
        }
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = ca {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some(identity) = identity {
            config = config.identity(identity);
        }
        Ok(Self {
            config: Some(config),
        })
    }

    /// These settings with `cert_pem` (the chain, leaf first) and `key_pem`
    /// as the client's certificate, in place of any read from files (a
    /// certificate issued by govd, or reloaded files).
    pub fn with_identity(&self, cert_pem: &str, key_pem: &str) -> Self {
        let config = self
            .config
            .clone()
            .unwrap_or_default()
            .identity(Identity::from_pem(cert_pem, key_pem));
        Self {
            config: Some(config),
        }
    }

    /// The endpoint for `url`, refusing a TLS setting on `http://` (the
    /// token would go out in clear text: tonic would silently connect
    /// without TLS) and `https://` without a CA.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, TlsError> {
        let lower = url.trim_start().to_ascii_lowercase();
        let https = lower.starts_with("https://");
        // Without a scheme (`127.0.0.1:7070`) the URL parses as an
        // authority and only fails when connecting, with a transport error
        // that does not say what to write.
        if !https && !lower.starts_with("http://") {
            return Err(TlsError::Scheme {
                url: url.to_owned(),
            });
        }
        let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|source| TlsError::Url {
            url: url.to_owned(),
            source,
        })?;
        match (&self.config, https) {
            (None, false) => Ok(endpoint),
            (Some(_), false) => Err(TlsError::HttpWithTls {
                url: url.to_owned(),
            }),
            (None, true) => Err(TlsError::HttpsWithoutCa {
                url: url.to_owned(),
            }),
            (Some(config), true) => {
                endpoint
                    .tls_config(config.clone())
                    .map_err(|source| TlsError::Url {
                        url: url.to_owned(),
                        source,
                    })
            }
        }
    }
}

/// Whether a call to `url` would cross the network in clear: not
/// `https://`, and a host other than `localhost` or a loopback address
/// (127.0.0.0/8, `::1`). A URL without a scheme counts as `http://`.
pub fn cleartext_to_remote(url: &str) -> bool {
    let rest = match url.split_once("://") {
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => return false,
        Some((_, rest)) => rest,
        None => url,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.split(':').next().unwrap_or(""),
    };
    let loopback = host.trim_end_matches('.').eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback());
    !loopback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_in_clear_only_to_loopback() {
        for remote in [
            "http://10.0.0.1:7070",
            "http://0.0.0.0:7070",
            "http://govd.internal:7070",
            "HTTP://govd.internal",
            "http://[2001:db8::1]:7070/",
            "http://127.0.0.1.evil.example:7070",
            "http://localhost.evil.example:7070",
            "http://user@10.0.0.1:7070",
            "10.0.0.1:7070",
        ] {
            assert!(cleartext_to_remote(remote), "{remote}");
        }
        for safe in [
            "https://10.0.0.1:7070",
            "HTTPS://govd.internal",
            "http://127.0.0.1:7070",
            "http://127.9.8.7",
            "http://[::1]:7070",
            "http://[::ffff:127.0.0.1]:7070",
            "http://localhost:7070",
            "http://LOCALHOST.:7070/",
            "localhost:7070",
        ] {
            assert!(!cleartext_to_remote(safe), "{safe}");
        }
    }

    #[test]
    fn a_url_needs_the_http_or_https_scheme() {
        let plain = ClientTls::default();
        for url in ["127.0.0.1:7070", "ftp://127.0.0.1:7070", "govd:7070", ""] {
            let err = plain.endpoint(url).unwrap_err();
            assert!(matches!(err, TlsError::Scheme { .. }), "{url}: {err}");
        }
        assert!(plain.endpoint("HTTP://127.0.0.1:7070").is_ok());
    }

    #[test]
    fn tls_goes_with_https_and_https_with_a_ca() {
        let plain = ClientTls::default();
        assert!(plain.endpoint("http://127.0.0.1:7070").is_ok());
        assert!(matches!(
            plain.endpoint("https://127.0.0.1:7070"),
            Err(TlsError::HttpsWithoutCa { .. })
        ));
        let tls = ClientTls {
            config: Some(ClientTlsConfig::new()),
        };
        assert!(matches!(
            tls.endpoint("http://127.0.0.1:7070"),
            Err(TlsError::HttpWithTls { .. })
        ));
        assert!(tls.endpoint("HTTPS://127.0.0.1:7070").is_ok());
        assert!(matches!(
            plain.endpoint("http://not a url"),
            Err(TlsError::Url { .. })
        ));
    }

    #[test]
    fn files_are_checked_before_use() {
        let dir = std::env::temp_dir().join(format!("gov-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let der = dir.join("ca.der");
        std::fs::write(&der, [0x30, 0x82, 0x01]).unwrap();
        let files = ClientTlsFiles {
            ca: Some(der),
            ..Default::default()
        };
        assert!(matches!(
            ClientTls::read(&files),
            Err(TlsError::NotPem { .. })
        ));
        let files = ClientTlsFiles {
            ca: Some(dir.join("missing.pem")),
            ..Default::default()
        };
        assert!(matches!(
            ClientTls::read(&files),
            Err(TlsError::Read { .. })
        ));
        let files = ClientTlsFiles {
            cert: Some(dir.join("c.pem")),
            ..Default::default()
        };
        assert!(matches!(
            ClientTls::read(&files),
            Err(TlsError::HalfIdentity {
                missing: "--tls-key"
            })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
