//! Path parameters (`;`), case and double encoding against an upstream that
//! reads paths as a Servlet container does (Tomcat, Jetty, Undertow), or also
//! case-insensitively (IIS): each spelling that would reach a protected page
//! through such an upstream is refused, or matched as the upstream reads it,
//! over HTTP/1.1, HTTP/1.0 (hyper's path) and h2c.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::h1::Wire;
use crate::strict::{Parsed, parse};
use crate::support::{Agent, Upstream, agent};

/// `/admin` and below: one call an hour, spent before the spellings are sent.
const PROTECTED: &str = r#"
service: shop
version: paths-v1
rules:
  - name: shop/admin
    on: { path: { kind: PATH_KIND_PREFIX, value: /admin } }
    limit:
      calls: { amount: 1, window_ms: 3600000 }
"#;

/// What a Servlet container serves for `target`, per Jakarta Servlet 6.0 section
/// 3.5.2 ("URI Path Canonicalization"; Servlet 4.0/5.0 section 3.5): the query
/// separated (step 2), the path split into segments (3), the path parameters
/// removed from each segment, from its first `;` on (4), each segment decoded
/// (5), empty segments but the last removed (6), dot segments removed (7); a `..`
/// above the root is refused (8). `None`: the container answers 400.
fn servlet_path(target: &str) -> Option<String> {
    let path = target.split('?').next().unwrap_or(target);
    let segments: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    let mut kept: Vec<String> = Vec::new();
    let mut dir = false;
    for (i, segment) in segments.iter().enumerate() {
        let bare = segment.split(';').next().unwrap_or("");
        let decoded = percent_decode(bare)?;
        let last = i + 1 == segments.len();
        dir = matches!(decoded.as_str(), "." | "..") || (decoded.is_empty() && last);
        match decoded.as_str() {
            "" | "." => {}
            ".." => {
                kept.pop()?;
            }
            _ => kept.push(decoded),
        }
    }
    let mut out = String::new();
    for s in &kept {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || dir {
        out.push('/');
    }
    Some(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// An upstream that reads each request's path as a Servlet container does
/// ([`servlet_path`]) and answers `200` with `servlet <path>`, or `400`.
struct Servlet {
    addr: SocketAddr,
    /// The targets received, as sent by the agent.
    received: Arc<Mutex<Vec<String>>>,
}

impl Servlet {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        if let Parsed::Complete(req, n) = parse(&buf) {
                            buf.drain(..n);
                            log.lock().unwrap().push(req.target.clone());
                            let answer = match servlet_path(&req.target) {
                                Some(path) => {
                                    let body = format!("servlet {path}");
                                    format!(
                                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                        body.len()
                                    )
                                }
                                None => "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"
                                    .to_owned(),
                            };
                            if s.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                            continue;
                        }
                        let mut chunk = [0_u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        Self { addr, received }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.received.lock().unwrap())
    }
}

/// Starts the agent in front of `servlet` with `config` and spends the one call
/// of `shop/admin`.
async fn protected(servlet: &Servlet, config: &str) -> Agent {
    let agent = agent()
        .config(config)
        .upstream(&Upstream::at(servlet.addr))
        .start()
        .await;
    for expected in [200, 429] {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(b"GET /admin/ HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert_eq!(wire.response().await.status, expected);
    }
    assert_eq!(servlet.take(), ["/admin/"]);
    agent
}

/// The protocols a spelling is sent over.
#[derive(Clone, Copy, Debug)]
enum Over {
    Http11,
    /// Handed over to hyper by the HTTP/1 path.
    Http10,
    H2c,
}

const OVER: [Over; 3] = [Over::Http11, Over::Http10, Over::H2c];

/// Sends `GET target` over `over`: the status and body.
async fn get(agent: &Agent, over: Over, target: &str) -> (u16, String) {
    let version = match over {
        Over::Http11 => "1.1",
        Over::Http10 => "1.0",
        Over::H2c => {
            let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http();
            let req = Request::get(agent.url(target)).body(Empty::new()).unwrap();
            let response = client.request(req).await.unwrap();
            assert_eq!(response.version(), http::Version::HTTP_2);
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            return (status.as_u16(), String::from_utf8_lossy(&body).into_owned());
        }
    };
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    let request = format!("GET {target} HTTP/{version}\r\nhost: x\r\n\r\n");
    wire.send(request.as_bytes()).await;
    let reply = wire.response().await;
    (
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned(),
    )
}

/// The spellings of issue 27 and their relatives: each is `/admin` or below to
/// a Servlet container.
const BYPASSES: [&str; 10] = [
    "/x/..;/admin/",
    "/.;/admin/",
    "/;x/admin/",
    "/x/..;x=1/admin/secret",
    "/x/%2e%2e;/admin/",
    "/x/.%2E;/admin",
    "//;/admin",
    "/admin;x/",
    "/admin;jsessionid=1/secret",
    "/x/..;/%61dmin",
];

#[tokio::test]
async fn by_default_parameters_that_change_the_path_are_refused_on_every_protocol() {
    let servlet = Servlet::start().await;
    let agent = protected(&servlet, PROTECTED).await;
    for over in OVER {
        for target in BYPASSES {
            // The test upstream would serve the protected page for each.
            assert!(
                servlet_path(target).is_some_and(|p| p.starts_with("/admin")),
                "{target}"
            );
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 400, "{over:?} {target}: {body}");
            assert!(body.contains("`;` parameter"), "{over:?} {target}: {body}");
        }
        for target in ["/%252e%252e/admin", "/admin%2541"] {
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 400, "{over:?} {target}: {body}");
            assert!(body.contains("double-encoded"), "{over:?} {target}: {body}");
        }
        // Parameters on a named last segment are kept: a prefix rule that
        // matches the path without them matches it with them.
        let (status, _) = get(&agent, over, "/admin;jsessionid=1").await;
        assert_eq!(status, 429, "{over:?}");
        let (status, body) = get(&agent, over, "/shop/cart;jsessionid=1").await;
        assert_eq!(
            (status, body.as_str()),
            (200, "servlet /shop/cart"),
            "{over:?}"
        );
    }
    assert_eq!(
        servlet.take(),
        ["/shop/cart;jsessionid=1"; 3],
        "nothing under `/admin` reached the upstream"
    );
}

#[tokio::test]
async fn paths_servlet_matches_and_forwards_the_path_a_servlet_container_serves() {
    let servlet = Servlet::start().await;
    let config = PROTECTED.replace(
        "version: paths-v1\n",
        "version: paths-v1\npaths: PATH_DIALECT_SERVLET\n",
    );
    let agent = protected(&servlet, &config).await;
    for over in OVER {
        for target in BYPASSES {
            // `/admin` and below to the upstream: the limit of `/admin` holds.
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 429, "{over:?} {target}: {body}");
        }
        // What the upstream receives is the path the rules matched, without
        // parameters: the upstream reads it as sent.
        for (target, served) in [
            ("/shop/cart;jsessionid=1", "/shop/cart"),
            ("/api;v=2/items/..;/orders", "/api/orders"),
            ("/x/..;/public/", "/public/"),
        ] {
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 200, "{over:?} {target}: {body}");
            assert_eq!(body, format!("servlet {served}"), "{over:?} {target}");
            assert_eq!(servlet.take(), [served], "{over:?} {target}");
        }
        // A `..` above the root and double encoding are still refused.
        for target in ["/..;/admin", "/%252e%252e/admin"] {
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 400, "{over:?} {target}: {body}");
        }
    }
    assert_eq!(servlet.take(), Vec::<String>::new());
}

#[tokio::test]
async fn an_unknown_path_dialect_is_refused_with_the_config() {
    let servlet = Servlet::start().await;
    let agent = agent()
        .config(PROTECTED)
        .upstream(&Upstream::at(servlet.addr))
        .start()
        .await;
    let wire = gov_proto::v1::TargetConfig {
        service: "shop".into(),
        consumer_header: "x-gov-consumer".into(),
        paths: 99,
        ..Default::default()
    };
    let refused = agent.sidecar.engine().apply_target(&wire);
    assert!(
        matches!(refused, Err(gov_engine::InvalidConfig::Paths { value: 99 })),
        "{refused:?}"
    );
    // The config in force (the default dialect) still holds.
    let (status, _) = get(&agent, Over::Http11, "/x/..;/admin/").await;
    assert_eq!(status, 400);
}

/// What a case-insensitive upstream (IIS) makes of a path: its ASCII letters in
/// lower case (after [`servlet_path`] for a Servlet container that ignores case).
fn folded(path: &str) -> String {
    path.to_ascii_lowercase()
}

/// The spellings of `/admin` and below in other cases.
const CASES: [&str; 6] = [
    "/ADMIN/",
    "/Admin/",
    "/%41dmin/",
    "/%41DMIN/secret",
    "//aDmIn/./x",
    "/x/../ADMIN",
];

#[tokio::test]
async fn paths_case_insensitive_matches_every_case_of_a_protected_path() {
    let servlet = Servlet::start().await;
    let config = PROTECTED.replace(
        "version: paths-v1\n",
        "version: paths-v1\npaths: PATH_DIALECT_STRICT_CASE_INSENSITIVE\n",
    );
    let agent = protected(&servlet, &config).await;
    for over in OVER {
        for target in CASES {
            // `/admin` and below to a case-insensitive upstream.
            assert!(
                servlet_path(target).is_some_and(|p| folded(&p).starts_with("/admin")),
                "{target}"
            );
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 429, "{over:?} {target}: {body}");
        }
        // Parameters are read as without the word (strict), in any case.
        for target in ["/x/..;/ADMIN/", "/;x/Admin/", "/ADMIN;x/"] {
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 400, "{over:?} {target}: {body}");
            assert!(body.contains("`;` parameter"), "{over:?} {target}: {body}");
        }
        let (status, _) = get(&agent, over, "/Admin;jsessionid=1").await;
        assert_eq!(status, 429, "{over:?}");
        // Double encoding, and letters whose case is an ASCII letter.
        for (target, refusal) in [
            ("/%2561dmin", "double-encoded"),
            ("/%2541DMIN/", "double-encoded"),
            ("/adm%C4%B1n/", "whose case is an ASCII letter"),
            ("/%E2%84%AAey/", "whose case is an ASCII letter"),
        ] {
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 400, "{over:?} {target}: {body}");
            assert!(body.contains(refusal), "{over:?} {target}: {body}");
        }
        // The upstream receives the normalized path with its case as sent.
        let (status, body) = get(&agent, over, "/Shop/%43art").await;
        assert_eq!((status, body.as_str()), (200, "servlet /Shop/Cart"));
        assert_eq!(servlet.take(), ["/Shop/Cart"], "{over:?}");
    }
    assert_eq!(servlet.take(), Vec::<String>::new());
}

#[tokio::test]
async fn paths_servlet_case_insensitive_matches_parameters_and_case_together() {
    let servlet = Servlet::start().await;
    let config = PROTECTED.replace(
        "version: paths-v1\n",
        "version: paths-v1\npaths: PATH_DIALECT_SERVLET_CASE_INSENSITIVE\n",
    );
    let agent = protected(&servlet, &config).await;
    for over in OVER {
        for target in BYPASSES.iter().chain(&CASES).chain(&[
            "/x/..;/ADMIN/",
            "/.;/Admin/",
            "/;x/%41dmin/",
            "/ADMIN;jsessionid=1/secret",
        ]) {
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 429, "{over:?} {target}: {body}");
        }
        let (status, body) = get(&agent, over, "/x/..;/Shop/Cart;jsessionid=1").await;
        assert_eq!((status, body.as_str()), (200, "servlet /Shop/Cart"));
        assert_eq!(servlet.take(), ["/Shop/Cart"], "{over:?}");
        for target in ["/..;/ADMIN", "/%2561dmin", "/adm%C4%B1n;x/"] {
            let (status, body) = get(&agent, over, target).await;
            assert_eq!(status, 400, "{over:?} {target}: {body}");
        }
    }
    assert_eq!(servlet.take(), Vec::<String>::new());
}

#[tokio::test]
async fn by_default_case_counts_and_the_upstream_receives_the_case_sent() {
    // Documented: without `paths case-insensitive`, `/ADMIN` is another path.
    let servlet = Servlet::start().await;
    let agent = protected(&servlet, PROTECTED).await;
    for over in OVER {
        let (status, body) = get(&agent, over, "/%41DMIN/").await;
        assert_eq!((status, body.as_str()), (200, "servlet /ADMIN/"));
        assert_eq!(servlet.take(), ["/ADMIN/"], "{over:?}");
    }
}
