//! What a certificate says an agent is: the service named by its SPIFFE
//! URI SAN, in one strict form, else by its subject CN. Pure parsing (no
//! tokens, no I/O): govd checks agents with it and the certificates it
//! issues; an agent checks the agents that call it and that it calls
//! (mutual TLS between agents).

/// The service a client certificate (DER) names: the `NAME` of a SPIFFE
/// URI SAN (see [`spiffe_service`]), else its subject CN.
pub fn certificate_service(der: &[u8]) -> Result<String, String> {
    certificate_identity(der).map(|id| id.service)
}

/// What a certificate names: its service, and its SPIFFE ID when it has
/// one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateIdentity {
    pub service: String,
    /// The SPIFFE URI SAN (empty: the service came from the CN).
    pub spiffe_id: String,
}

impl CertificateIdentity {
    /// The instance a govd-issued SPIFFE ID names
    /// (`.../instance/INSTANCE/service/NAME`), if it names one.
    pub fn instance(&self) -> Option<&str> {
        let path = self.spiffe_id.strip_prefix("spiffe://")?;
        let mut segments = path.split('/').skip(1);
        while let Some(segment) = segments.next() {
            if segment == "instance" {
                return segments.next();
            }
        }
        None
    }
}

/// The service (see [`certificate_service`]) and SPIFFE ID of a
/// certificate (DER).
pub fn certificate_identity(der: &[u8]) -> Result<CertificateIdentity, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("the client certificate cannot be parsed: {e}"))?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name
                && let Some(path) = uri.strip_prefix("spiffe://")
            {
                return Ok(CertificateIdentity {
                    service: spiffe_service(uri, path)?,
                    spiffe_id: (*uri).to_owned(),
                });
            }
        }
    }
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    match cn {
        Some(cn) if !cn.is_empty() => Ok(CertificateIdentity {
            service: cn,
            spiffe_id: String::new(),
        }),
        _ => Err(
            "the client certificate names no service (no `spiffe://.../service/NAME` URI SAN, no CN)"
                .into(),
        ),
    }
}

/// The service of the SPIFFE ID `uri` (`path` is what follows
/// `spiffe://`), in its one accepted form:
/// `spiffe://TRUST-DOMAIN/[SEGMENT/...]service/NAME` (for example
/// `spiffe://prod.example/ns/shop/sa/order/service/order`): `service/NAME`
/// ends the path and appears once. Anything ambiguous is refused: two
/// `service` segments, an empty segment (`//`, a trailing `/`), `.` or
/// `..`, a query, a fragment or a percent escape (SPIFFE IDs have none), a
/// `NAME` that is not a service name.
pub fn spiffe_service(uri: &str, path: &str) -> Result<String, String> {
    let refuse = |why: &str| {
        Err(format!(
            "the client certificate's SPIFFE ID `{}` {why} (expected `spiffe://TRUST-DOMAIN/.../service/NAME`, with `service/` once, at the end)",
            crate::printable::printable(uri)
        ))
    };
    if path.contains(['?', '#', '%']) {
        return refuse("has a query, a fragment or a percent escape");
    }
    let segments: Vec<&str> = path.split('/').collect();
    if segments
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return refuse("has an empty, `.` or `..` segment");
    }
    let services = segments.iter().skip(1).filter(|s| **s == "service").count();
    match segments.as_slice() {
        [_, .., "service", name] if services == 1 => {
            let valid = name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if valid {
                Ok((*name).to_owned())
            } else {
                refuse("names a service that is not a service name")
            }
        }
        _ if services > 1 => refuse("names `service/` more than once"),
        _ => refuse("names no service at its end"),
    }
}
