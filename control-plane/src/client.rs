//! Reaching a control plane from `govc` (and tests): a channel with HTTP/2
//! keepalive and a connection error that says what to do.

use std::time::Duration;

use gov_common::tls::ClientTls;
use gov_proto::v1::control_plane_client::ControlPlaneClient;
use tonic::transport::Channel;

/// The default control plane address.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";

/// The control plane could not be reached.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("cannot reach the control plane at `{url}`: {reason}")]
#[diagnostic(
    code(gov::govc::unreachable),
    help(
        "is govd running? start it with `govd` (or point --control-plane / GOV_CONTROL_PLANE at it)"
    )
)]
pub struct Unreachable {
    pub url: String,
    pub reason: String,
}

/// Connects to `url` (`http://host:port`).
pub async fn connect(
    url: &str,
    timeout: Duration,
) -> Result<ControlPlaneClient<Channel>, Unreachable> {
    connect_tls(url, &ClientTls::default(), timeout).await
}

/// Connects to `url` with `tls` (`https://host:port` with TLS files,
/// `http://host:port` without). Several comma-separated URLs (govd
/// replicas): the first that answers a health check as serving within
/// `timeout`. A replica that accepts connections but does not answer
/// (stopped, hung) or is shutting down is passed over, instead of holding
/// the caller until HTTP/2 keepalive gives up on it.
pub async fn connect_tls(
    url: &str,
    tls: &ClientTls,
    timeout: Duration,
) -> Result<ControlPlaneClient<Channel>, Unreachable> {
    let urls: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    match urls[..] {
        // Nothing but commas: the error says what a URL looks like.
        [] => return connect_one(url, tls, timeout).await,
        [one] => return connect_one(one, tls, timeout).await,
        _ => {}
    }
    let mut reasons = Vec::new();
    for one in urls {
        match connect_one(one, tls, timeout).await {
            Ok(client) => return Ok(client),
            Err(e) => reasons.push(format!("{one}: {}", e.reason)),
        }
    }
    Err(Unreachable {
        url: url.to_owned(),
        reason: reasons.join("; "),
    })
}

async fn connect_one(
    url: &str,
    tls: &ClientTls,
    timeout: Duration,
) -> Result<ControlPlaneClient<Channel>, Unreachable> {
    let unreachable = |reason: String| Unreachable {
        url: url.to_owned(),
        reason,
    };
    let endpoint = tls
        .endpoint(url)
        .map_err(|e| unreachable(crate::error::one_line(&e)))?
        .connect_timeout(timeout)
        .http2_keep_alive_interval(crate::connections::KEEPALIVE_INTERVAL)
        .keep_alive_timeout(crate::connections::KEEPALIVE_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| unreachable(error_chain(&e)))?;
    probe(&channel, timeout).await.map_err(unreachable)?;
    Ok(ControlPlaneClient::new(channel).max_decoding_message_size(64 << 20))
}

/// Asks `channel`'s govd whether it serves (`grpc.health.v1`, which needs
/// no token). The kernel completes a TCP (and TLS-less HTTP/2) connect for a
/// process that is stopped, so a connect alone does not tell a live replica.
async fn probe(channel: &Channel, timeout: Duration) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let request = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    match tokio::time::timeout(timeout, health.check(request)).await {
        Err(_) => Err(format!(
            "no answer to a health check within {timeout:?}: govd is stopped, hung or overloaded"
        )),
        Ok(Err(status)) => Err(format!("health check failed: {}", status.message())),
        Ok(Ok(answer)) if answer.get_ref().status() == ServingStatus::Serving => Ok(()),
        Ok(Ok(_)) => Err("govd is shutting down (health NOT_SERVING)".to_owned()),
    }
}

/// `error: cause: cause`, for one-line messages.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        source = cause.source();
    }
    s
}
