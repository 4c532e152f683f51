//! The gRPC side against a real tonic server on 127.0.0.1: the watch stream
//! survives a control-plane restart, and release sends who and the token.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gov_tui::proto::control_plane_server::{ControlPlane, ControlPlaneServer};
use gov_tui::proto::{
    AgentMessage, ApplyRequest, ApplyResult, ClusterView, ControlMessage, ReleaseKind,
    ReleaseRequest, ReleaseResult, StatusRequest, WatchRequest,
};
use gov_tui::{Msg, WatchOptions};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

type Stream<T> = ReceiverStream<Result<T, Status>>;

/// A control plane that answers `Watch` with views numbered by `version`,
/// and records `Release` calls with their authorization header.
#[derive(Clone, Default)]
struct FakeControlPlane {
    /// Accepted releases (only with `Bearer s3cret`).
    releases: Arc<Mutex<Vec<ReleaseRequest>>>,
    watch_auth: Arc<Mutex<Vec<Option<String>>>>,
    generation: u32,
    /// Ends open watch streams, so that a graceful shutdown completes.
    stopping: Option<watch::Receiver<bool>>,
}

fn auth<T>(r: &Request<T>) -> Option<String> {
    r.metadata()
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tonic::async_trait]
impl ControlPlane for FakeControlPlane {
    async fn apply(&self, _: Request<ApplyRequest>) -> Result<Response<ApplyResult>, Status> {
        Err(Status::unimplemented("apply"))
    }

    type ConnectStream = Stream<ControlMessage>;

    async fn connect(
        &self,
        _: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        Err(Status::unimplemented("connect"))
    }

    type WatchStream = Stream<ClusterView>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.watch_auth.lock().unwrap().push(auth(&request));
        let (tx, rx) = mpsc::channel(4);
        let generation = self.generation;
        let mut stopping = self.stopping.clone().expect("served");
        tokio::spawn(async move {
            for i in 0..2 {
                let view = ClusterView {
                    version: format!("gen{generation}-view{i}"),
                    ..Default::default()
                };
                if tx.send(Ok(view)).await.is_err() {
                    return;
                }
            }
            // Keep the stream open until the client or the server goes away.
            tokio::select! {
                () = tx.closed() => {}
                _ = stopping.wait_for(|s| *s) => {}
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<ClusterView>, Status> {
        Err(Status::unimplemented("status"))
    }

    async fn audit(
        &self,
        _: Request<gov_tui::proto::AuditRequest>,
    ) -> Result<Response<gov_tui::proto::AuditResult>, Status> {
        Err(Status::unimplemented("audit"))
    }

    async fn certify(
        &self,
        _: Request<gov_tui::proto::CertifyRequest>,
    ) -> Result<Response<gov_tui::proto::CertifyResponse>, Status> {
        Err(Status::unimplemented("certify"))
    }

    async fn history(
        &self,
        _: Request<gov_tui::proto::HistoryRequest>,
    ) -> Result<Response<gov_tui::proto::HistoryResult>, Status> {
        Err(Status::unimplemented("history"))
    }

    async fn canary(
        &self,
        _: Request<gov_tui::proto::CanaryRequest>,
    ) -> Result<Response<gov_tui::proto::CanaryResult>, Status> {
        Err(Status::unimplemented("canary"))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResult>, Status> {
        if auth(&request).as_deref() != Some("Bearer s3cret") {
            return Err(Status::unauthenticated("missing or wrong token"));
        }
        self.releases.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ReleaseResult {
            released: true,
            message: String::new(),
            agents_notified: 3,
        }))
    }
}

struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops accepting, ends the open streams and waits for the server task.
    async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(10), self.done)
            .await
            .expect("the server stops within 10 s")
            .unwrap();
    }
}

async fn serve(mut plane: FakeControlPlane, listener: TcpListener) -> Server {
    let addr = listener.local_addr().unwrap();
    let (stop, stopping) = watch::channel(false);
    plane.stopping = Some(stopping.clone());
    let done = tokio::spawn(async move {
        let mut stopping = stopping;
        tonic::transport::Server::builder()
            .add_service(ControlPlaneServer::new(plane))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                let _ = stopping.wait_for(|s| *s).await;
            })
            .await
            .unwrap();
    });
    Server { addr, stop, done }
}

async fn next(rx: &mut mpsc::Receiver<Msg>) -> Msg {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a message within 10 s")
        .expect("the watch task is running")
}

fn version(msg: &Msg) -> &str {
    match msg {
        Msg::View(v) => &v.version,
        other => panic!("expected a view, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_reports_disconnection_and_reconnects_after_a_restart() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plane = FakeControlPlane::default();
    let server = serve(plane.clone(), listener).await;
    let addr = server.addr;

    let (tx, mut rx) = mpsc::channel(16);
    let opts = WatchOptions {
        url: format!("http://{addr}"),
        token: Some("s3cret\n".into()),
        tls: Default::default(),
        service: String::new(),
    };
    let watcher = tokio::spawn(gov_tui::watch(opts, tx));

    assert_eq!(version(&next(&mut rx).await), "gen0-view0");
    assert_eq!(version(&next(&mut rx).await), "gen0-view1");
    assert_eq!(
        plane.watch_auth.lock().unwrap().as_slice(),
        [Some("Bearer s3cret".to_owned())]
    );

    // The control plane goes away: the TUI hears about it, with a reason.
    server.stop().await;
    let Msg::Disconnected(reason) = next(&mut rx).await else {
        panic!("expected Disconnected");
    };
    assert!(!reason.is_empty());

    // Reconnection attempts keep failing while nothing listens.
    let Msg::Disconnected(reason) = next(&mut rx).await else {
        panic!("expected another Disconnected");
    };
    assert!(
        reason.contains("connect") || reason.contains("refused"),
        "{reason}"
    );

    // It comes back on the same port: Reconnected, then the new views.
    let listener = TcpListener::bind(addr).await.unwrap();
    let restarted = serve(
        FakeControlPlane {
            generation: 1,
            ..plane.clone()
        },
        listener,
    )
    .await;
    let mut msg = next(&mut rx).await;
    while matches!(msg, Msg::Disconnected(_)) {
        msg = next(&mut rx).await;
    }
    assert!(matches!(msg, Msg::Reconnected), "{msg:?}");
    assert_eq!(version(&next(&mut rx).await), "gen1-view0");

    // Closing the receiver (the TUI quit) ends the task.
    drop(rx);
    tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("the watch task ends once the TUI is gone")
        .unwrap();
    restarted.stop().await;
}

#[tokio::test]
async fn release_sends_who_and_the_bearer_token() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plane = FakeControlPlane::default();
    let server = serve(plane.clone(), listener).await;
    let mut opts = WatchOptions {
        url: format!("http://{}", server.addr),
        token: Some("s3cret".into()),
        tls: Default::default(),
        service: String::new(),
    };

    let result = gov_tui::release(
        &opts,
        ReleaseKind::Limit,
        "order/crm_supplier".into(),
        "alice".into(),
    )
    .await
    .unwrap();
    assert_eq!(result.agents_notified, 3);
    let releases = plane.releases.lock().unwrap().clone();
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].rule, "order/crm_supplier");
    assert_eq!(releases[0].kind(), ReleaseKind::Limit);
    assert_eq!(releases[0].who, "alice");

    // A wrong token gives a readable reason, not a panic.
    opts.token = Some("nope".into());
    let err = gov_tui::release(&opts, ReleaseKind::Fuse, "order/mdm".into(), "alice".into())
        .await
        .unwrap_err();
    assert!(err.contains("missing or wrong token"), "{err}");

    // Nobody listening: a connect error.
    server.stop().await;
    let err = gov_tui::release(&opts, ReleaseKind::Fuse, "order/mdm".into(), "alice".into())
        .await
        .unwrap_err();
    assert!(!err.is_empty());
}
