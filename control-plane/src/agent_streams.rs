//! Agent streams: `Connect` served on pre-encoded pushes (`encoded.rs`)
//! next to the rest of `gov.v1.ControlPlane` as tonic generates it; an
//! agent's hello checked (credentials, caps, the admission rate) and taken,
//! and its messages read into the state.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use gov_proto::v1 as pb;
use pb::agent_message::Msg as AgentMsg;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::AgentIdentity;
use crate::control_plane::{ControlPlane, Inner};
use crate::convert::now_unix_ms;
use crate::encoded::Encoded;
use crate::state::AgentKey;
use crate::store::AuditEntry;

/// How long a new stream may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued per agent stream.
const AGENT_QUEUE: usize = 64;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// `gov.v1.ControlPlane` as tonic generates it, except `Connect`, whose
/// outbound messages are sent as govd encoded them (`encoded.rs`): one
/// encoding of a push shared by every stream, not one per agent.
#[derive(Clone)]
pub struct GrpcService {
    generated: pb::control_plane_server::ControlPlaneServer<ControlPlane>,
    control_plane: ControlPlane,
    max_decoding: usize,
}

const CONNECT_PATH: &str = "/gov.v1.ControlPlane/Connect";

impl GrpcService {
    /// `control_plane`'s service, decoding requests up to `max_decoding` bytes.
    pub(crate) fn new(control_plane: &ControlPlane, max_decoding: usize) -> Self {
        GrpcService {
            generated: pb::control_plane_server::ControlPlaneServer::new(control_plane.clone())
                .max_decoding_message_size(max_decoding),
            control_plane: control_plane.clone(),
            max_decoding,
        }
    }
}

impl tonic::server::NamedService for GrpcService {
    const NAME: &'static str = <pb::control_plane_server::ControlPlaneServer<ControlPlane> as tonic::server::NamedService>::NAME;
}

impl<B> tower::Service<http::Request<B>> for GrpcService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != CONNECT_PATH {
            return tower::Service::call(&mut self.generated, request);
        }
        let streams = AgentStreams(self.control_plane.clone());
        let max = self.max_decoding;
        Box::pin(async move {
            let codec = crate::encoded::AgentCodec;
            let mut grpc =
                tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.streaming(streams, request).await)
        })
    }
}

/// `Connect` on pre-encoded messages.
struct AgentStreams(ControlPlane);

impl tonic::server::StreamingService<pb::AgentMessage> for AgentStreams {
    type Response = Encoded;
    type ResponseStream = BoxStream<Encoded>;
    type Future = tonic::codegen::BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<pb::AgentMessage>>) -> Self::Future {
        let control_plane = self.0.clone();
        Box::pin(async move {
            let stream = control_plane.agent_stream(request).await?;
            Ok(Response::new(Box::pin(stream) as BoxStream<Encoded>))
        })
    }
}

impl ControlPlane {
    /// An agent's `Connect`: its hello checked and taken, the stream of
    /// what is pushed to it.
    pub(crate) async fn agent_stream(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<impl Stream<Item = Result<Encoded, Status>> + Send + 'static, Status> {
        // With a client CA, the certificate (checked by the TLS handshake)
        // says which service this agent is; a bearer token, when it carries
        // one, must be an agent's too.
        let certified = if self.inner.agent_certificates {
            Some(certified_service(&request)?)
        } else {
            None
        };
        let identity = match &certified {
            Some(service) if !has_bearer(&request) => AgentIdentity::certificate(service),
            _ => self.inner.tokens().agent(&request)?,
        };
        let mut incoming = request.into_inner();
        let hello = read_hello(&mut incoming).await?;
        let limits = self.inner.agent_limits;
        check_claim(&self.inner, certified, &identity, &hello).await?;
        // A fleet reconnecting at once (govd restarted) is taken in at a
        // bounded rate: its hellos and first pushes, and the revision read
        // below (a read of etcd per stream), do not all land at once.
        if !self
            .inner
            .admission
            .admit(crate::connections::ADMISSION_WAIT)
            .await
        {
            self.inner.metrics.on_admission_refused();
            return Err(Status::unavailable(format!(
                "govd admits {} new agent streams a second (--agent-admissions-per-second) and this one's turn is more than {:?} away; the agent keeps its config and tries again after its backoff",
                self.inner.connections.agent_admissions_per_second,
                crate::connections::ADMISSION_WAIT
            )));
        }
        // Fenced by revision for reads too: no agent gets a config older
        // than the stored one from a replica that slept or was cut off.
        self.inner.confirm_current().await.map_err(|error| {
            Status::unavailable(format!(
                "this govd replica cannot confirm it holds the current policy ({}); the agent keeps its config and tries again",
                crate::error::one_line(&error)
            ))
        })?;
        let (tx, rx) = mpsc::channel(AGENT_QUEUE);
        let mut out = Vec::new();
        let label = identity.label();
        let pruned;
        let claimed = {
            let mut state = self.inner.lock();
            let now = now_unix_ms();
            if let Some(ago) = state.live_claim(&hello.service, &hello.instance, now) {
                tracing::warn!(service = %hello.service, instance = %hello.instance, address = %hello.address, "refused a second agent with a live agent's name");
                return Err(Status::already_exists(format!(
                    "instance `{}` of service `{}` is connected from another agent (heard from {ago} ms ago); give each agent its own `--instance`",
                    hello.instance, hello.service
                )));
            }
            pruned = state.prune(now, limits.retention_ms());
            if state.service_full(
                &hello.service,
                &hello.instance,
                limits.max_agents_per_service,
            ) {
                Err(None)
            } else {
                match state.held_by_another(&hello.service, &hello.instance, &label) {
                    Some(holder) => Err(Some(holder.to_owned())),
                    None => Ok(state.hello_as(hello.clone(), &label, tx, now, &mut out)),
                }
            }
        };
        if !pruned.is_empty() {
            audit_pruned(&self.inner, &pruned, limits).await;
        }
        let (key, id) = match claimed {
            Ok(claimed) => claimed,
            Err(None) => {
                self.inner
                    .metrics
                    .on_agent_refused(crate::agent_limits::AgentCap::AgentsPerService);
                tracing::warn!(service = %hello.service, instance = %hello.instance, max = limits.max_agents_per_service, "refused an agent: its service has as many instances as --max-agents-per-service");
                return Err(Status::resource_exhausted(format!(
                    "service `{}` has {} instances already, govd's cap (--max-agents-per-service); instances gone longer than --agent-retention are forgotten",
                    hello.service, limits.max_agents_per_service
                )));
            }
            Err(Some(holder)) => {
                let detail = format!("the name is held by {holder}; this agent proved {label}");
                let what = "its instance name belongs to another identity";
                refuse_agent(&self.inner, &identity, &hello, what, detail).await;
                // The holder's identity is not told to whoever asks.
                return Err(Status::permission_denied(format!(
                    "instance `{}` of service `{}` belongs to another agent identity; give each agent its own `--instance`",
                    hello.instance, hello.service
                )));
            }
        };
        tracing::info!(service = %key.0, instance = %key.1, pushed = !out.is_empty(), "agent connected");
        self.inner.send(out).await;
        self.inner.changed();
        self.inner.bump_sync();
        self.inner.persist_soon.notify_one();
        tokio::spawn(read_agent(self.inner.clone(), key, id, incoming));
        Ok(ReceiverStream::new(rx)
            .map(|msg| Ok(*msg))
            .take_until(self.inner.shutdown.clone().cancelled_owned()))
    }
}

/// The stream's first message, which must be a hello naming a service and
/// an instance, within [`HELLO_TIMEOUT`].
async fn read_hello(incoming: &mut Streaming<pb::AgentMessage>) -> Result<pb::Hello, Status> {
    let first = tokio::time::timeout(HELLO_TIMEOUT, incoming.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no hello within 10s"))??;
    let hello = match first.and_then(|m| m.msg) {
        Some(AgentMsg::Hello(h)) => h,
        Some(_) => {
            return Err(Status::invalid_argument(
                "the first message must be a hello",
            ));
        }
        None => {
            return Err(Status::invalid_argument(
                "the stream ended before the hello",
            ));
        }
    };
    if hello.service.trim().is_empty() || hello.instance.trim().is_empty() {
        return Err(Status::invalid_argument(
            "hello needs a service and an instance",
        ));
    }
    Ok(hello)
}

/// Whether the agent's credentials prove the service its hello claims (the
/// service of its certificate, the services its token names) and the hello
/// is within govd's caps; a refusal is audited.
async fn check_claim(
    inner: &Inner,
    certified: Option<String>,
    identity: &AgentIdentity,
    hello: &pb::Hello,
) -> Result<(), Status> {
    if let Some(certified) = certified
        && certified != hello.service
    {
        let detail = format!(
            "claimed service `{}`; its certificate is for `{certified}`",
            hello.service
        );
        let identity = AgentIdentity::certificate(&certified);
        let what = "its certificate is for another service";
        refuse_agent(inner, &identity, hello, what, detail).await;
        return Err(Status::permission_denied(format!(
            "this agent's certificate is for service `{certified}`, not `{}`; give it a certificate for its own service (spiffe://.../service/{} or CN={})",
            hello.service, hello.service, hello.service
        )));
    }
    let limits = inner.agent_limits;
    if let Err(over) = limits.check_hello(hello) {
        inner.metrics.on_agent_refused(over.cap);
        return Err(Status::resource_exhausted(over.message));
    }
    if !identity.may_claim(&hello.service) {
        let may = identity.services.as_deref().unwrap_or_default().join(", ");
        let detail = format!(
            "claimed service `{}`; its token names only: {may}",
            hello.service
        );
        let what = "its token is for another service";
        refuse_agent(inner, identity, hello, what, detail).await;
        return Err(Status::permission_denied(format!(
            "the agent token `{}` may claim only the services {may}, not `{}`; give this agent its own service's token (or add `{}` to the token's line in govd's --token-file)",
            identity.name, hello.service, hello.service
        )));
    }
    Ok(())
}

/// An agent that claimed a service its credentials do not prove: logged,
/// and audited (an attempt to pose as another service is worth a record).
async fn refuse_agent(
    inner: &Inner,
    identity: &AgentIdentity,
    hello: &pb::Hello,
    what: &str,
    detail: String,
) {
    tracing::warn!(identity = %identity.label(), claimed = %hello.service, instance = %hello.instance, %detail, "refused an agent: {what}");
    inner
        .audit(AuditEntry {
            at_unix_ms: now_unix_ms(),
            who: identity.who(),
            action: "agent-refused".into(),
            intent: String::new(),
            version: String::new(),
            kind: String::new(),
            rule: String::new(),
            key: String::new(),
            targets: vec![format!("{}/{}", hello.service, hello.instance)],
            detail,
        })
        .await;
}

/// Instances forgotten after the retention: one audit record, and counted.
async fn audit_pruned(inner: &Inner, pruned: &[AgentKey], limits: crate::AgentLimits) {
    inner.metrics.on_agents_pruned(pruned.len());
    let targets: Vec<String> = pruned.iter().map(|(s, i)| format!("{s}/{i}")).collect();
    tracing::info!(instances = ?targets, "forgot instances not heard from for --agent-retention");
    inner.bump_sync();
    inner.changed();
    inner.persist_soon.notify_one();
    inner
        .audit(AuditEntry {
            at_unix_ms: now_unix_ms(),
            who: "govd (agent retention)".into(),
            action: "agents-pruned".into(),
            intent: String::new(),
            version: String::new(),
            kind: String::new(),
            rule: String::new(),
            key: String::new(),
            targets,
            detail: format!(
                "disconnected and not heard from for {:?} (--agent-retention)",
                limits.retention
            ),
        })
        .await;
}

/// Whether `request` carries an `authorization` header.
fn has_bearer<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key("authorization")
}

/// The service named by the client certificate of `request` (verified
/// against `--tls-client-ca` by the handshake).
fn certified_service<T>(request: &Request<T>) -> Result<String, Status> {
    let certs = request.peer_certs();
    let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
        return Err(Status::unauthenticated(
            "govd requires agents to present a client certificate (gov-agent --tls-cert and --tls-key, signed by govd's --tls-client-ca)",
        ));
    };
    gov_proto::spiffe::certificate_service(leaf.as_ref()).map_err(Status::permission_denied)
}

/// A fuse or limit an agent reported tripped: the audit records first (a
/// latch never ends unaudited), then the latches on disk.
async fn on_trips(inner: &Inner, audits: crate::latch::Audits) {
    for entry in audits {
        inner.audit(entry).await;
    }
    if let Err(error) = inner.persist().await {
        tracing::error!(error = %miette::Report::new(error), "cannot write the fuse/limit state");
    }
    inner.timer.notify_one();
    inner.changed();
}

/// Reads one agent's stream until it ends, the agent reconnects elsewhere,
/// or the server stops.
async fn read_agent(
    inner: Arc<Inner>,
    key: AgentKey,
    id: u64,
    mut incoming: Streaming<pb::AgentMessage>,
) {
    // Made once per stream: a new one per message would join and leave the
    // token's list of waiters, shared by every agent's reader, each time.
    let stopping = inner.shutdown.cancelled();
    tokio::pin!(stopping);
    // Its agent's slot, taken once: each message reaches the agent in O(1)
    // (issue 35). `None`: a newer stream replaced this one already, and
    // every message of this one is refused, as the state refuses them.
    let stream = inner.lock().stream(&key, id);
    let reason = loop {
        let msg = tokio::select! {
            () = &mut stopping => break "control plane stopping".to_owned(),
            m = incoming.message() => m,
        };
        let msg = match msg {
            Ok(Some(pb::AgentMessage { msg: Some(msg) })) => msg,
            Ok(Some(pb::AgentMessage { msg: None })) => continue,
            Ok(None) => break "stream closed by the agent".to_owned(),
            Err(status) => break format!("stream error: {}", status.message()),
        };
        let mut msg = msg;
        if let AgentMsg::Event(event) = &mut msg
            && inner.agent_limits.bound_event(event)
        {
            inner
                .metrics
                .on_agent_refused(crate::agent_limits::AgentCap::StringBytes);
        }
        inner.metrics.on_agent_message(&msg);
        let Some(stream) = &stream else {
            continue;
        };
        let effect = inner.lock().on_stream_message(stream, msg, now_unix_ms());
        if effect.endpoints {
            let mut out = Vec::new();
            inner.lock().endpoint_pushes(&mut out);
            inner.send(out).await;
        }
        if effect.sync {
            inner.bump_sync();
            inner.changed();
            inner.persist_soon.notify_one();
        }
        if effect.trips {
            // Boxed: a trip is rare, and its audit and store writes would
            // otherwise size every agent's reader task for as long as it lives.
            Box::pin(on_trips(&inner, effect.audits)).await;
        }
        if effect.stats {
            inner.stats_changed();
        }
    };
    let mut out = Vec::new();
    let disconnected = {
        let mut state = inner.lock();
        let gone = state.disconnect(&key, id, &reason, now_unix_ms());
        state.endpoint_pushes(&mut out);
        gone
    };
    inner.send(out).await;
    if disconnected {
        tracing::info!(service = %key.0, instance = %key.1, %reason, "agent disconnected");
        inner.bump_sync();
        inner.changed();
    }
}
