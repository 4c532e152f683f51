//! The engine as a tower layer: [`GovernLayer`] wraps any
//! `Service<http::Request<B>>` so a Rust service can enforce its policy in
//! process, without the sidecar.
//!
//! The decision needs the request (its path, method, headers), so unlike
//! tower's `ConcurrencyLimit` it is taken in `call`, not `poll_ready`:
//! `poll_ready` only asks the inner service. An admitted call holds its
//! permits until the response body ends; its outcome (status) is recorded
//! at the response head; request and response bytes are counted for byte
//! limits as they stream. A rejection never reaches the inner service and is
//! answered by [`Rejection::to_response`]. Only a call that must wait (a
//! bulkhead permit, a shaping delay) or has a timeout allocates.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::{Layer, Service, ServiceExt};

use crate::config::Direction;
use crate::engine::{Admission, ByteMeter, Decision, Engine, RequestInfo, Target};
use crate::outcome::Outcome;
use crate::rejection::{RejectReason, Rejection};

/// Errors of the inner service, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Request extension naming the destination of an outbound call, for a
/// [`GovernLayer::outbound`] stack (`calls to SERVICE`, per-instance bulkheads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallTarget {
    pub service: Arc<str>,
    pub instance: Option<Arc<str>>,
}

/// Applies the engine's decision around an inner service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct GovernLayer {
    engine: Engine,
    direction: Direction,
}

impl GovernLayer {
    /// Server-side rules: requests arriving at this service.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            direction: Direction::Inbound,
        }
    }

    /// Client-side rules: calls this service makes, each with a [`CallTarget`] extension.
    pub fn outbound(engine: Engine) -> Self {
        Self {
            engine,
            direction: Direction::Outbound,
        }
    }
}

impl<S> Layer<S> for GovernLayer {
    type Service = Govern<S>;

    fn layer(&self, inner: S) -> Govern<S> {
        Govern {
            inner,
            engine: self.engine.clone(),
            direction: self.direction,
        }
    }
}

/// The service built by [`GovernLayer`].
#[derive(Clone, Debug)]
pub struct Govern<S> {
    inner: S,
    engine: Engine,
    direction: Direction,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Govern<S>
where
    S: Service<Request<MeteredBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<GovBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let decision = {
            let target = req.extensions().get::<CallTarget>();
            let info = RequestInfo {
                direction: self.direction,
                method: req.method(),
                path: req.uri().path(),
                headers: crate::Headers::Map(req.headers()),
                target: target.map(|t| Target {
                    service: &t.service,
                    instance: t.instance.as_deref(),
                }),
            };
            self.engine.try_admit(&info)
        };
        match decision {
            Decision::Admitted(admission) => {
                let req = metered(req, &admission);
                let fut = self.inner.call(req);
                ResponseFuture::called(fut, admission)
            }
            Decision::Rejected(rejection) => ResponseFuture::Rejected {
                rejection: Some(rejection),
            },
            Decision::Wait(pending) => {
                // The ready service goes with the call; keep a fresh clone.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::Waiting {
                    fut: Box::pin(async move {
                        let admission = match pending.wait().await {
                            Ok(a) => a,
                            Err(r) => return Ok(rejected(&r)),
                        };
                        let req = metered(req, &admission);
                        let fut = inner.ready().await.map_err(Into::into)?.call(req);
                        ResponseFuture::called(fut, admission).await
                    }),
                }
            }
        }
    }
}

fn metered<B>(req: Request<B>, admission: &Admission) -> Request<MeteredBody<B>> {
    let meter = admission.byte_meter();
    req.map(|inner| MeteredBody { inner, meter })
}

fn rejected<B>(r: &Rejection) -> Response<GovBody<B>> {
    r.to_response().map(|body| GovBody::Rejected { body })
}

type BoxResponse<B> = Pin<Box<dyn Future<Output = Result<Response<GovBody<B>>, BoxError>> + Send>>;

pin_project! {
    /// The response future of [`Govern`].
    #[project = ResponseFutureProj]
    pub enum ResponseFuture<F, B> {
        Called {
            #[pin]
            fut: F,
            admission: Option<Admission>,
            deadline: Option<Pin<Box<Sleep>>>,
        },
        Rejected {
            rejection: Option<Rejection>,
        },
        Waiting {
            fut: BoxResponse<B>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    fn called(fut: F, admission: Admission) -> Self {
        let deadline = admission.timeout().map(|t| Box::pin(tokio::time::sleep(t)));
        ResponseFuture::Called {
            fut,
            admission: Some(admission),
            deadline,
        }
    }
}

impl<F, E, B> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<GovBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ResponseFutureProj::Called {
                fut,
                admission,
                deadline,
            } => {
                if let Some(d) = deadline
                    && d.as_mut().poll(cx).is_ready()
                {
                    let rejection = admission.take().and_then(Admission::timed_out);
                    let rejection = rejection.unwrap_or_else(|| Rejection {
                        rule: "".into(),
                        reason: RejectReason::Timeout,
                        status: http::StatusCode::GATEWAY_TIMEOUT,
                        retry_after: None,
                    });
                    return Poll::Ready(Ok(rejected(&rejection)));
                }
                match fut.poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Ok(response)) => {
                        let mut admission = admission.take();
                        if let Some(a) = &mut admission {
                            a.record(Outcome::from(response.status()));
                        }
                        Poll::Ready(Ok(response.map(|body| GovBody::Inner { body, admission })))
                    }
                    Poll::Ready(Err(e)) => {
                        // The service failed without a response.
                        if let Some(a) = admission.take() {
                            a.finish(Outcome::Reset);
                        }
                        Poll::Ready(Err(e.into()))
                    }
                }
            }
            ResponseFutureProj::Rejected { rejection } => match rejection.take() {
                Some(r) => Poll::Ready(Ok(rejected(&r))),
                None => Poll::Ready(Err("response future polled after completion".into())),
            },
            ResponseFutureProj::Waiting { fut } => fut.as_mut().poll(cx),
        }
    }
}

pin_project! {
    /// A request body that counts its bytes for the call's byte limits.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        meter: Option<ByteMeter>,
    }
}

impl<B> MeteredBody<B> {
    /// A body counted by `meter` (`None`: not counted).
    pub fn new(inner: B, meter: Option<ByteMeter>) -> Self {
        Self { inner, meter }
    }

    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        if let (Poll::Ready(Some(Ok(f))), Some(meter)) = (&frame, this.meter.as_ref())
            && let Some(data) = f.data_ref()
        {
            meter.add(data.remaining() as u64);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// The response body of [`Govern`]: the inner body (holding the call's
    /// admission until it ends) or a rejection's short text.
    #[project = GovBodyProj]
    pub enum GovBody<B> {
        Inner {
            #[pin]
            body: B,
            admission: Option<Admission>,
        },
        Rejected {
            body: Full<Bytes>,
        },
    }
}

impl<B> Body for GovBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            GovBodyProj::Inner { body, admission } => match body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let (Some(a), Some(data)) = (admission.as_ref(), frame.data_ref()) {
                        a.add_bytes(data.len() as u64);
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => {
                    admission.take();
                    Poll::Ready(Some(Err(e.into())))
                }
                Poll::Ready(None) => {
                    // The call is over: release its permits now, not when the body is dropped.
                    admission.take();
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            },
            GovBodyProj::Rejected { body } => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GovBody::Inner { body, .. } => body.is_end_stream(),
            GovBody::Rejected { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GovBody::Inner { body, .. } => body.size_hint(),
            GovBody::Rejected { body } => body.size_hint(),
        }
    }
}
