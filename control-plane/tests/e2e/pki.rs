//! Throwaway certificates for govd and agents (rcgen).

use super::*;

/// Throwaway certificates: a CA, govd's certificate for 127.0.0.1, and
/// agent certificates, as PEM files in one directory.
#[derive(Clone)]
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub issuer: Arc<rcgen::CertifiedIssuer<'static, rcgen::KeyPair>>,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "gov e2e CA");
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, issuer.pem()).unwrap();
        let mut pki = Pki {
            dir: dir.to_owned(),
            ca,
            server_cert: PathBuf::new(),
            server_key: PathBuf::new(),
            issuer: Arc::new(issuer),
        };
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        (pki.server_cert, pki.server_key) = pki.sign("govd", params);
        pki
    }

    /// A certificate and key signed by the CA, as (cert, key) files.
    pub fn sign(&self, name: &str, params: rcgen::CertificateParams) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// An agent certificate: a SPIFFE ID for `service`, or only CN=`service`.
    pub fn agent(&self, service: &str, spiffe: bool) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        if spiffe {
            let id = format!("spiffe://gov.test/ns/default/service/{service}");
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(id.try_into().unwrap()));
        } else {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, service);
        }
        self.sign(&format!("agent-{service}-{spiffe}"), params)
    }
}
