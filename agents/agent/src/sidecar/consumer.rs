//! `consumer from jwt`: the inbound listener verifies the caller's token and
//! the claim it names becomes the consumer, written by the agent into the
//! consumer header (the client's copies are dropped), so the engine and the
//! upstream read the same, verified identity.
//!
//! Verification uses the `jsonwebtoken` crate (a maintained, audited JOSE
//! implementation; a hand-written one would be the riskiest code in the
//! agent): the signature with a key of the JWKS file (RS256, ES256, EdDSA;
//! `alg: none` and HMAC are refused), `exp` (required) and `nbf` with the
//! crate's 60 s leeway, `iss` and `aud`. The file is re-read when its mtime,
//! inode or length changes (polled every second on `tokio::time`); a file that cannot be read
//! keeps the keys in force, and with none every token is invalid.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use gov_engine::config::JwtSpec;
use http::HeaderName;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};

/// How often a keys file's mtime is looked at.
const POLL: Duration = Duration::from_secs(1);

/// The longest consumer a claim may name.
const MAX_CONSUMER: usize = 256;

/// Why a call has no verified consumer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("no token in `{0}`")]
    Missing(String),
    #[error("the token is malformed")]
    Malformed,
    #[error("the token's algorithm is not RS256, ES256 or EdDSA")]
    Algorithm,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (`nbf`)")]
    NotYet,
    #[error("the token's issuer is not the one declared")]
    Issuer,
    #[error("the token's audience is not the one declared")]
    Audience,
    #[error("the token's signature does not verify with any key of the keys file")]
    Signature,
    #[error("the token's claim `{0}` is missing, not a string, or not a plain name")]
    Claim(String),
    #[error("no key: {0}")]
    Keys(String),
}

/// The verification keys of one JWKS file.
#[derive(Default)]
struct KeySet {
    keys: Vec<(Option<String>, Algorithm, DecodingKey)>,
    /// Why there are none, when the file could not be read.
    error: Option<String>,
}

/// A keys file, kept current by a task that polls its mtime.
struct KeyFile {
    set: ArcSwap<KeySet>,
}

/// The keys files of the configs in force, by path (public for the
/// `jwt` bench).
#[derive(Default)]
pub struct Verifier {
    files: Mutex<HashMap<PathBuf, Arc<KeyFile>>>,
}

impl Verifier {
    /// The consumer `spec` proves for a request whose token header is
    /// `value` (`None`: absent).
    pub fn verify(&self, spec: &JwtSpec, value: Option<&[u8]>) -> Result<String, Invalid> {
        self.verify_with(spec, value, &[])
            .map(|(consumer, _)| consumer)
    }

    /// The consumer, and the string claims named `keyed` that the token
    /// has (rules key on them: `per claim`).
    pub fn verify_with(
        &self,
        spec: &JwtSpec,
        value: Option<&[u8]>,
        keyed: &[Box<str>],
    ) -> Result<(String, Vec<(String, String)>), Invalid> {
        let file = self.file(&spec.keys_file);
        let set = file.set.load();
        let claims = verify(spec, &set, value)?;
        let consumer = claim(spec, &claims)?;
        let keyed = keyed
            .iter()
            .filter_map(|name| {
                let v = claims.get(&**name)?.as_str()?;
                // Over 128 bytes is the engine's `%invalid`: a huge claim is
                // cut just past that, not copied whole.
                let mut end = v.len().min(gov_engine::config::MAX_VALUE + 1);
                while !v.is_char_boundary(end) {
                    end += 1;
                }
                let v = &v[..end];
                Some((name.to_string(), v.to_owned()))
            })
            .collect();
        Ok((consumer, keyed))
    }

    /// The keys file at `path`, loaded (once) and watched.
    fn file(&self, path: &Path) -> Arc<KeyFile> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(file) = files.get(path) {
            return file.clone();
        }
        // A new path (a new config): read it now, once; the task keeps it current.
        let (set, mtime) = load(path);
        let file = Arc::new(KeyFile {
            set: ArcSwap::from_pointee(set),
        });
        files.retain(|_, f| Arc::strong_count(f) > 1);
        files.insert(path.to_owned(), file.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watch(Arc::downgrade(&file), path.to_owned(), mtime));
        }
        file
    }
}

/// What tells a changed keys file: its mtime, and its inode and length (a
/// file replaced within the clock's granularity keeps the mtime).
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(meta: std::io::Result<std::fs::Metadata>) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let meta = meta.ok()?;
    Some((meta.modified().ok()?, meta.ino(), meta.len()))
}

/// Re-reads `path` when it changes, until the file is dropped.
async fn watch(file: Weak<KeyFile>, path: PathBuf, mut seen: Stamp) {
    loop {
        tokio::time::sleep(POLL).await;
        let Some(file) = file.upgrade() else { return };
        let now = stamp(tokio::fs::metadata(&path).await);
        if now == seen {
            continue;
        }
        seen = now;
        let (set, _) = load(&path);
        match &set.error {
            Some(error) if !file.set.load().keys.is_empty() => {
                tracing::warn!(path = %path.display(), %error, "keeping the JWT keys in force");
            }
            _ => {
                tracing::info!(path = %path.display(), keys = set.keys.len(), "JWT keys loaded");
                file.set.store(Arc::new(set));
            }
        }
    }
}

/// The keys of a JWKS file, and its stamp.
fn load(path: &Path) -> (KeySet, Stamp) {
    let mtime = stamp(std::fs::metadata(path));
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(error) => {
            return (
                KeySet {
                    keys: Vec::new(),
                    error: Some(format!("cannot read {}: {error}", path.display())),
                },
                mtime,
            );
        }
    };
    let set: JwkSet = match serde_json::from_slice(&text) {
        Ok(set) => set,
        Err(error) => {
            return (
                KeySet {
                    keys: Vec::new(),
                    error: Some(format!("{} is not a JWKS: {error}", path.display())),
                },
                mtime,
            );
        }
    };
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
            // HMAC secrets and other curves are not verification keys here.
            _ => continue,
        };
        if let Ok(key) = DecodingKey::from_jwk(jwk) {
            keys.push((jwk.common.key_id.clone(), alg, key));
        }
    }
    let error = keys
        .is_empty()
        .then(|| format!("{} has no RS256, ES256 or EdDSA key", path.display()));
    (KeySet { keys, error }, mtime)
}

/// The claims of the token in `value`, once its signature, algorithm,
/// times, issuer and audience verify.
fn verify(
    spec: &JwtSpec,
    set: &KeySet,
    value: Option<&[u8]>,
) -> Result<serde_json::Map<String, serde_json::Value>, Invalid> {
    let value = value.ok_or_else(|| Invalid::Missing(spec.header.to_string()))?;
    let value = std::str::from_utf8(value).map_err(|_| Invalid::Malformed)?;
    let token = match value.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("bearer ") => &value[7..],
        _ => value,
    };
    if token.is_empty() {
        return Err(Invalid::Missing(spec.header.to_string()));
    }
    let header = decode_header(token).map_err(|_| Invalid::Malformed)?;
    if !matches!(
        header.alg,
        Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA
    ) {
        return Err(Invalid::Algorithm);
    }
    if let Some(error) = &set.error
        && set.keys.is_empty()
    {
        return Err(Invalid::Keys(error.clone()));
    }
    let mut validation = Validation::new(header.alg);
    validation.set_issuer(&[&spec.issuer]);
    validation.set_audience(&[&spec.audience]);
    validation.validate_nbf = true;
    let mut last = Invalid::Signature;
    let candidates = set.keys.iter().filter(|(kid, alg, _)| {
        *alg == header.alg
            && match (&header.kid, kid) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            }
    });
    for (_, _, key) in candidates {
        use jsonwebtoken::errors::ErrorKind;
        match decode::<serde_json::Map<String, serde_json::Value>>(token, key, &validation) {
            Ok(data) => return Ok(data.claims),
            Err(error) => {
                last = match error.kind() {
                    ErrorKind::InvalidSignature => continue,
                    ErrorKind::ExpiredSignature => Invalid::Expired,
                    ErrorKind::ImmatureSignature => Invalid::NotYet,
                    ErrorKind::InvalidIssuer => Invalid::Issuer,
                    ErrorKind::InvalidAudience => Invalid::Audience,
                    ErrorKind::MissingRequiredClaim(c) => Invalid::Claim(c.clone()),
                    _ => Invalid::Malformed,
                };
                // The signature verified (claims are checked after it).
                return Err(last);
            }
        }
    }
    Err(last)
}

/// The consumer the claim names: a plain, printable name.
fn claim(
    spec: &JwtSpec,
    claims: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, Invalid> {
    let bad = || Invalid::Claim(spec.claim.clone());
    let name = claims
        .get(&spec.claim)
        .and_then(serde_json::Value::as_str)
        .ok_or_else(bad)?;
    let printable = name.bytes().all(|b| (0x21..0x7f).contains(&b));
    if name.is_empty() || name.len() > MAX_CONSUMER || !printable {
        return Err(bad());
    }
    Ok(name.to_owned())
}

/// What a request's consumer header carries to the engine and the upstream.
pub(crate) enum Identity {
    /// The header as the client sent it (`consumer from header`, and every
    /// outbound call: the local service names its own consumer).
    AsSent,
    /// The consumer a verified token or certificate names, written by the
    /// agent into `header` (the config's consumer header).
    Verified {
        header: HeaderName,
        consumer: String,
        /// The token's claims rules key on (`per claim`): handed to the
        /// engine, not to the upstream.
        claims: Vec<(String, String)>,
    },
    /// No consumer (an invalid credential under `on invalid count`): the
    /// client's `header` is dropped.
    Dropped { header: HeaderName },
    /// No consumer: the header came from a caller the policy does not trust
    /// to set it (`trusted from peer`), and is dropped.
    Untrusted { header: HeaderName },
}

/// The consumer of an inbound request whose headers are `headers`, by the
/// service's `consumer from`; `caller` is the connection's calling agent
/// (mutual TLS). `Err`: the refusal's text (`on invalid reject`).
pub(crate) fn identify(
    engine: &gov_engine::Engine,
    verifier: &Verifier,
    caller: Option<&super::mtls::Caller>,
    headers: gov_engine::Headers<'_>,
) -> Result<Identity, String> {
    use gov_engine::config::{ConsumerSource, OnInvalid};
    let config = engine.config();
    let header = || config.consumer_header.clone();
    let (verified, on_invalid) = match &config.consumer_source {
        ConsumerSource::Header => return Ok(Identity::AsSent),
        ConsumerSource::TrustedHeader(peers) => {
            let trusted = caller.is_some_and(|c| peers.contains(&c.service));
            return Ok(if trusted {
                Identity::AsSent
            } else {
                Identity::Untrusted { header: header() }
            });
        }
        ConsumerSource::Peer(on_invalid) => (
            caller
                .map(|c| (c.service.clone(), Vec::new()))
                .ok_or_else(|| "the caller presented no verified agent certificate".to_string()),
            *on_invalid,
        ),
        ConsumerSource::Jwt(spec) => (
            verifier
                .verify_with(spec, headers.get(&spec.header), config.keyed_claims())
                .map_err(|invalid| invalid.to_string()),
            spec.on_invalid,
        ),
    };
    match verified {
        Ok((consumer, claims)) => Ok(Identity::Verified {
            header: header(),
            consumer,
            claims,
        }),
        Err(invalid) => match on_invalid {
            OnInvalid::Count => {
                tracing::debug!(%invalid, "served without a consumer (on invalid count)");
                Ok(Identity::Dropped { header: header() })
            }
            OnInvalid::Reject => Err(format!(
                "gov-agent: consumer from {} of service `{}`: {invalid}\n",
                match &config.consumer_source {
                    ConsumerSource::Jwt(spec) => format!("jwt header `{}`", spec.header),
                    _ => "peer".to_string(),
                },
                config.service
            )),
        },
    }
}

impl Identity {
    /// Whether the caller's credential did not verify (`on invalid count`):
    /// fuses count the call as a `token invalid` system error.
    pub(crate) fn invalid(&self) -> bool {
        matches!(self, Identity::Dropped { .. })
    }

    /// The consumer header and the value it gets (`None`: removed); `None`
    /// when the client's stays.
    pub(crate) fn value(&self) -> Option<(&str, Option<&[u8]>)> {
        match self {
            Identity::AsSent => None,
            Identity::Verified {
                header, consumer, ..
            } => Some((header.as_str(), Some(consumer.as_bytes()))),
            Identity::Dropped { header } | Identity::Untrusted { header } => {
                Some((header.as_str(), None))
            }
        }
    }
}
impl Identity {
    /// The verified token's claims rules key on (empty without one).
    pub(crate) fn claims(&self) -> &[(String, String)] {
        match self {
            Identity::Verified { claims, .. } => claims,
            _ => &[],
        }
    }

    /// Writes the identity into `req` (hyper's path): the client's consumer
    /// headers go, the verified one is set, and the claims rules key on
    /// ride as an extension no client can set.
    pub(crate) fn apply<B>(self, req: &mut http::Request<B>) {
        let headers = req.headers_mut();
        match self {
            Identity::AsSent => {}
            Identity::Verified {
                header,
                consumer,
                claims,
            } => {
                headers.remove(&header);
                if let Ok(value) = http::HeaderValue::from_str(&consumer) {
                    headers.insert(header, value);
                }
                if !claims.is_empty() {
                    req.extensions_mut()
                        .insert(gov_engine::VerifiedClaims(claims));
                }
            }
            Identity::Dropped { header } | Identity::Untrusted { header } => {
                headers.remove(&header);
            }
        }
    }
}

/// The refusal of a token on hyper's path: 401, or for a gRPC call the
/// trailers-only answer with `grpc-status` 16 (UNAUTHENTICATED).
pub(crate) fn response(text: &str, grpc: bool) -> http::Response<super::abandoned::Inner> {
    use http::header::{CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
    let (status, body, content_type) = if grpc {
        (
            http::StatusCode::OK,
            bytes::Bytes::new(),
            "application/grpc",
        )
    } else {
        (
            http::StatusCode::UNAUTHORIZED,
            bytes::Bytes::copy_from_slice(text.as_bytes()),
            "text/plain; charset=utf-8",
        )
    };
    let mut response = http::Response::new(gov_engine::GovBody::local(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer error=\"invalid_token\""),
    );
    if grpc {
        headers.insert(
            gov_engine::grpc::GRPC_STATUS,
            HeaderValue::from_static("16"),
        );
        let message = gov_engine::grpc::encode_message(text.trim_end());
        if let Ok(value) = HeaderValue::from_str(&message) {
            headers.insert(gov_engine::grpc::GRPC_MESSAGE, value);
        }
    }
    response
}

/// `headers` with every `name` field replaced by `value` (none: removed).
pub(crate) fn replaced<'a>(
    headers: &[httparse::Header<'a>],
    name: &'a str,
    value: Option<&'a [u8]>,
) -> Vec<httparse::Header<'a>> {
    let mut out: Vec<httparse::Header<'a>> = headers
        .iter()
        .filter(|h| !h.name.eq_ignore_ascii_case(name))
        .copied()
        .collect();
    if let Some(value) = value {
        out.push(httparse::Header { name, value });
    }
    out
}

/// The 401 of a refused token on the HTTP/1 path, at the end of `out`.
pub(crate) fn write_http1(out: &mut Vec<u8>, text: &str, close: bool) {
    use std::io::Write;
    let _ = write!(
        out,
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: text/plain; charset=utf-8\r\nwww-authenticate: Bearer error=\"invalid_token\"\r\n{}content-length: {}\r\n\r\n{text}",
        if close { "connection: close\r\n" } else { "" },
        text.len(),
    );
}
