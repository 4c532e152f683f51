//! Rules in mode shadow through the proxy: nothing is rejected, what would
//! have been is counted in `/metrics` and, with `stamp`, named to the
//! upstream in `gov-would-reject-by`, a header no client can forge (on the
//! HTTP/1 path and on hyper's).

use bytes::Bytes;
use gov_engine::WOULD_REJECT_BY;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::{agent, http, upstream};

/// A shadow limit of one call per hour on `/trial`, stamped; `/free` has no rule.
const SHADOW: &str = r#"
service: shop
version: shadow-v1
rules:
  - name: shop/trial
    on: { path: { kind: PATH_KIND_PREFIX, value: /trial } }
    mode: MODE_SHADOW
    stamp_would_reject: true
    limit:
      calls: { amount: 1, window_ms: 3600000 }
"#;

const FORGED: (&str, &str) = (WOULD_REJECT_BY, "shop/forged");

#[tokio::test]
async fn a_shadow_limit_rejects_nothing_and_only_the_agent_names_it_upstream() {
    let up = upstream()
        .would_reject_by("/trial")
        .would_reject_by("/free")
        .start()
        .await;
    let agent = agent().config(SHADOW).upstream(&up).start().await;
    let client = http();
    let seen = |r: Result<crate::support::Reply, String>| {
        let r = r.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        r.text()
    };

    // HTTP/1 (the agent's own codec). A forged header never gets through.
    assert_eq!(
        seen(client.get_with(&agent.url("/free"), &[FORGED]).await),
        "-"
    );
    assert_eq!(
        seen(client.get_with(&agent.url("/trial"), &[FORGED]).await),
        "-"
    );
    // Over the limit: admitted all the same, named by the agent alone.
    for _ in 0..3 {
        assert_eq!(
            seen(
                client
                    .get_with(&agent.url("/trial"), &[FORGED, FORGED])
                    .await
            ),
            "shop/trial"
        );
    }

    // HTTP/2 (hyper's path), the same.
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for (path, expected) in [("/trial", "shop/trial"), ("/free", "-")] {
        let req = Request::get(agent.url(path))
            .header(FORGED.0, FORGED.1)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = h2.request(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], expected.as_bytes(), "{path} over h2");
    }

    let metrics = client
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    for line in [
        "gov_agent_shadow_rejected_total{rule=\"shop/trial\",reason=\"limit_calls\"} 4",
        "gov_agent_rule_rejected_total{rule=\"shop/trial\",reason=\"limit_calls\"} 0",
        "gov_agent_rule_admitted_total{rule=\"shop/trial\"} 1",
    ] {
        assert!(metrics.contains(line), "no `{line}` in\n{metrics}");
    }
}
