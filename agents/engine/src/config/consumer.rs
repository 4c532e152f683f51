//! Where a service's consumer comes from (`consumer from ...`), converted
//! from the wire: the header as the client sends it, or a signed JWT whose
//! claim the proxy verifies and writes into the consumer header. The engine
//! reads the consumer header either way; the verification itself lives in
//! the proxy (`gov-agent`), which holds the keys.

use std::path::PathBuf;
use std::sync::Arc;

use gov_proto::v1 as proto;
use http::HeaderName;

use super::InvalidConfig;

/// What proves a caller's identity. (`Peer`, the calling agent's mTLS
/// identity, is to come beside these.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ConsumerSource {
    /// The consumer header as the client sends it: proves nothing.
    #[default]
    Header,
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
        let Some(proto::consumer_source::Kind::Jwt(j)) = source.and_then(|s| s.kind.as_ref())
        else {
            return Ok(ConsumerSource::Header);
        };
        let bad = |problem: &str| InvalidConfig::ConsumerSource {
            problem: problem.to_string(),
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
        let on_invalid = match proto::OnInvalid::try_from(j.on_invalid) {
            Ok(proto::OnInvalid::Reject) => OnInvalid::Reject,
            Ok(proto::OnInvalid::Count) => OnInvalid::Count,
            Err(_) => return Err(bad("`on_invalid` is unknown to this agent")),
        };
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
            ConsumerSource::Header => None,
        }
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
}
