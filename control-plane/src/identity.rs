//! govd's identity service (`--identity-ca CERT,KEY`), the way Linkerd's
//! identity controller works: an agent that holds its service's agent
//! token sends a certificate signing request (`Certify`), and govd answers
//! with a short-lived certificate for the agent's key whose SPIFFE ID names
//! the service and the instance:
//! `spiffe://TRUST-DOMAIN/instance/INSTANCE/service/SERVICE`, the one form
//! [`gov_proto::spiffe::spiffe_service`] reads. The agent then connects with it
//! (govd trusts the identity CA for agents' client certificates) and renews
//! it at two thirds of its life.
//!
//! govd decides what the certificate says: the service is the CSR's
//! subject CN, and must be one the token names; the names the CSR asks for
//! are ignored. Every certificate issued, and every CSR refused for naming
//! another service, is audited.

use std::path::Path;
use std::time::Duration;

/// How long a certificate lives unless `--identity-lifetime` says otherwise.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// The SPIFFE trust domain unless `--identity-trust-domain` says otherwise.
pub const DEFAULT_TRUST_DOMAIN: &str = "gov.local";
/// A certificate is valid from this long before it is issued, so that an
/// agent whose clock is a little behind govd's can use it at once.
const BACKDATE: Duration = Duration::from_secs(60);
/// The longest instance name a certificate names.
const MAX_INSTANCE_BYTES: usize = 200;

/// An identity CA that cannot be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum IdentityError {
    #[error("cannot read the identity CA {what} `{path}`")]
    #[diagnostic(
        code(gov::govd::identity_read),
        help("check the paths of --identity-ca CERT,KEY and that govd's user may read them")
    )]
    Read {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("the identity CA `{path}` cannot sign: {reason}")]
    #[diagnostic(
        code(gov::govd::identity_ca),
        help(
            "give --identity-ca the CA's certificate and its private key, both PEM (the key PKCS#8), the certificate a CA's (basic constraints CA:TRUE)"
        )
    )]
    Ca { path: String, reason: String },

    #[error("`{domain}` is not a SPIFFE trust domain")]
    #[diagnostic(
        code(gov::govd::trust_domain),
        help("use lowercase letters, digits, `.`, `-` and `_`, as in `prod.example`")
    )]
    TrustDomain { domain: String },
}

/// What govd signs agents' certificates with.
pub struct Issuer {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA certificate: the end of every chain, and a root govd trusts
    /// for agents' client certificates.
    ca_pem: String,
    trust_domain: String,
    pub(crate) lifetime: Duration,
}

/// A certificate issued to an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The certificate, then the CA's (PEM).
    pub chain_pem: String,
    pub spiffe_id: String,
    pub not_after_unix_ms: u64,
}

/// What a CSR asks for, once its signature is checked.
#[derive(Debug)]
pub(crate) struct Csr {
    /// The subject CN: the service the agent says it is.
    pub(crate) service: String,
    public_key: rcgen::PublicKey,
}

// === impl Issuer ===

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Issuer")
            .field("trust_domain", &self.trust_domain)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// Reads the CA certificate and key (PEM files).
    pub fn read(
        cert: &Path,
        key: &Path,
        trust_domain: &str,
        lifetime: Duration,
    ) -> Result<Self, IdentityError> {
        let read = |what, path: &Path| {
            std::fs::read_to_string(path).map_err(|source| IdentityError::Read {
                what,
                path: path.display().to_string(),
                source,
            })
        };
        let (ca_pem, key_pem) = (read("certificate", cert)?, read("key", key)?);
        Self::from_pem(&ca_pem, &key_pem, trust_domain, lifetime).map_err(|reason| match reason {
            Refusal::TrustDomain => IdentityError::TrustDomain {
                domain: trust_domain.to_owned(),
            },
            Refusal::Ca(reason) => IdentityError::Ca {
                path: cert.display().to_string(),
                reason,
            },
        })
    }

    fn from_pem(
        ca_pem: &str,
        key_pem: &str,
        trust_domain: &str,
        lifetime: Duration,
    ) -> Result<Self, Refusal> {
        let valid_domain = !trust_domain.is_empty()
            && trust_domain
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c));
        if !valid_domain {
            return Err(Refusal::TrustDomain);
        }
        let ca = |reason: String| Refusal::Ca(reason);
        let key = rcgen::KeyPair::from_pem(key_pem)
            .map_err(|e| ca(format!("the key is not a PKCS#8 PEM private key ({e})")))?;
        let der = first_certificate(ca_pem).ok_or_else(|| ca("no certificate in it".into()))?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| ca(format!("the certificate cannot be parsed ({e})")))?;
        if !cert.is_ca() {
            return Err(ca("the certificate is not a CA's".into()));
        }
        if cert.tbs_certificate.subject_pki.raw
            != rcgen::PublicKeyData::subject_public_key_info(&key)
        {
            return Err(ca("the key does not go with the certificate".into()));
        }
        let issuer = rcgen::Issuer::from_ca_cert_der(&der.clone().into(), key)
            .map_err(|e| ca(format!("the certificate cannot be used to sign ({e})")))?;
        Ok(Self {
            issuer,
            ca_pem: ca_pem.to_owned(),
            trust_domain: trust_domain.to_owned(),
            lifetime,
        })
    }

    /// The CA certificate (PEM), for the roots of agents' certificates.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The SPIFFE ID of `instance` of `service`, in the form
    /// [`gov_proto::spiffe::spiffe_service`] reads (checked here). An instance
    /// name is one path segment: characters a SPIFFE ID does not allow
    /// (`@`, `:`, ...) become `_`.
    pub fn spiffe_id(&self, service: &str, instance: &str) -> Result<String, String> {
        if instance.is_empty() || instance.len() > MAX_INSTANCE_BYTES {
            return Err(format!(
                "the instance name must be 1 to {MAX_INSTANCE_BYTES} bytes"
            ));
        }
        let segment: String = instance
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = format!("{}/instance/{segment}/service/{service}", self.trust_domain);
        let id = format!("spiffe://{path}");
        match gov_proto::spiffe::spiffe_service(&id, &path) {
            Ok(named) if named == service => Ok(id),
            Ok(_) => Err(format!("`{id}` would name another service")),
            Err(reason) => Err(reason),
        }
    }

    /// A certificate for `csr`'s key, naming `service` and `instance`,
    /// valid from a minute before `now_unix_ms` for the lifetime.
    pub(crate) fn issue(
        &self,
        csr: &Csr,
        instance: &str,
        now_unix_ms: u64,
    ) -> Result<Issued, String> {
        let spiffe_id = self.spiffe_id(&csr.service, instance)?;
        let now = i64::try_from(now_unix_ms / 1000).map_err(|e| e.to_string())?;
        let backdate = i64::try_from(BACKDATE.as_secs()).map_err(|e| e.to_string())?;
        let lifetime = i64::try_from(self.lifetime.as_secs().max(1)).map_err(|e| e.to_string())?;
        let at =
            |secs: i64| time::OffsetDateTime::from_unix_timestamp(secs).map_err(|e| e.to_string());
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, csr.service.as_str());
        let uri =
            rcgen::string::Ia5String::try_from(spiffe_id.as_str()).map_err(|e| e.to_string())?;
        params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        // Client: to govd and, later, to other agents; server: to other agents.
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        ];
        params.not_before = at(now - backdate)?;
        params.not_after = at(now + lifetime)?;
        let mut serial: [u8; 16] = rand::random();
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|e| format!("cannot sign: {e}"))?;
        let not_after = u64::try_from(now + lifetime).map_err(|e| e.to_string())?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.ca_pem),
            spiffe_id,
            not_after_unix_ms: not_after.saturating_mul(1000),
        })
    }
}

/// Why an identity CA cannot be used.
enum Refusal {
    TrustDomain,
    Ca(String),
}

/// The DER of the first `CERTIFICATE` block of `pem`.
fn first_certificate(pem: &str) -> Option<Vec<u8>> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    (block.label == "CERTIFICATE").then_some(block.contents)
}

// === impl Csr ===

impl Csr {
    /// Parses `der` and checks its signature (the agent holds the key).
    pub(crate) fn parse(der: &[u8]) -> Result<Self, String> {
        use x509_parser::prelude::FromDer as _;
        let (_, request) =
            x509_parser::certification_request::X509CertificationRequest::from_der(der)
                .map_err(|e| format!("the CSR cannot be parsed: {e}"))?;
        let service = request
            .certification_request_info
            .subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned)
            .ok_or("the CSR's subject names no service (CN=SERVICE)")?;
        let params = rcgen::CertificateSigningRequestParams::from_der(&der.to_vec().into())
            .map_err(|e| format!("the CSR is refused: {e}"))?;
        Ok(Self {
            service,
            public_key: params.public_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "identity CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn csr(cn: &str, sans: Vec<String>) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(sans).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        params.serialize_request(&key).unwrap().der().to_vec()
    }

    fn issuer() -> Issuer {
        let (cert, key) = ca();
        Issuer::from_pem(&cert, &key, "prod.example", Duration::from_secs(6))
            .ok()
            .unwrap()
    }

    #[test]
    fn a_certificate_names_its_service_and_instance_and_nothing_the_csr_asked() {
        let issuer = issuer();
        let asked = csr(
            "order",
            vec!["spiffe://evil/service/crm".into(), "crm".into()],
        );
        let csr = Csr::parse(&asked).unwrap();
        let now = 1_700_000_000_000;
        let issued = issuer.issue(&csr, "order@10.0.0.1:8080", now).unwrap();
        assert_eq!(
            issued.spiffe_id,
            "spiffe://prod.example/instance/order_10.0.0.1_8080/service/order"
        );
        assert_eq!(issued.not_after_unix_ms, now + 6_000);
        let der = first_certificate(&issued.chain_pem).unwrap();
        assert_eq!(
            gov_proto::spiffe::certificate_service(&der).unwrap(),
            "order"
        );
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let sans = cert.subject_alternative_name().unwrap().unwrap();
        assert_eq!(sans.value.general_names.len(), 1, "{sans:?}");
        assert_eq!(cert.validity().not_before.timestamp(), 1_700_000_000 - 60);
        assert!(!cert.is_ca());
        // The chain ends with the CA.
        assert!(issued.chain_pem.ends_with(issuer.ca_pem()));
    }

    #[test]
    fn a_bad_csr_or_instance_or_ca_is_refused_with_the_reason() {
        let issuer = issuer();
        assert!(
            Csr::parse(b"not a csr")
                .unwrap_err()
                .contains("cannot be parsed")
        );
        let mut tampered = csr("order", Vec::new());
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(Csr::parse(&tampered).is_err());
        let order = Csr::parse(&csr("order", Vec::new())).unwrap();
        assert!(issuer.issue(&order, "", 0).unwrap_err().contains("1 to"));
        assert!(issuer.issue(&order, "service", 0).is_err());
        let dotted = Csr::parse(&csr("or.der", Vec::new())).unwrap();
        assert!(issuer.issue(&dotted, "i", 0).is_err());
        let (cert, _) = ca();
        let (_, other_key) = ca();
        assert!(matches!(
            Issuer::from_pem(&cert, &other_key, "d", DEFAULT_LIFETIME),
            Err(Refusal::Ca(reason)) if reason.contains("does not go with")
        ));
        let (cert, key) = ca();
        assert!(matches!(
            Issuer::from_pem(&cert, &key, "Prod/x", DEFAULT_LIFETIME),
            Err(Refusal::TrustDomain)
        ));
    }
}
