//! `consumer from jwt` (issue 29) with real sockets and real tokens, minted
//! here with keys made here (ring) and a JWKS file written here: a valid
//! token's claim is the consumer the engine judges and the upstream gets;
//! every spelling of an invalid credential is refused with 401 (gRPC:
//! UNAUTHENTICATED) before anything reaches the upstream; a client cannot
//! name itself another consumer beside its token.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _,
};
use serde_json::json;

use crate::h1::Wire;
use crate::strict::RawUpstream;
use crate::support::{Agent, Upstream, agent};

/// A signing key and its public JWK.
struct Key {
    alg: Algorithm,
    kid: &'static str,
    encoding: EncodingKey,
    jwk: serde_json::Value,
}

fn es256(kid: &'static str) -> Key {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    Key {
        alg: Algorithm::ES256,
        kid,
        encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
            "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65]),
        }),
    }
}

fn ed25519(kid: &'static str) -> Key {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    Key {
        alg: Algorithm::EdDSA,
        kid,
        encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk: json!({
            "kty": "OKP", "crv": "Ed25519", "kid": kid, "use": "sig", "alg": "EdDSA",
            "x": B64.encode(pair.public_key().as_ref()),
        }),
    }
}

fn write_jwks(path: &Path, keys: &[&Key]) {
    let set = json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() });
    crate::support::write_atomically(path, &set.to_string());
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A token signed by `key` with `claims` over the valid defaults.
fn mint(key: &Key, claims: serde_json::Value) -> String {
    let mut all = json!({
        "iss": "https://idp", "aud": "order", "client_id": "crm",
        "exp": now() + 600, "nbf": now() - 10,
    });
    for (k, v) in claims.as_object().unwrap() {
        all[k] = v.clone();
    }
    let mut header = Header::new(key.alg);
    header.kid = Some(key.kid.to_owned());
    jsonwebtoken::encode(&header, &all, &key.encoding).unwrap()
}

fn config(keys: &Path, on_invalid: &str) -> String {
    format!(
        r#"
service: shop
version: jwt-v1
consumer_header: x-gov-consumer
consumer_source:
  jwt:
    header: authorization
    issuer: "https://idp"
    audience: order
    keys_file: "{}"
    claim: client_id
    on_invalid: {on_invalid}
rules:
  - name: shop/per_consumer
    on: {{ path: {{ kind: PATH_KIND_PREFIX, value: /orders }} }}
    limit:
      key: LIMIT_KEY_CONSUMER
      calls: {{ amount: 2, window_ms: 3600000 }}
"#,
        keys.display()
    )
}

struct Setup {
    up: RawUpstream,
    agent: Agent,
    key: Key,
    jwks: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn setup(on_invalid: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("idp.jwks");
    let key = es256("k1");
    write_jwks(&jwks, &[&key]);
    let up = RawUpstream::start().await;
    let agent = agent()
        .config(&config(&jwks, on_invalid))
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    Setup {
        up,
        agent,
        key,
        jwks,
        _dir: dir,
    }
}

async fn h1(agent: &Agent, fields: &str) -> (u16, String) {
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    let head = format!("GET /orders HTTP/1.1\r\nhost: x\r\n{fields}\r\n");
    wire.send(head.as_bytes()).await;
    let reply = wire.response().await;
    (
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned(),
    )
}

/// An h2c request; the status and its `grpc-status`, if any.
async fn h2c(agent: &Agent, fields: &[(&str, &str)]) -> (u16, Option<String>) {
    let tcp = tokio::net::TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut req = http::Request::post(format!("http://{}/orders", agent.sidecar.inbound_addr()));
    for (name, value) in fields {
        req = req.header(*name, *value);
    }
    let mut client = client.ready().await.unwrap();
    let (response, _) = client.send_request(req.body(()).unwrap(), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("answered within 10 s")
        .unwrap();
    let status = response.status().as_u16();
    let grpc = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    let mut body = response.into_body();
    while let Some(Ok(_)) = body.data().await {}
    connection.abort();
    (status, grpc)
}

#[tokio::test]
async fn a_valid_token_names_the_consumer_the_engine_and_the_upstream_read() {
    let s = setup("ON_INVALID_REJECT").await;
    let token = mint(&s.key, json!({}));
    // The client also claims to be `web`: the token says `crm`.
    let fields = format!("authorization: Bearer {token}\r\nx-gov-consumer: web\r\n");
    assert_eq!(h1(&s.agent, &fields).await.0, 200);
    let auth = format!("Bearer {token}");
    assert_eq!(
        h2c(
            &s.agent,
            &[("authorization", auth.as_str()), ("x-gov-consumer", "web")]
        )
        .await
        .0,
        200
    );
    // `crm`'s budget of 2 is spent, whatever consumer header is sent.
    assert_eq!(h1(&s.agent, &fields).await.0, 429);
    let other = format!("authorization: {token}\r\n");
    assert_eq!(h1(&s.agent, &other).await.0, 429, "`Bearer ` is optional");
    let received = s.up.requests();
    assert_eq!(received.len(), 2);
    for r in &received {
        assert_eq!(r.count("x-gov-consumer"), 1, "{r:?}");
        assert_eq!(r.header("x-gov-consumer"), Some(&b"crm"[..]));
    }
    // Another client of the same IdP is another consumer.
    let web = mint(&s.key, json!({ "client_id": "web" }));
    assert_eq!(
        h1(&s.agent, &format!("authorization: Bearer {web}\r\n"))
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn every_invalid_credential_is_refused_with_401_on_both_paths() {
    let s = setup("ON_INVALID_REJECT").await;
    let stranger = es256("k1");
    let none = format!(
        "{}.{}.",
        B64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        B64.encode(
            json!({"iss":"https://idp","aud":"order","client_id":"crm","exp":now()+600})
                .to_string()
        )
    );
    // HS256 with the public JWK as the secret: the classic algorithm confusion.
    let hs256 = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &json!({"iss":"https://idp","aud":"order","client_id":"crm","exp":now()+600}),
        &EncodingKey::from_secret(s.key.jwk.to_string().as_bytes()),
    )
    .unwrap();
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("bearer without a token", Some("Bearer".into())),
        ("malformed", Some("Bearer abc.def".into())),
        (
            "expired",
            Some(mint(&s.key, json!({ "exp": now() - 3600 }))),
        ),
        (
            "not yet valid",
            Some(mint(&s.key, json!({ "nbf": now() + 3600 }))),
        ),
        (
            "wrong issuer",
            Some(mint(&s.key, json!({ "iss": "https://evil" }))),
        ),
        (
            "wrong audience",
            Some(mint(&s.key, json!({ "aud": "billing" }))),
        ),
        ("another key", Some(mint(&stranger, json!({})))),
        ("alg none", Some(none)),
        ("hs256 with the public key", Some(hs256)),
        (
            "claim not a string",
            Some(mint(&s.key, json!({ "client_id": 7 }))),
        ),
        (
            "claim with a space",
            Some(mint(&s.key, json!({ "client_id": "c rm" }))),
        ),
    ];
    for (what, token) in &cases {
        let fields = match token {
            Some(t) => format!("authorization: {t}\r\nx-gov-consumer: crm\r\n"),
            None => "x-gov-consumer: crm\r\n".to_owned(),
        };
        let (status, body) = h1(&s.agent, &fields).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert!(
            body.contains("consumer from jwt header `authorization` of service `shop`"),
            "{what}: {body}"
        );
        let mut h2_fields = vec![("x-gov-consumer", "crm")];
        if let Some(t) = token {
            h2_fields.push(("authorization", t.as_str()));
        }
        assert_eq!(h2c(&s.agent, &h2_fields).await, (401, None), "{what}");
        // gRPC: the trailers-only answer, UNAUTHENTICATED.
        h2_fields.push(("content-type", "application/grpc"));
        h2_fields.push(("te", "trailers"));
        assert_eq!(
            h2c(&s.agent, &h2_fields).await,
            (200, Some("16".into())),
            "{what}"
        );
    }
    assert_eq!(s.up.take(), [], "nothing reached the upstream");
}

/// A refused token on a request hyper serves for the HTTP/1 path
/// (HTTP/1.0 without a host, an `Expect` other than `100-continue`) closes
/// the connection: nothing after it reaches hyper unchecked.
#[tokio::test]
async fn a_refused_handed_over_request_closes_the_connection() {
    let s = setup("ON_INVALID_REJECT").await;
    for head in [
        &b"GET /orders HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"[..],
        b"POST /orders HTTP/1.1\r\nhost: x\r\nexpect: x-other\r\ncontent-length: 0\r\n\r\n",
    ] {
        let mut wire = Wire::connect(s.agent.sidecar.inbound_addr()).await;
        wire.send(head).await;
        let reply = wire.response().await;
        assert_eq!(reply.status, 401);
        assert!(wire.closed().await, "the connection closes after the 401");
    }
    assert_eq!(s.up.take(), []);
}

/// The token's header is judged like the consumer header (issue 29): twice
/// (the agent would verify one, the upstream might read the other) or named
/// by `connection` is refused with 400 before any verification.
#[tokio::test]
async fn a_token_header_twice_or_named_by_connection_is_refused_with_400() {
    let s = setup("ON_INVALID_REJECT").await;
    let token = mint(&s.key, json!({}));
    for fields in [
        format!("authorization: Bearer {token}\r\nauthorization: Bearer x\r\n"),
        format!("authorization: Bearer {token}\r\nconnection: authorization\r\n"),
        format!("authorization: Bearer {token}\r\nAuthorization: Bearer {token}\r\n"),
    ] {
        assert_eq!(h1(&s.agent, &fields).await.0, 400, "{fields}");
    }
    assert_eq!(s.up.take(), []);
}

#[tokio::test]
async fn an_eddsa_key_verifies_and_the_keys_file_is_reloaded_when_it_changes() {
    let s = setup("ON_INVALID_REJECT").await;
    let ed = ed25519("k2");
    let token = mint(&ed, json!({ "client_id": "billing" }));
    let fields = format!("authorization: Bearer {token}\r\n");
    assert_eq!(
        h1(&s.agent, &fields).await.0,
        401,
        "k2 is not in the file yet"
    );
    write_jwks(&s.jwks, &[&s.key, &ed]);
    // The file is polled every second: wait, bounded.
    let mut status = 0;
    for _ in 0..100 {
        status = h1(&s.agent, &fields).await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "the new key is in force within 10 s");
    assert_eq!(
        s.up.requests()[0].header("x-gov-consumer"),
        Some(&b"billing"[..])
    );
}

#[tokio::test]
async fn on_invalid_count_serves_the_call_without_any_consumer() {
    let s = setup("ON_INVALID_COUNT").await;
    let expired = mint(&s.key, json!({ "exp": now() - 3600 }));
    // Calls without a consumer share the rule's one counter (2 per hour):
    // the client's `x-gov-consumer` is dropped, not believed.
    let fields = format!("authorization: Bearer {expired}\r\nx-gov-consumer: crm\r\n");
    assert_eq!(h1(&s.agent, &fields).await.0, 200);
    let fields = format!("authorization: Bearer {expired}\r\nx-gov-consumer: web\r\n");
    assert_eq!(h1(&s.agent, &fields).await.0, 200);
    assert_eq!(h1(&s.agent, &fields).await.0, 429);
    let received = s.up.requests();
    assert_eq!(received.len(), 2);
    assert!(received.iter().all(|r| r.count("x-gov-consumer") == 0));
}

/// `on invalid count`: a call whose token did not verify is a `token
/// invalid` system error toward the service's fuses, on both paths, though
/// the upstream answered 200; valid calls alone never trip it.
#[tokio::test]
async fn invalid_tokens_count_toward_the_fuse_as_system_errors() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("idp.jwks");
    let key = es256("k1");
    write_jwks(&jwks, &[&key]);
    let up = RawUpstream::start().await;
    let fuse = r#"
  - name: shop/tokens
    on: { path: { kind: PATH_KIND_PREFIX, value: /orders } }
    fuse:
      trips:
        - { metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 3, window_ms: 60000 }
      reject_status: 503
"#;
    let config = config(&jwks, "ON_INVALID_COUNT").replace(
        "      calls: { amount: 2, window_ms: 3600000 }\n",
        &format!("      calls: {{ amount: 1000, window_ms: 3600000 }}\n{fuse}"),
    );
    let agent = agent()
        .config(&config)
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    let valid = format!("authorization: Bearer {}\r\n", mint(&key, json!({})));
    for _ in 0..5 {
        assert_eq!(h1(&agent, &valid).await.0, 200);
    }
    let expired = mint(&key, json!({ "exp": now() - 3600 }));
    let bad = format!("authorization: Bearer {expired}\r\n");
    assert_eq!(h1(&agent, &bad).await.0, 200);
    assert_eq!(h1(&agent, &bad).await.0, 200);
    let auth = format!("Bearer {expired}");
    assert_eq!(
        h2c(&agent, &[("authorization", auth.as_str())]).await.0,
        200
    );
    assert_eq!(
        h1(&agent, &valid).await.0,
        503,
        "three token errors tripped it"
    );
}

/// `per claim "tenant"` (issue 38): each tenant the verified token names
/// has its own budget on both paths; a `tenant` header the client sends
/// changes nothing (claims come from the token only); a token without the
/// claim counts under the shared `%absent` key.
#[tokio::test]
async fn a_verified_claim_keys_a_limit_and_a_forged_header_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("idp.jwks");
    let key = es256("k1");
    write_jwks(&jwks, &[&key]);
    let up = RawUpstream::start().await;
    let yaml = config(&jwks, "ON_INVALID_REJECT").replace(
        "      key: LIMIT_KEY_CONSUMER\n",
        "      key_parts: [{ claim: tenant }]\n",
    );
    let agent = agent()
        .config(&yaml)
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    let acme = mint(&key, json!({ "tenant": "acme" }));
    let zeta = mint(&key, json!({ "tenant": "zeta" }));
    let none = mint(&key, json!({}));
    let h1_as = |token: &str, forged: &str| {
        format!("authorization: Bearer {token}\r\ntenant: {forged}\r\nx-tenant: {forged}\r\n")
    };
    assert_eq!(h1(&agent, &h1_as(&acme, "zeta")).await.0, 200);
    let bearer = format!("Bearer {acme}");
    assert_eq!(
        h2c(&agent, &[("authorization", bearer.as_str())]).await.0,
        200
    );
    assert_eq!(
        h1(&agent, &h1_as(&acme, "zeta")).await.0,
        429,
        "acme is spent"
    );
    // zeta's budget is untouched by the calls that claimed it in a header.
    assert_eq!(h1(&agent, &h1_as(&zeta, "acme")).await.0, 200);
    let bearer = format!("Bearer {zeta}");
    assert_eq!(
        h2c(&agent, &[("authorization", bearer.as_str())]).await.0,
        200
    );
    assert_eq!(h1(&agent, &h1_as(&zeta, "x")).await.0, 429);
    // No claim: one shared budget, whatever the client adds.
    assert_eq!(h1(&agent, &h1_as(&none, "a")).await.0, 200);
    assert_eq!(h1(&agent, &h1_as(&none, "b")).await.0, 200);
    assert_eq!(h1(&agent, &h1_as(&none, "c")).await.0, 429);
    let limit = agent
        .sidecar
        .engine()
        .stats()
        .rules
        .into_iter()
        .find(|r| &*r.rule == "shop/per_consumer")
        .unwrap();
    assert_eq!(limit.keys, 3, "acme, zeta, %absent");
}
