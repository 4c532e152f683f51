//! Floods from peers that prove nothing (issue 28): govd's memory and
//! connection slots stay its own. Each test measures the real govd's
//! memory from `/proc/PID/status`.

use super::*;

/// `VmHWM` (peak resident set) and `VmRSS` of `govd`, in bytes.
fn memory(govd: &Govd) -> (u64, u64) {
    let pid = govd.child.id().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// An `Apply` of about `bytes` bytes of comments, in files of 1 MiB.
fn large_apply(bytes: usize) -> pb::ApplyRequest {
    let sources = (0..bytes.div_ceil(1 << 20))
        .map(|i| pb::SourceFile {
            name: format!("comment-{i}.gov"),
            text: format!("# {}\n", "x".repeat((1 << 20) - 3)),
        })
        .collect();
    pb::ApplyRequest {
        sources,
        dry_run: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_applies_without_a_token_are_refused_before_govd_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let (_, before) = memory(&govd);
    // 16 token-less Applies of 16 MB at once, each on its own connection.
    let floods = (0..16).map(|_| {
        let url = govd.url();
        tokio::spawn(async move {
            let mut client = gov_control_plane::client::connect(&url, Duration::from_secs(5))
                .await
                .unwrap();
            client.apply(large_apply(16 << 20)).await
        })
    });
    for flood in futures::future::join_all(floods).await {
        let refused = flood.unwrap().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        assert!(
            refused.message().contains("`Apply` needs a token"),
            "{}",
            refused.message()
        );
    }
    let (peak, after) = memory(&govd);
    eprintln!(
        "govd memory: {} MB before, peak {} MB, {} MB after 16 token-less 16 MB Applies",
        before >> 20,
        peak >> 20,
        after >> 20
    );
    assert!(
        peak < 60 << 20,
        "govd's peak RSS reached {} MB: it read token-less requests",
        peak >> 20
    );
    // A person with a token still applies a large policy.
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let mut request = tonic::Request::new(large_apply(2 << 20));
    gov_control_plane::auth::authorize(&mut request, TOKEN).unwrap();
    let planned = client.apply(request).await.unwrap().into_inner();
    assert!(planned.plan.is_some(), "{:?}", planned.diagnostics);
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_open_to_anyone_carries_only_a_small_message() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    let channel = tonic::transport::Endpoint::from_shared(govd.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let check = |service: String| tonic_health::pb::HealthCheckRequest { service };
    let small = health.check(check("nope".into())).await.unwrap_err();
    assert_eq!(small.code(), tonic::Code::NotFound, "{small:?}");
    let large = health.check(check("x".repeat(1 << 20))).await.unwrap_err();
    assert_eq!(large.code(), tonic::Code::ResourceExhausted, "{large:?}");
    assert!(
        large.message().contains("the most govd reads for it"),
        "{}",
        large.message()
    );
    // A viewer's read is as small: a 1 MB service name in `Status` is refused.
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let request = as_viewer(pb::StatusRequest {
        service: "x".repeat(1 << 20),
        ..Default::default()
    });
    let large = client.status(request).await.unwrap_err();
    assert_eq!(large.code(), tonic::Code::ResourceExhausted, "{large:?}");
    govd.stop().await;
}

/// Opens `n` sockets to `govd` from `source` that send the HTTP/2 preface
/// and nothing more: past the handshake deadline, never a call.
async fn idle_sockets(govd: &Govd, source: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    let mut held = Vec::new();
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        let Ok(mut stream) = socket.connect(govd.addr).await else {
            continue;
        };
        // govd may have closed it already (over its address's cap).
        let _ = stream.write_all(PREFACE).await;
        held.push(stream);
    }
    held
}

/// The value of the sample `name` (labels included) in govd's `/metrics`.
async fn govd_sample(govd: &Govd, name: &str) -> u64 {
    let (_, _, body) = http_get(govd.metrics.unwrap(), "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in /metrics:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_without_a_token_do_not_keep_govc_out() {
    let dir = tempfile::tempdir().unwrap();
    // Pings every hour: an idle socket is not closed for being silent (as
    // one that answers PINGs would not be); only for proving nothing.
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .args(&[
            "--max-connections",
            "20",
            "--max-connections-per-client",
            "10",
            "--auth-timeout",
            "2s",
            "--http2-keepalive-interval",
            "1h",
        ])
        .start()
        .await;
    // Another host (127.0.0.2) opens 30: it holds 10 slots at most.
    let other_host = idle_sockets(&govd, "127.0.0.2", 30).await;
    let started = Instant::now();
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        govd_sample(
            &govd,
            "govd_connections_closed_total{reason=\"client_cap\"}"
        )
        .await
            >= 20
    );

    // govc's own address fills the rest: govc gets in once the idle ones
    // are closed for making no authenticated call (2s).
    let same_host = idle_sockets(&govd, "127.0.0.1", 30).await;
    let started = Instant::now();
    wait_until(
        "govc status to get in",
        Duration::from_secs(15),
        async || govc(&govd, Some(VIEWER_TOKEN), &["status"]).await.code == 0,
    )
    .await;
    eprintln!("govc status got in after {:?}", started.elapsed());
    let closed = govd_sample(
        &govd,
        "govd_connections_closed_total{reason=\"unauthenticated\"}",
    )
    .await;
    assert!(closed >= 20, "{closed} closed for proving nothing");
    // A connection that proved itself stays: a fake agent's stream outlives
    // the auth timeout.
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let mut request = tonic::Request::new(pb::StatusRequest::default());
    gov_control_plane::auth::authorize(&mut request, VIEWER_TOKEN).unwrap();
    client.status(request).await.unwrap();
    let open = govd_sample(&govd, "govd_connections_open").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(govd_sample(&govd, "govd_connections_open").await, open);
    drop((other_host, same_host));
    govd.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_watch_stay_readable_over_many_agents_with_large_labels() {
    use super::agent_identity::{fake_agent, hello};
    let dir = tempfile::tempdir().unwrap();
    // Caps raised so that 30 agents bring 2.5 MB of labels each: a 75 MB
    // view, over govc's 64 MiB decode limit.
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .args(&[
            "--max-agent-label-bytes",
            "3000000",
            "--max-agent-string-bytes",
            "3000000",
            "--max-watches-per-token",
            "2",
        ])
        .start()
        .await;
    let token = service_agent_token("order");
    let mut agents = Vec::new();
    for i in 0..30 {
        let mut hello = hello("order", &format!("order-{i}"));
        hello.labels.insert("blob".into(), "x".repeat(2_500_000));
        agents.push(fake_agent(&govd, Some(&token), hello).await.unwrap());
    }
    let status = govc(&govd, Some(VIEWER_TOKEN), &["status"]).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let view = govd.status().await;
    assert!(view.labels_left_out);
    assert_eq!(view.agents.len() + view.agents_left_out as usize, 30);
    assert!(
        prost::Message::encoded_len(&view) <= 16 << 20,
        "{}",
        prost::Message::encoded_len(&view)
    );
    // Two Watch streams per token; a third is refused until one closes.
    let mut client = gov_control_plane::client::connect(&govd.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let mut first = client
        .watch(as_viewer(pb::WatchRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let view = first.message().await.unwrap().unwrap();
    assert!(view.labels_left_out);
    let _second = client
        .watch(as_viewer(pb::WatchRequest::default()))
        .await
        .unwrap();
    let third = client
        .watch(as_viewer(pb::WatchRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third:?}");
    assert!(
        third.message().contains("--max-watches-per-token"),
        "{}",
        third.message()
    );
    assert_eq!(govd_sample(&govd, "govd_watch_refusals_total").await, 1);
    drop(first);
    wait_until(
        "a closed Watch to free its slot",
        Duration::from_secs(10),
        async || {
            client
                .watch(as_viewer(pb::WatchRequest::default()))
                .await
                .is_ok()
        },
    )
    .await;
    let (peak, now) = memory(&govd);
    eprintln!(
        "govd memory with 30 agents of 2.5 MB labels: peak {} MB, now {} MB",
        peak >> 20,
        now >> 20
    );
    drop(agents);
    // Its state holds 75 MB of labels: a debug build on a busy machine takes
    // seconds to write it.
    govd.stop_within(Duration::from_secs(60)).await;
}

/// Issue 35: a storm of new agent streams over `--agent-admissions-per-second`
/// is taken in at the rate; the streams whose turn is too far away are
/// refused with UNAVAILABLE, named, and counted in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_streams_beyond_the_admission_rate_are_refused_and_counted() {
    use super::agent_identity::{fake_agent, hello};
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state"))
        .metrics()
        .args(&["--agent-admissions-per-second", "1"])
        .start()
        .await;
    assert_eq!(
        govd_sample(&govd, "govd_agent_admissions_refused_total").await,
        0
    );
    // One a second, a second's burst, turns at most 3 s away: of 8 at
    // once, 2 now and 3 within 3 s; the rest are refused.
    let token = service_agent_token("order");
    let storm: Vec<_> = (0..8)
        .map(|i| {
            let (govd, token) = (&govd, &token);
            async move { fake_agent(govd, Some(token), hello("order", &format!("order-{i}"))).await }
        })
        .collect();
    let (mut admitted, mut refused) = (Vec::new(), 0);
    for outcome in futures::future::join_all(storm).await {
        match outcome {
            Ok(agent) => admitted.push(agent),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                assert!(
                    status.message().contains("--agent-admissions-per-second"),
                    "{status:?}"
                );
                refused += 1;
            }
        }
    }
    assert!(
        admitted.len() >= 2 && refused >= 1,
        "{} admitted",
        admitted.len()
    );
    assert_eq!(admitted.len() + refused, 8);
    assert_eq!(
        govd_sample(&govd, "govd_agent_admissions_refused_total").await,
        refused as u64
    );
}
