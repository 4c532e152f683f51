//! Where a service's consumer comes from (`consumer from ...`), converted
//! from the wire: the header as the client sends it; the header only as
//! verified calling services set it; the calling service of the agent's
//! mutual TLS connection; or a signed JWT whose claim the proxy verifies.
//! The proxy writes what it verified into the consumer header and the
//! engine reads that header in every case; the verification itself lives in
//! the proxy (`gov-agent`), which holds the keys and the connections.

use std::path::PathBuf;
use std::sync::Arc;

use gov_proto::v1 as proto;
use http::HeaderName;

use super::InvalidConfig;

/// What proves a caller's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ConsumerSource {
    /// The consumer header as the client sends it: proves nothing.
    #[default]
    Header,
    /// The consumer header as one of these calling services (verified by
    /// mutual TLS) sends it; anyone else's copy is removed.
    TrustedHeader(Arc<[String]>),
    /// The calling service of the mutual TLS connection.
    Peer(OnInvalid),
    /// A JWT's claim, verified by the proxy.
    Jwt(Arc<JwtSpec>),
}

/// `consumer from jwt ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtSpec {
    /// The request header carrying the token.
    pub header: HeaderName,
    pub issuer: String,
    pub audience: String,
    /// The JWKS file with the verification keys.
    pub keys_file: PathBuf,
    /// The claim naming the consumer.
    pub claim: String,
    pub on_invalid: OnInvalid,
}

/// What a call with a missing, invalid or expired credential gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnInvalid {
    /// 401 (gRPC `UNAUTHENTICATED`).
    Reject,
    /// Served without a consumer, counted as a `token invalid` system error.
    Count,
}

impl ConsumerSource {
    /// The source of a wire config (absent: the header).
    pub(crate) fn from_wire(source: Option<&proto::ConsumerSource>) -> Result<Self, InvalidConfig> {
        let bad = |problem: &str| InvalidConfig::ConsumerSource {
            problem: problem.to_string(),
        };
        let j = match source.and_then(|s| s.kind.as_ref()) {
            None => return Ok(ConsumerSource::Header),
            Some(proto::consumer_source::Kind::Peer(p)) => {
                return Ok(ConsumerSource::Peer(on_invalid(p.on_invalid)?));
            }
            Some(proto::consumer_source::Kind::TrustedHeader(h)) => {
                let plain = |p: &String| {
                    !p.is_empty()
                        && p.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                };
                if h.peers.is_empty() || !h.peers.iter().all(plain) {
                    return Err(bad(
                        "`trusted from peer` names no service, or one that is not a service name",
                    ));
                }
                return Ok(ConsumerSource::TrustedHeader(h.peers.clone().into()));
            }
            Some(proto::consumer_source::Kind::Jwt(j)) => j,
        };
        let header = HeaderName::from_bytes(j.header.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad("the jwt `header` is not a header name"))?;
        for (value, what) in [
            (&j.issuer, "issuer"),
            (&j.audience, "audience"),
            (&j.keys_file, "keys_file"),
            (&j.claim, "claim"),
        ] {
            if value.is_empty() {
                return Err(bad(&format!("the jwt `{what}` is empty")));
            }
        }
        let on_invalid = on_invalid(j.on_invalid)?;
        Ok(ConsumerSource::Jwt(Arc::new(JwtSpec {
            header,
            issuer: j.issuer.clone(),
            audience: j.audience.clone(),
            keys_file: PathBuf::from(&j.keys_file),
            claim: j.claim.clone(),
            on_invalid,
        })))
    }

    /// The JWT source, if the consumer comes from one.
    pub fn jwt(&self) -> Option<&Arc<JwtSpec>> {
        match self {
            ConsumerSource::Jwt(j) => Some(j),
            _ => None,
        }
    }

    /// How the source is named in `/metrics`, status and the decision log.
    pub fn name(&self) -> &'static str {
        match self {
            ConsumerSource::Header => "header",
            ConsumerSource::TrustedHeader(_) => "trusted-header",
            ConsumerSource::Peer(_) => "peer",
            ConsumerSource::Jwt(_) => "jwt",
        }
    }
}

fn on_invalid(wire: i32) -> Result<OnInvalid, InvalidConfig> {
    match proto::OnInvalid::try_from(wire) {
        Ok(proto::OnInvalid::Reject) => Ok(OnInvalid::Reject),
        Ok(proto::OnInvalid::Count) => Ok(OnInvalid::Count),
        Err(_) => Err(InvalidConfig::ConsumerSource {
            problem: "`on_invalid` is unknown to this agent".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(f: impl FnOnce(&mut proto::JwtSource)) -> Result<ConsumerSource, InvalidConfig> {
        let mut j = proto::JwtSource {
            header: "Authorization".into(),
            issuer: "https://idp".into(),
            audience: "order".into(),
            keys_file: "idp.jwks".into(),
            claim: "client_id".into(),
            on_invalid: proto::OnInvalid::Reject as i32,
        };
        f(&mut j);
        ConsumerSource::from_wire(Some(&proto::ConsumerSource {
            kind: Some(proto::consumer_source::Kind::Jwt(j)),
        }))
    }

    #[test]
    fn a_jwt_source_is_checked_field_by_field() {
        assert_eq!(
            ConsumerSource::from_wire(None).unwrap(),
            ConsumerSource::Header
        );
        let ok = jwt(|_| {}).unwrap();
        let spec = ok.jwt().unwrap();
        assert_eq!(spec.header, "authorization");
        assert_eq!(spec.on_invalid, OnInvalid::Reject);
        for (broken, what) in [
            (jwt(|j| j.issuer.clear()), "issuer"),
            (jwt(|j| j.claim.clear()), "claim"),
            (jwt(|j| j.keys_file.clear()), "keys_file"),
            (jwt(|j| j.header = "bad header".into()), "header"),
            (jwt(|j| j.on_invalid = 9), "on_invalid"),
        ] {
            let error = broken.unwrap_err().to_string();
            assert!(error.contains(what), "{what}: {error}");
        }
    }

    #[test]
    fn peer_sources_are_checked() {
        let source =
            |kind| ConsumerSource::from_wire(Some(&proto::ConsumerSource { kind: Some(kind) }));
        assert_eq!(
            source(proto::consumer_source::Kind::Peer(proto::PeerSource {
                on_invalid: proto::OnInvalid::Count as i32
            }))
            .unwrap(),
            ConsumerSource::Peer(OnInvalid::Count)
        );
        let trusted = |peers: &[&str]| {
            source(proto::consumer_source::Kind::TrustedHeader(
                proto::TrustedHeader {
                    peers: peers.iter().map(|p| p.to_string()).collect(),
                },
            ))
        };
        assert_eq!(
            trusted(&["gateway"]).unwrap(),
            ConsumerSource::TrustedHeader(vec!["gateway".to_string()].into())
        );
        for bad in [&[][..], &[""], &["gate way"], &["a/b"]] {
            assert!(trusted(bad).is_err(), "{bad:?}");
        }
    }
}
