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
    });
    let large = client.status(request).await.unwrap_err();
    assert_eq!(large.code(), tonic::Code::ResourceExhausted, "{large:?}");
    govd.stop().await;
}
