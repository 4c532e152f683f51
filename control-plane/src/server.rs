//! The gRPC adapter: `gov.v1.ControlPlane` on top of [`ControlPlane`].
//! Each method authenticates, converts the request at the edge and calls
//! the use case (`apply.rs`, `control_plane.rs`); agent streams are read
//! here and fed into the state. [`serve`] runs it, with the health
//! service, on one listener.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use gov_proto::v1 as pb;
use pb::control_plane_server::ControlPlane as ControlPlaneRpc;
use tokio::net::TcpListener;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::agent_streams::GrpcService;
use crate::apply::{ApplyError, ApplyRequest};
use crate::auth::Role;
use crate::control_plane::{ControlPlane, ReleaseError};
use crate::error::Error;
use crate::latch::LatchKind;
use crate::store::Source;
use crate::view::{MAX_VIEW_BYTES, bounded, filter_view, select_agents};

/// Room for the rest of an `ApplyRequest` (names, who) beyond the policy
/// text, so that an oversized policy gets our message, not tonic's.
const APPLY_OVERHEAD_BYTES: usize = 64 << 10;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Serves `control_plane` on `listener` until `shutdown` is cancelled, then:
/// health NOT_SERVING, agent and watch streams closed, in-flight calls
/// drained (at most `drain`), state flushed to disk.
pub async fn serve(
    listener: TcpListener,
    control_plane: ControlPlane,
    shutdown: CancellationToken,
    drain: Duration,
) -> Result<(), Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<pb::control_plane_server::ControlPlaneServer<ControlPlane>>()
        .await;
    // No Nagle: a response's headers, data and trailers go out at once instead of
    // waiting for the peer's delayed ACK (about 40ms per small RPC otherwise).
    let limits = control_plane.inner.connections;
    let incoming = tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(limits.tcp_keepalive));
    let registry = control_plane.inner.metrics.connections.clone();
    let incoming = crate::connections::capped(incoming, limits, registry);
    let signal = {
        let shutdown = shutdown.clone();
        let reporter = reporter.clone();
        async move {
            shutdown.cancelled().await;
            reporter
                .set_not_serving::<pb::control_plane_server::ControlPlaneServer<ControlPlane>>()
                .await;
            reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        }
    };
    // Tokens are checked from the headers before a body is read (`gate.rs`).
    let router = tonic::transport::Server::builder()
        .layer(crate::gate::GateLayer::new(control_plane.inner.clone()))
        .http2_keepalive_interval(Some(limits.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
        .max_concurrent_streams(limits.max_streams_per_connection)
        .add_service(health)
        .add_service(control_plane.grpc());
    // The TLS handshake is govd's own (`tls_server.rs`), so that a refused
    // client certificate is audited.
    let server: Pin<
        Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>,
    > = match control_plane.inner.tls.clone() {
        Some(mut tls) => {
            tls.handshake_timeout = limits.handshake_timeout;
            let incoming = tls.accept(
                incoming,
                crate::certify::on_refused_certificate(&control_plane.inner),
            );
            Box::pin(router.serve_with_incoming_shutdown(incoming, signal))
        }
        None => Box::pin(router.serve_with_incoming_shutdown(incoming, signal)),
    };
    let mut server = std::pin::pin!(server);
    tokio::select! {
        result = &mut server => {
            // The server stopped on its own: that is an error unless we were stopping.
            result.map_err(Error::Serve)?;
        }
        () = shutdown.cancelled() => {
            tracing::info!("stopping: NOT_SERVING, closing streams, draining");
            match tokio::time::timeout(drain, &mut server).await {
                Ok(result) => result.map_err(Error::Serve)?,
                Err(_) => tracing::warn!(?drain, "drain deadline passed; closing remaining connections"),
            }
        }
    }
    control_plane.flush().await?;
    tracing::info!("state flushed; stopped");
    Ok(())
}

impl ControlPlane {
    /// The gRPC service. It decodes requests up to the policy size limit
    /// (tonic's own default, 4 MiB, would refuse a larger policy with a
    /// message that names no flag).
    pub fn grpc(&self) -> GrpcService {
        let max = self
            .inner
            .limits
            .max_policy_bytes
            .saturating_add(APPLY_OVERHEAD_BYTES);
        GrpcService::new(self, max)
    }
}

/// An apply error as the client reads it: the code says whose fault it is,
/// the message says what is wrong and what to do.
fn apply_status(error: &ApplyError) -> Status {
    let message = crate::error::one_line(error);
    match error {
        ApplyError::NoSources
        | ApplyError::UnnamedSource { .. }
        | ApplyError::ShadowExactLimit { .. } => Status::invalid_argument(message),
        ApplyError::TooLarge(_) => Status::resource_exhausted(message),
        ApplyError::Audit(_) | ApplyError::Store(_) => Status::failed_precondition(message),
        ApplyError::Compiler(_) => Status::internal(message),
        ApplyError::Cancelled => Status::cancelled(message),
        ApplyError::Conflict { .. } => Status::aborted(message),
        ApplyError::RemovesEveryService { .. }
        | ApplyError::StalePlan { .. }
        | ApplyError::CanaryRunning { .. }
        | ApplyError::NoCanaryInstances { .. } => Status::failed_precondition(message),
        ApplyError::Canary(e) => crate::rollout::canary_status(e),
    }
}

// === the gRPC service ===

#[tonic::async_trait]
impl ControlPlaneRpc for ControlPlane {
    async fn apply(
        &self,
        request: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::ApplyResult>, Status> {
        // A dry run shows the policy in force and costs a compile: it needs
        // the role an apply needs.
        let claimed = request.get_ref().who.clone();
        let caller = self
            .inner
            .tokens()
            .caller(&request, Role::Admin, "Apply", &claimed)?;
        let req = request.into_inner();
        let request = ApplyRequest {
            sources: req
                .sources
                .into_iter()
                .map(|s| Source {
                    name: s.name,
                    text: s.text,
                })
                .collect(),
            who: caller.name,
            dry_run: req.dry_run,
            shadow: req.shadow,
            allow_remove_all: req.allow_remove_all,
            expect_version: req.expect_version,
            rollback_to: req.rollback_to,
            wait: Duration::from_millis(u64::from(req.wait_ms)),
            canary: match &req.canary {
                Some(c) => Some(crate::canary::spec(c).map_err(|e| apply_status(&e.into()))?),
                None => None,
            },
        };
        self.apply(request)
            .await
            .map(Response::new)
            .map_err(|e| apply_status(&e))
    }

    type ConnectStream = BoxStream<pb::ControlMessage>;

    /// Served by `GrpcService` on pre-encoded messages; this decodes them
    /// again, for a server built on the generated service alone.
    async fn connect(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let stream = self.agent_stream(request).await?;
        let decoded = stream.map(|m| {
            m.and_then(|m| {
                m.decode()
                    .map_err(|e| Status::internal(format!("cannot decode a push: {e}")))
            })
        });
        Ok(Response::new(Box::pin(decoded)))
    }

    type WatchStream = BoxStream<pb::ClusterView>;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = self
            .inner
            .tokens()
            .caller(&request, Role::Viewer, "Watch", "")?;
        let max = self.inner.connections.max_watches_per_token;
        let Some(slot) = self.inner.metrics.watches.open(&caller.name, max) else {
            return Err(Status::resource_exhausted(format!(
                "the token `{}` has {max} Watch streams open, govd's cap (--max-watches-per-token); close one (a TUI) first",
                caller.name
            )));
        };
        let request = request.into_inner();
        let (service, rows, max) = (
            request.service.clone(),
            request.agent_rows(),
            request.max_agents,
        );
        // The slot is given back when the stream is dropped.
        let stream = WatchStream::new(self.inner.subscribe_view())
            .map(move |view| {
                let _held = &slot;
                let view = filter_view((*view).clone(), &service);
                Ok(bounded(select_agents(view, rows, max), MAX_VIEW_BYTES))
            })
            .take_until(self.inner.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::ClusterView>, Status> {
        self.inner
            .tokens()
            .caller(&request, Role::Viewer, "Status", "")?;
        let request = request.into_inner();
        let view = filter_view(self.status(), &request.service);
        let view = select_agents(view, request.agent_rows(), request.max_agents);
        Ok(Response::new(bounded(view, MAX_VIEW_BYTES)))
    }

    async fn audit(
        &self,
        request: Request<pb::AuditRequest>,
    ) -> Result<Response<pb::AuditResult>, Status> {
        self.inner
            .tokens()
            .caller(&request, Role::Viewer, "Audit", "")?;
        let req = request.into_inner();
        let query = crate::audit::Query {
            since_unix_ms: req.since_unix_ms,
            before_seq: req.before_seq,
            limit: usize::try_from(req.limit).unwrap_or(usize::MAX),
        };
        let page = self
            .inner
            .store
            .audit_page(query)
            .await
            .map_err(|e| Status::failed_precondition(crate::error::one_line(&e)))?;
        Ok(Response::new(page.to_wire()))
    }

    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResult>, Status> {
        self.inner
            .tokens()
            .caller(&request, Role::Viewer, "History", "")?;
        let asked = request.into_inner().version;
        let result = self.inner.lock().versions(&asked);
        result.map(Response::new).map_err(|e| {
            let message = crate::error::one_line(&e);
            match e {
                crate::state::versions::VersionError::NotKept { .. } => Status::not_found(message),
                _ => Status::invalid_argument(message),
            }
        })
    }

    async fn canary(
        &self,
        request: Request<pb::CanaryRequest>,
    ) -> Result<Response<pb::CanaryResult>, Status> {
        let claimed = request.get_ref().who.clone();
        // Promoting applies a version everywhere: the admin's call.
        let need = match request.get_ref().action() {
            pb::CanaryAction::Promote => Role::Admin,
            pb::CanaryAction::Abort => Role::Operator,
        };
        let caller = self
            .inner
            .tokens()
            .caller(&request, need, "Canary", &claimed)?;
        crate::rollout::by_operator(self.inner.clone(), request.into_inner(), caller.name).await
    }

    async fn certify(
        &self,
        request: Request<pb::CertifyRequest>,
    ) -> Result<Response<pb::CertifyResponse>, Status> {
        crate::certify::certify(&self.inner, request).await
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResult>, Status> {
        let claimed = request.get_ref().who.clone();
        let caller = self
            .inner
            .tokens()
            .caller(&request, Role::Operator, "Release", &claimed)?;
        let req = request.into_inner();
        let kind = match pb::ReleaseKind::try_from(req.kind) {
            Ok(pb::ReleaseKind::Fuse) => LatchKind::Fuse,
            Ok(pb::ReleaseKind::Limit) => LatchKind::Limit,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown release kind {}",
                    req.kind
                )));
            }
        };
        match req.rule.split_once('/') {
            Some((s, r)) if !s.is_empty() && !r.is_empty() && !r.contains('/') => {}
            _ => {
                return Err(Status::invalid_argument(format!(
                    "`{}` is not `service/rule`",
                    req.rule
                )));
            }
        }
        if kind == LatchKind::Fuse && !req.key.is_empty() {
            return Err(Status::invalid_argument(format!(
                "fuse `{}` has no keys; release it without a key",
                req.rule
            )));
        }
        let key = (!req.key.is_empty()).then_some(req.key.as_str());
        let who = caller.name;
        // The release finishes even if the client goes away meanwhile.
        let (keys, notified) = {
            let inner = self.inner.clone();
            let rule = req.rule.clone();
            let key = key.map(str::to_owned);
            let who = who.clone();
            tokio::spawn(async move {
                inner
                    .release(kind, &rule, key.as_deref(), &who, crate::store::Fence::Any)
                    .await
            })
            .await
            .map_err(|e| Status::internal(format!("the release failed: {e}")))?
            .map_err(|e| match e {
                ReleaseError::NoSuchRule { .. } => Status::not_found(e.to_string()),
                e => Status::failed_precondition(crate::error::one_line(&e)),
            })?
        };
        let was = !keys.is_empty();
        tracing::info!(who, rule = %req.rule, key = %req.key, kind = kind.as_str(), ?keys, agents = notified.len(), "released");
        let what = match key {
            Some(key) => format!("{} `{}` for key `{key}`", kind.as_str(), req.rule),
            None => format!("{} `{}`", kind.as_str(), req.rule),
        };
        let named: Vec<String> = keys
            .iter()
            .filter(|k| !k.is_empty())
            .map(|k| format!("`{k}`"))
            .collect();
        let message = match (was, notified.len()) {
            // A release of every key of a keyed limit names the keys it ended.
            (true, n) if key.is_none() && !named.is_empty() => format!(
                "released {what} on {n} agent(s): {} key(s): {}",
                named.len(),
                named.join(", ")
            ),
            (true, n) => format!("released {what} on {n} agent(s)"),
            (false, n) => format!(
                "{what} was not {}; sent the release to {n} agent(s) anyway",
                if kind == LatchKind::Fuse {
                    "tripped"
                } else {
                    "engaged"
                }
            ),
        };
        Ok(Response::new(pb::ReleaseResult {
            released: was,
            message,
            agents_notified: u32::try_from(notified.len()).unwrap_or(u32::MAX),
        }))
    }
}

#[cfg(test)]
mod tests {
    use pb::agent_message::Msg as AgentMsg;
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::encoded::Encoded;

    /// The state directory as written (what a restart reads).
    fn disk(dir: &std::path::Path) -> crate::store::DirStore {
        crate::store::DirStore::open(dir).unwrap()
    }
    use crate::control_plane::Options;

    fn hello(instance: &str) -> pb::Hello {
        pb::Hello {
            service: "order".into(),
            instance: instance.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_stuck_agent_is_cut_and_the_others_still_get_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        // A queue that is full and never read: the agent does not read its stream.
        let (stuck, _never_read) = mpsc::channel(1);
        stuck.try_send(Box::new(Encoded::default())).unwrap();
        let (good, mut received) = mpsc::channel(8);
        {
            let mut state = cp.inner.lock();
            state.hello(hello("stuck"), stuck, 1, &mut Vec::new());
            state.hello(hello("good"), good, 1, &mut Vec::new());
        }
        let request = pb::ApplyRequest {
            sources: vec![pb::SourceFile {
                name: "p.gov".into(),
                text: "service order {\n  match all = path prefix \"/\"\n  bulkhead b on all {\n    max_concurrent 1\n  }\n}\n".into(),
            }],
            ..Default::default()
        };
        let result = ControlPlaneRpc::apply(&cp, Request::new(request))
            .await
            .unwrap()
            .into_inner();
        assert!(result.applied, "{:?}", result.diagnostics);
        let msg = received.try_recv().unwrap().message();
        assert!(matches!(msg.msg, Some(pb::control_message::Msg::Config(_))));
        let view = cp.status();
        let stuck = view.agents.iter().find(|a| a.instance == "stuck").unwrap();
        assert_eq!(stuck.state(), pb::SyncState::Disconnected);
        assert!(
            stuck.reason.contains("queue stayed full"),
            "{}",
            stuck.reason
        );
        let good = view.agents.iter().find(|a| a.instance == "good").unwrap();
        assert_eq!(
            good.state(),
            pb::SyncState::Stale,
            "sent, waiting for its ACK"
        );
        // The apply is on disk and in the audit log: its intent, its outcome.
        assert_eq!(
            disk(dir.path()).load().unwrap().applied.unwrap().version,
            result.version
        );
        let actions: Vec<String> = disk(dir.path())
            .read_audit()
            .unwrap()
            .into_iter()
            .map(|e| e.action)
            .collect();
        assert_eq!(actions, ["apply-intended", "apply"]);
    }

    async fn serve_on_loopback(options: Options) -> (String, CancellationToken) {
        let stop = CancellationToken::new();
        let cp = ControlPlane::open(options, stop.clone()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(crate::server::serve(
            listener,
            cp,
            stop.clone(),
            Duration::from_secs(1),
        ));
        (url, stop)
    }

    /// A policy of about `bytes` bytes: one service, and comments (cheap to
    /// compile, large on the wire) in files of at most 1 MiB (the language
    /// limits the size of one file).
    fn sized_policy(bytes: usize) -> pb::ApplyRequest {
        let body = "service order {\n  capacity workers 4\n}\n";
        let mut sources = vec![pb::SourceFile {
            name: "order.gov".into(),
            text: body.into(),
        }];
        let mut left = bytes.saturating_sub(body.len());
        while left > 16 {
            let n = left.min(1 << 20);
            sources.push(pb::SourceFile {
                name: format!("comment-{}.gov", sources.len()),
                text: format!("# {}\n", "x".repeat(n - 3)),
            });
            left -= n;
        }
        pb::ApplyRequest {
            sources,
            dry_run: true,
            ..Default::default()
        }
    }

    /// `--control-plane URL,,` (one URL and stray commas) reaches that govd.
    #[tokio::test]
    async fn one_url_with_stray_commas_reaches_its_govd() {
        let dir = tempfile::tempdir().unwrap();
        let (url, stop) = serve_on_loopback(Options::new(dir.path())).await;
        for list in [format!("{url},,"), format!(" ,{url}, ")] {
            let mut client = crate::client::connect(&list, Duration::from_secs(5))
                .await
                .unwrap();
            client.status(pb::StatusRequest::default()).await.unwrap();
        }
        stop.cancel();
    }

    #[tokio::test]
    async fn an_oversized_policy_is_refused_with_the_limit_and_the_flag_to_raise_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = Options::new(dir.path());
        options.limits.max_policy_bytes = 1_000;
        let (url, stop) = serve_on_loopback(options).await;
        let mut client = crate::client::connect(&url, Duration::from_secs(5))
            .await
            .unwrap();
        let status = client.apply(sized_policy(5_000)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let message = status.message();
        assert!(message.contains("1000 bytes"), "{message}");
        assert!(message.contains("GOV_MAX_POLICY_BYTES"), "{message}");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_policy_larger_than_tonics_default_limit_is_accepted_under_ours() {
        let dir = tempfile::tempdir().unwrap();
        let (url, stop) = serve_on_loopback(Options::new(dir.path())).await;
        let mut client = crate::client::connect(&url, Duration::from_secs(5))
            .await
            .unwrap();
        let planned = client
            .apply(sized_policy(5 << 20))
            .await
            .unwrap()
            .into_inner();
        assert!(planned.plan.is_some(), "{:?}", planned.diagnostics);
        assert_eq!(planned.plan.unwrap().services.len(), 1);
        stop.cancel();
    }

    #[tokio::test]
    async fn a_release_that_cannot_be_stored_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        let (tx, mut agent) = mpsc::channel(8);
        let (key, id) = cp.inner.lock().hello(hello("a"), tx, 1, &mut Vec::new());
        let tripped = pb::Event {
            key: String::new(),
            kind: pb::EventKind::FuseTripped as i32,
            rule: "order/mdm".into(),
            reason: "errors".into(),
            at_unix_ms: 5,
        };
        cp.inner
            .lock()
            .on_message(&key, id, AgentMsg::Event(tripped), 5);
        // The release's write fails (its temp file cannot be created).
        let part = crate::store::parts::release_part(LatchKind::Fuse, "order/mdm", "");
        let blocker = dir
            .path()
            .join(format!(".{part}.tmp.{}", std::process::id()));
        std::fs::create_dir(&blocker).unwrap();
        let err = cp
            .inner
            .release(
                LatchKind::Fuse,
                "order/mdm",
                None,
                "alice",
                crate::store::Fence::Any,
            )
            .await
            .unwrap_err();
        let message = crate::error::one_line(&err);
        assert!(message.contains("nothing was released"), "{message}");
        assert!(cp.inner.lock().is_latched(LatchKind::Fuse, "order/mdm"));
        assert!(agent.try_recv().is_err(), "no release command was sent");
        let actions: Vec<String> = disk(dir.path())
            .read_audit()
            .unwrap()
            .into_iter()
            .map(|e| e.action)
            .collect();
        assert_eq!(actions, ["release-intended", "release-refused"]);

        std::fs::remove_dir(&blocker).unwrap();
        let (was, notified) = cp
            .inner
            .release(
                LatchKind::Fuse,
                "order/mdm",
                None,
                "alice",
                crate::store::Fence::Any,
            )
            .await
            .unwrap();
        assert_eq!(was, [""], "the fuse was tripped");
        assert_eq!(notified, ["a"]);
        assert!(!cp.inner.lock().is_latched(LatchKind::Fuse, "order/mdm"));
        assert!(disk(dir.path()).load().unwrap().latches.is_empty());
        let command = agent.try_recv().unwrap().message();
        assert!(matches!(
            command.msg,
            Some(pb::control_message::Msg::Command(_))
        ));
    }
}
