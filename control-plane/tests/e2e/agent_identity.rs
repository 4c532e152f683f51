//! Agents prove who they are (issue 28): a fake agent, a raw gRPC client
//! speaking `Connect` as an attacker would, against a real govd with the
//! e2e token file (people and one `agent` line per service).

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::*;

/// A `Connect` stream opened by a fake agent: `token` as its bearer token,
/// `hello` sent first.
pub(super) struct FakeAgent {
    /// What it sends after the hello.
    tx: mpsc::Sender<pb::AgentMessage>,
    incoming: tonic::Streaming<pb::ControlMessage>,
}

pub(super) fn hello(service: &str, instance: &str) -> pb::Hello {
    pb::Hello {
        service: service.into(),
        instance: instance.into(),
        address: "127.0.0.1:9".into(),
        ..Default::default()
    }
}

/// Opens `Connect` as `hello` says, with `token`; govd's answer.
pub(super) async fn fake_agent(
    govd: &Govd,
    token: Option<&str>,
    hello: pb::Hello,
) -> Result<FakeAgent, tonic::Status> {
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Hello(hello)),
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        gov_control_plane::auth::authorize(&mut request, token).unwrap();
    }
    let incoming = tokio::time::timeout(Duration::from_secs(10), client.connect(request))
        .await
        .expect("govd answers a Connect within 10s")?
        .into_inner();
    Ok(FakeAgent { tx, incoming })
}

impl FakeAgent {
    /// The next config govd sends (bounded wait).
    async fn config(&mut self) -> pb::Config {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), self.incoming.message())
                .await
                .expect("a message within 10s")
                .unwrap()
                .expect("the stream is open");
            if let Some(pb::control_message::Msg::Config(config)) = msg.msg {
                return config;
            }
        }
    }
}

/// The audit records of `action`, as `govc audit -o json` prints them.
async fn audited(govd: &Govd, action: &str) -> Vec<serde_json::Value> {
    let out = govc(govd, Some(VIEWER_TOKEN), &["audit", "-o", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let all: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let records = all
        .get("records")
        .and_then(|r| r.as_array().cloned())
        .or_else(|| all.as_array().cloned())
        .unwrap_or_default();
    records
        .into_iter()
        .filter(|r| r["action"] == action)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_its_services_token_gets_no_config_and_is_not_registered() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);

    // No token: refused before the hello is read.
    let none = fake_agent(&govd, None, hello("order", "order-2"))
        .await
        .err()
        .unwrap();
    assert_eq!(none.code(), tonic::Code::Unauthenticated, "{none:?}");
    assert!(
        none.message().contains("prove who they are"),
        "{}",
        none.message()
    );
    // A token govd does not know, and a person's token: refused.
    let unknown = fake_agent(&govd, Some("guess"), hello("order", "order-2"))
        .await
        .err()
        .unwrap();
    assert_eq!(unknown.code(), tonic::Code::Unauthenticated, "{unknown:?}");
    let person = fake_agent(&govd, Some(TOKEN), hello("order", "order-2"))
        .await
        .err()
        .unwrap();
    assert_eq!(person.code(), tonic::Code::PermissionDenied, "{person:?}");
    // Another service's token: refused, and audited with the token's name.
    let other = fake_agent(
        &govd,
        Some(&service_agent_token("payment")),
        hello("order", "order-2"),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(other.code(), tonic::Code::PermissionDenied, "{other:?}");
    assert!(
        other
            .message()
            .contains("`payment-agents` may claim only the services payment"),
        "{}",
        other.message()
    );
    let refused = audited(&govd, "agent-refused").await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["who"], "agent with the token `payment-agents`");
    assert_eq!(refused[0]["targets"][0], "order/order-2");
    // None of them is known to govd: no instance, nothing to push to.
    assert!(govd.status().await.agents.is_empty());

    // Its own service's token: the config.
    let mut real = fake_agent(
        &govd,
        Some(&service_agent_token("order")),
        hello("order", "order-2"),
    )
    .await
    .unwrap();
    let config = real.config().await;
    assert_eq!(config.target.unwrap().service, "order");
    drop(real.tx);
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insecure_govd_takes_agents_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut builder = control_plane(&dir.path().join("state"));
    builder.token = false;
    let govd = builder.start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, None, &["apply", &v1]).await.code, 0);
    let mut agent = fake_agent(&govd, None, hello("order", "order-1"))
        .await
        .unwrap();
    let config = agent.config().await;
    assert_eq!(config.target.unwrap().service, "order");
    drop(agent.tx);
    govd.stop().await;
}

impl FakeAgent {
    async fn send(&self, msg: pb::agent_message::Msg) {
        self.tx
            .send(pb::AgentMessage { msg: Some(msg) })
            .await
            .unwrap();
    }
}

/// Whether `instance` is connected, as govd's view says.
async fn connected(govd: &Govd, instance: &str) -> bool {
    govd.status()
        .await
        .agents
        .iter()
        .any(|a| a.instance == instance && a.state() != pb::SyncState::Disconnected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_name_belongs_to_the_identity_that_proved_it_and_trips_name_who_reported_them()
{
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    let order = service_agent_token("order");
    let shop = service_agent_token("shop");

    // order-1 connects with order's token, then goes away.
    let real = fake_agent(&govd, Some(&order), hello("order", "order-1"))
        .await
        .unwrap();
    wait_until("order-1 connected", Duration::from_secs(10), async || {
        connected(&govd, "order-1").await
    })
    .await;
    drop(real);
    wait_until(
        "order-1 disconnected",
        Duration::from_secs(10),
        async || !connected(&govd, "order-1").await,
    )
    .await;
    // Another identity that may claim order cannot take its name, even now.
    let squatter = fake_agent(&govd, Some(&shop), hello("order", "order-1"))
        .await
        .err()
        .unwrap();
    assert_eq!(
        squatter.code(),
        tonic::Code::PermissionDenied,
        "{squatter:?}"
    );
    assert!(
        squatter
            .message()
            .contains("belongs to another agent identity")
            && !squatter.message().contains("order-agents"),
        "{}",
        squatter.message()
    );
    let refused = audited(&govd, "agent-refused").await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["who"], "agent with the token `shop-agents`");
    assert!(
        refused[0]["detail"]
            .as_str()
            .unwrap()
            .contains("held by token `order-agents`"),
        "{refused:?}"
    );
    // The holder comes back under its name.
    let back = fake_agent(&govd, Some(&order), hello("order", "order-1")).await;
    assert!(back.is_ok(), "{:?}", back.err());

    // A trip reported under a name is audited with the identity that reported it.
    let planter = fake_agent(&govd, Some(&shop), hello("order", "order-9"))
        .await
        .unwrap();
    planter
        .send(pb::agent_message::Msg::Event(pb::Event {
            kind: pb::EventKind::FuseTripped as i32,
            rule: "order/errors".into(),
            reason: "planted".into(),
            ..Default::default()
        }))
        .await;
    let mut trips = Vec::new();
    wait_until("the trip audited", Duration::from_secs(10), async || {
        trips = audited(&govd, "trip").await;
        !trips.is_empty()
    })
    .await;
    assert_eq!(
        trips[0]["who"], "agent order/order-9 (token `shop-agents`)",
        "{trips:?}"
    );
    drop(back);
    drop(planter);
    govd.stop().await;
}

/// `name{labels}` in govd's `/metrics`.
async fn govd_metric(govd: &Govd, sample: &str) -> u64 {
    let (_, _, body) = http_get(govd.metrics.unwrap(), "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{sample}` in:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_cannot_grow_govds_state_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .args(&[
            "--max-agents-per-service",
            "2",
            "--max-agent-label-bytes",
            "1000",
            "--max-agent-string-bytes",
            "100",
            "--agent-retention",
            "1s",
        ])
        .start()
        .await;
    let order = service_agent_token("order");
    let refusals = async |cap: &str| {
        govd_metric(
            &govd,
            &format!("govd_agent_refusals_total{{limit=\"{cap}\"}}"),
        )
        .await
    };
    assert_eq!(refusals("agents_per_service").await, 0);

    // Labels and strings over the caps: refused, nothing kept.
    let mut heavy = hello("order", "heavy");
    for i in 0..20 {
        heavy.labels.insert(format!("k{i}"), "v".repeat(90));
    }
    let refused = fake_agent(&govd, Some(&order), heavy).await.err().unwrap();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("--max-agent-label-bytes"),
        "{}",
        refused.message()
    );
    let long = fake_agent(&govd, Some(&order), hello("order", &"x".repeat(101)))
        .await
        .err()
        .unwrap();
    assert_eq!(long.code(), tonic::Code::ResourceExhausted, "{long:?}");
    assert_eq!(refusals("label_bytes").await, 1);
    assert_eq!(refusals("string_bytes").await, 1);

    // Two instances per service; a third is refused, another service is not.
    let a = fake_agent(&govd, Some(&order), hello("order", "a"))
        .await
        .unwrap();
    let b = fake_agent(&govd, Some(&order), hello("order", "b"))
        .await
        .unwrap();
    wait_until("a and b connected", Duration::from_secs(10), async || {
        connected(&govd, "a").await && connected(&govd, "b").await
    })
    .await;
    let third = fake_agent(&govd, Some(&order), hello("order", "c"))
        .await
        .err()
        .unwrap();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third:?}");
    assert!(
        third.message().contains("--max-agents-per-service"),
        "{}",
        third.message()
    );
    assert_eq!(refusals("agents_per_service").await, 1);
    let pay = fake_agent(
        &govd,
        Some(&service_agent_token("payment")),
        hello("payment", "p"),
    )
    .await;
    assert!(pay.is_ok(), "{:?}", pay.err());
    assert_eq!(govd.status().await.agents.len(), 3);

    // `a` goes away; after the retention it is forgotten (audited) and `c` fits.
    drop(a);
    wait_until("a disconnected", Duration::from_secs(10), async || {
        !connected(&govd, "a").await
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let c = fake_agent(&govd, Some(&order), hello("order", "c")).await;
    assert!(c.is_ok(), "{:?}", c.err());
    let mut names: Vec<String> = govd
        .status()
        .await
        .agents
        .into_iter()
        .map(|a| a.instance)
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["b", "c", "p"]);
    let pruned = audited(&govd, "agents-pruned").await;
    assert_eq!(pruned.len(), 1, "{pruned:?}");
    assert_eq!(pruned[0]["targets"][0], "order/a");
    assert_eq!(govd_metric(&govd, "govd_agents_pruned_total").await, 1);
    drop((b, pay, c));
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn govc_shows_terminal_escapes_from_agents_instead_of_obeying_them() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let v1 = write(dir.path(), "v1.gov", V1);
    assert_eq!(govc(&govd, Some(TOKEN), &["apply", &v1]).await.code, 0);
    let mut evil = hello("order", "evil\u{1b}[2J");
    evil.address = "10.0.0.9:80\r\nforged row".into();
    let agent = fake_agent(&govd, Some(&service_agent_token("order")), evil)
        .await
        .unwrap();
    agent
        .send(pb::agent_message::Msg::Event(pb::Event {
            kind: pb::EventKind::FuseTripped as i32,
            rule: "order/errors".into(),
            reason: "\u{1b}]0;owned\u{7}\u{1b}[8m".into(),
            ..Default::default()
        }))
        .await;
    wait_until("the trip audited", Duration::from_secs(10), async || {
        !audited(&govd, "trip").await.is_empty()
    })
    .await;
    for args in [&["status"][..], &["audit"][..]] {
        let out = govc(&govd, Some(VIEWER_TOKEN), args).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert!(
            !out.stdout.contains('\u{1b}')
                && !out.stdout.contains('\r')
                && !out.stdout.contains('\u{7}'),
            "{args:?}: {:?}",
            out.stdout
        );
        assert!(
            out.stdout.contains("evil\\x1b[2J"),
            "{args:?}: {}",
            out.stdout
        );
    }
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await.stdout;
    assert!(status.contains("10.0.0.9:80\\r\\nforged row"), "{status}");
    assert!(status.contains("\\x1b]0;owned\\x07\\x1b[8m"), "{status}");
    drop(agent);
    govd.stop().await;
}
