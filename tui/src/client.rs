//! The gRPC side: a `Watch` stream kept open across control-plane restarts,
//! and the `Release` call.
//!
//! Both report through [`Msg`] values and strings, never through stdout or
//! stderr, since they run while the TUI owns the terminal.

use std::error::Error as _;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

use crate::app::Msg;
use gov_proto::v1::control_plane_client::ControlPlaneClient;
use gov_proto::v1::{ReleaseKind, ReleaseRequest, ReleaseResult, WatchRequest};

/// First and largest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How to reach the control plane.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// e.g. `http://127.0.0.1:7070`.
    pub url: String,
    /// Sent as `authorization: Bearer <token>` when set.
    pub token: Option<String>,
    /// TLS (`--tls-ca`) for an `https://` URL.
    pub tls: gov_common::tls::ClientTls,
    /// Only this service; empty: all.
    pub service: String,
}

// === impl WatchOptions ===

impl WatchOptions {
    pub(crate) fn endpoint(&self) -> Result<Endpoint, gov_common::tls::TlsError> {
        Ok(self
            .tls
            .endpoint(&self.url)?
            .connect_timeout(Duration::from_secs(3))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5)))
    }

    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, String> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            let value: MetadataValue<_> = format!("Bearer {}", token.trim())
                .parse()
                .map_err(|_| "the token contains characters not allowed in a header".to_owned())?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// `error: cause: cause`, the way operators need to read a transport failure.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

fn status_text(s: &tonic::Status) -> String {
    let mut text = format!("{}", s.code());
    if !s.message().is_empty() {
        text.push_str(": ");
        text.push_str(s.message());
    }
    if let Some(source) = s.source() {
        let chain = error_chain(source);
        if !text.contains(&chain) {
            text.push_str(": ");
            text.push_str(&chain);
        }
    }
    text
}

async fn connect(opts: &WatchOptions) -> Result<ControlPlaneClient<Channel>, String> {
    let endpoint = opts.endpoint().map_err(|e| error_chain(&e))?;
    let channel = endpoint.connect().await.map_err(|e| {
        // "transport error" says nothing the operator can act on.
        let text = error_chain(&e);
        text.strip_prefix("transport error: ")
            .map_or(text.clone(), str::to_owned)
    })?;
    Ok(ControlPlaneClient::new(channel))
}

/// Keeps a `Watch` stream open and forwards every view as [`Msg::View`].
///
/// When the stream cannot be opened or ends, sends [`Msg::Disconnected`] with
/// the reason and retries with exponential backoff (250 ms doubling to 5 s,
/// reset once a view arrives); the first view after a failure is preceded by
/// [`Msg::Reconnected`]. Returns when `tx` is closed (the TUI exited).
pub async fn watch(opts: WatchOptions, tx: mpsc::Sender<Msg>) {
    let mut backoff = BACKOFF_MIN;
    let mut failed = false;
    loop {
        let error = match watch_once(&opts, &tx, &mut failed, &mut backoff).await {
            Ok(()) => return,
            Err(e) => e,
        };
        failed = true;
        if tx.send(Msg::Disconnected(error)).await.is_err() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = tx.closed() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One stream: `Ok` when the receiver is gone, `Err` with the reason otherwise.
async fn watch_once(
    opts: &WatchOptions,
    tx: &mpsc::Sender<Msg>,
    failed: &mut bool,
    backoff: &mut Duration,
) -> Result<(), String> {
    let mut client = connect(opts).await?;
    let request = opts.request(WatchRequest {
        service: opts.service.clone(),
        ..Default::default()
    })?;
    let mut stream = client
        .watch(request)
        .await
        .map_err(|s| status_text(&s))?
        .into_inner();
    loop {
        let next = tokio::select! {
            next = stream.message() => next,
            () = tx.closed() => return Ok(()),
        };
        match next {
            Ok(Some(view)) => {
                if std::mem::take(failed) && tx.send(Msg::Reconnected).await.is_err() {
                    return Ok(());
                }
                *backoff = BACKOFF_MIN;
                if tx.send(Msg::View(view)).await.is_err() {
                    return Ok(());
                }
            }
            Ok(None) => return Err("the control plane closed the watch stream".into()),
            Err(s) => return Err(status_text(&s)),
        }
    }
}

/// Calls `Release` once; the error is a readable reason.
pub async fn release(
    opts: &WatchOptions,
    kind: ReleaseKind,
    rule: String,
    who: String,
) -> Result<ReleaseResult, String> {
    let mut client = connect(opts).await?;
    let request = opts.request(ReleaseRequest {
        kind: kind as i32,
        rule,
        who,
        // Every key of a keyed limit: the TUI releases a rule as it shows it.
        key: String::new(),
    })?;
    client
        .release(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| status_text(&s))
}
