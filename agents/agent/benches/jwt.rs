//! What `consumer from jwt` adds to each inbound request: one
//! `Verifier::verify` (header, base64, JSON, signature, `exp`/`nbf`, `iss`,
//! `aud`, the claim) with an ES256 and an EdDSA key from a JWKS file, and
//! the refusal of a token signed by another key and of a missing one.
//! Keys and tokens are made here. Prints p50/p99 per call, one thread.
//!
//! Run: `cargo bench -j2 -p gov-agent --bench jwt` (BENCHMARKS.md, "JWT
//! consumer verification").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use gov_agent::sidecar::Verifier;
use gov_engine::config::{JwtSpec, OnInvalid};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _,
};
use serde_json::json;

const CALLS: usize = 20_000;
const WARMUP: usize = 1_000;

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims() -> serde_json::Value {
    json!({"iss": "https://idp", "aud": "order", "client_id": "crm", "exp": now() + 3600})
}

fn token(alg: Algorithm, kid: &str, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, &claims(), key).unwrap()
}

fn measure(verifier: &Verifier, spec: &JwtSpec, value: Option<&[u8]>) -> (Duration, Duration) {
    for _ in 0..WARMUP {
        let _ = verifier.verify(spec, value);
    }
    let mut samples = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let start = Instant::now();
        let result = verifier.verify(spec, value);
        samples.push(start.elapsed());
        std::hint::black_box(result.ok());
    }
    samples.sort();
    (samples[CALLS / 2], samples[CALLS * 99 / 100])
}

fn main() {
    let rng = SystemRandom::new();
    let ec_pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, ec_pkcs8.as_ref(), &rng)
        .unwrap();
    let point = ec.public_key().as_ref();
    let ed_pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let ed = Ed25519KeyPair::from_pkcs8(ed_pkcs8.as_ref()).unwrap();
    let other_pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("idp.jwks");
    let jwks = json!({"keys": [
        {"kty": "EC", "crv": "P-256", "kid": "ec", "alg": "ES256",
         "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65])},
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "EdDSA",
         "x": B64.encode(ed.public_key().as_ref())},
    ]});
    std::fs::write(&keys_file, jwks.to_string()).unwrap();
    let spec = JwtSpec {
        header: http::header::AUTHORIZATION,
        issuer: "https://idp".into(),
        audience: "order".into(),
        keys_file,
        claim: "client_id".into(),
        on_invalid: OnInvalid::Reject,
    };
    let es256 = format!(
        "Bearer {}",
        token(
            Algorithm::ES256,
            "ec",
            &EncodingKey::from_ec_der(ec_pkcs8.as_ref())
        )
    );
    let eddsa = format!(
        "Bearer {}",
        token(
            Algorithm::EdDSA,
            "ed",
            &EncodingKey::from_ed_der(ed_pkcs8.as_ref())
        )
    );
    let forged = format!(
        "Bearer {}",
        token(
            Algorithm::ES256,
            "ec",
            &EncodingKey::from_ec_der(other_pkcs8.as_ref())
        )
    );
    let verifier = Verifier::default();
    assert_eq!(
        verifier.verify(&spec, Some(es256.as_bytes())).unwrap(),
        "crm"
    );
    assert_eq!(
        verifier.verify(&spec, Some(eddsa.as_bytes())).unwrap(),
        "crm"
    );
    assert!(verifier.verify(&spec, Some(forged.as_bytes())).is_err());
    let cases: [(&str, Option<&[u8]>); 4] = [
        ("valid ES256 token", Some(es256.as_bytes())),
        ("valid EdDSA token", Some(eddsa.as_bytes())),
        (
            "ES256 token, another key (refused)",
            Some(forged.as_bytes()),
        ),
        ("no token (refused)", None),
    ];
    for (name, value) in cases {
        let (p50, p99) = measure(&verifier, &spec, value);
        println!(
            "{name:<38} p50 {:>7.1}us  p99 {:>7.1}us",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
    }
}
