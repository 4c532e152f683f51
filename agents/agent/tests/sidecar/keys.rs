//! Limits keyed on request attributes (issue 38), end to end: the built
//! `gov-agent` process in front of a real upstream, over HTTP/1.

use http::{Request, StatusCode};
use http_body_util::Full;

use crate::support::{Http, binary, http, ms, upstream};

/// `calls 3 per 1h` in fixed windows, keyed as `parts` (YAML), at most
/// `max_keys` keys with `overflow`.
fn config(parts: &str, max_keys: u32, overflow: &str) -> String {
    format!(
        r#"
service: shop
version: keys-v1
rules:
  - name: shop/per_tenant
    on: {{ path: {{ kind: PATH_KIND_PREFIX, value: / }} }}
    limit:
      calls: {{ amount: 3, window_ms: 3600000 }}
      algorithm: LIMIT_ALGORITHM_FIXED_WINDOW
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
      max_keys: {max_keys}
      overflow: {overflow}
      key_parts: {parts}
"#
    )
}

async fn status(client: &Http, url: &str, headers: &[(&str, &str)]) -> StatusCode {
    client.get_with(url, headers).await.unwrap().status
}

/// How many of `n` calls with `headers` were admitted (200; every other
/// answer must be the limit's 429).
async fn admitted(client: &Http, url: &str, headers: &[(&str, &str)], n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        match status(client, url, headers).await {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{headers:?}: {other}"),
        }
    }
    ok
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l.contains("shop/per_tenant"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
}

/// Two tenants by header are limited apart; calls without the header share
/// one counter (`%absent`), which spends no tenant's budget; the header sent
/// twice is refused before the decision; a huge value is one more shared
/// counter; and a flood of distinct values, past `max_keys` engaged keys,
/// goes to the overflow (refused here), leaving exhausted tenants exhausted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_by_header_are_limited_apart_and_a_flood_of_values_overflows() {
    let up = upstream().fast("/orders", ms(1)).start().await;
    let agent = binary()
        .config(&config("[{ header: x-tenant }]", 6, "KEY_OVERFLOW_REJECT"))
        .upstream(&up)
        .spawn();
    let client = http();
    let url = agent.url("/orders");

    assert_eq!(admitted(&client, &url, &[("x-tenant", "acme")], 5).await, 3);
    // The name is case-insensitive; zeta has its own budget.
    assert_eq!(admitted(&client, &url, &[("X-Tenant", "zeta")], 5).await, 3);
    assert_eq!(admitted(&client, &url, &[("x-tenant", "acme")], 1).await, 0);

    // Without the header (or empty): one shared budget, as documented.
    assert_eq!(admitted(&client, &url, &[], 2).await, 2);
    assert_eq!(admitted(&client, &url, &[("x-tenant", "")], 2).await, 1);

    // The header twice: the engine and the upstream could read different
    // copies, so the call is refused (400) and counts nowhere.
    let mut twice = Request::get(&url);
    twice = twice.header("x-tenant", "acme").header("x-tenant", "fresh");
    let reply = client
        .send(twice.body(Full::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());

    // Values over 128 bytes share one counter, however they differ.
    let huge: Vec<String> = (0..4).map(|i| format!("{i}{}", "x".repeat(4000))).collect();
    let mut over = 0;
    for v in &huge {
        over += admitted(&client, &url, &[("x-tenant", v)], 1).await;
    }
    assert_eq!(over, 3, "four oversized values, one budget of 3");

    // Separator and Redis-syntax characters cannot forge another key:
    // `acme|x` and `acme}` are keys of their own, not acme's.
    assert_eq!(
        admitted(&client, &url, &[("x-tenant", "acme}")], 1).await,
        1
    );

    // acme, zeta, %absent, %invalid, `acme}` hold 5 of 6 keys: a flood of
    // distinct tenants gets one key, then every new one is refused.
    let mut flood_ok = 0;
    for i in 0..200 {
        let tenant = format!("t{i}");
        flood_ok += admitted(&client, &url, &[("x-tenant", &tenant)], 1).await;
    }
    assert_eq!(flood_ok, 1, "one free key, then the overflow refuses");
    assert_eq!(admitted(&client, &url, &[("x-tenant", "acme")], 1).await, 0);
    assert_eq!(admitted(&client, &url, &[("x-tenant", "zeta")], 1).await, 0);

    let metrics = client
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert_eq!(
        metric(&metrics, "gov_agent_rule_keys_overflowed_total"),
        199
    );
    assert_eq!(metric(&metrics, "gov_agent_rule_keys{"), 6);
}

/// Keys on a query parameter read it decoded, as the upstream's form
/// decoding does: `%61pi_key=k1` is `api_key=k1`; the parameter sent twice
/// (in any spelling) is the shared `%invalid` counter, so rotating a second
/// copy earns no fresh budget; combined with a header, each pair counts apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_keys_are_read_decoded_and_duplicates_earn_no_fresh_budget() {
    let up = upstream().fast("/orders", ms(1)).start().await;
    let agent = binary()
        .config(&config(
            "[{ query: api_key }, { header: x-tenant }]",
            0,
            "KEY_OVERFLOW_SHARE",
        ))
        .upstream(&up)
        .spawn();
    let client = http();
    let q = |query: &str| agent.url(&format!("/orders?{query}"));
    let acme = [("x-tenant", "acme")];

    let mut k1 = 0;
    for query in [
        "api_key=k1",
        "%61pi_key=k%31",
        "x=1&api%5Fkey=k1",
        "api_key=k1",
    ] {
        k1 += admitted(&client, &q(query), &acme, 1).await;
    }
    assert_eq!(k1, 3, "four spellings of k1, one budget");
    // The same key under another tenant counts apart.
    assert_eq!(
        admitted(&client, &q("api_key=k1"), &[("x-tenant", "zeta")], 1).await,
        1
    );

    // Rotating a second copy of the parameter: one shared budget.
    let mut dup = 0;
    for i in 0..6 {
        dup += admitted(&client, &q(&format!("api_key=k1&api_key=r{i}")), &acme, 1).await;
    }
    assert_eq!(dup, 3, "duplicated parameters share `%invalid`");
    // `+` and `%20` are one value.
    assert_eq!(admitted(&client, &q("api_key=a+b"), &acme, 2).await, 2);
    assert_eq!(admitted(&client, &q("api_key=a%20b"), &acme, 2).await, 1);
}
