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
//! answered by [`Rejection::respond`] (the gRPC form for a gRPC call). A
//! gRPC call's outcome is its `grpc-status` ([`crate::grpc`]), and its
//! `grpc-timeout` is its deadline when shorter than its rules'. Only a call
//! that must wait (a bulkhead permit, a shaping delay) or has a timeout
//! allocates.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::{Layer, Service, ServiceExt};

use crate::admission::Admission;
use crate::body::{GovBody, MeteredBody};
use crate::config::Direction;
use crate::decision::Decision;
use crate::engine::Engine;
use crate::grpc::GrpcCall;
use crate::outcome::Outcome;
use crate::rejection::Rejection;
use crate::request::{RequestInfo, Target};

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
        let grpc = GrpcCall::of(&req);
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
                ResponseFuture::called(fut, admission, grpc)
            }
            Decision::Rejected(rejection) => ResponseFuture::Rejected {
                rejection: Some(rejection),
                grpc: grpc.is_some(),
            },
            Decision::Wait(pending) => {
                // The ready service goes with the call; keep a fresh clone.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::Waiting {
                    fut: Box::pin(async move {
                        let admission = match pending.wait().await {
                            Ok(a) => a,
                            Err(r) => return Ok(GovBody::rejected(&r, grpc.is_some())),
                        };
                        let req = metered(req, &admission);
                        let fut = inner.ready().await.map_err(Into::into)?.call(req);
                        ResponseFuture::called(fut, admission, grpc).await
                    }),
                }
            }
        }
    }
}

fn metered<B>(req: Request<B>, admission: &Admission) -> Request<MeteredBody<B>> {
    req.map(|body| GovBody::request(body, admission))
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
            grpc: bool,
        },
        Rejected {
            rejection: Option<Rejection>,
            grpc: bool,
        },
        Waiting {
            fut: BoxResponse<B>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    fn called(fut: F, mut admission: Admission, grpc: Option<GrpcCall>) -> Self {
        if let Some(call) = grpc {
            admission.set_caller_deadline(call.deadline);
        }
        let deadline = admission.timeout().map(|t| Box::pin(tokio::time::sleep(t)));
        ResponseFuture::Called {
            fut,
            admission: Some(admission),
            deadline,
            grpc: grpc.is_some(),
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
                grpc,
            } => {
                if let Some(d) = deadline
                    && d.as_mut().poll(cx).is_ready()
                    && let Some(a) = admission.take()
                {
                    return Poll::Ready(Ok(GovBody::rejected(&a.timed_out(), *grpc)));
                }
                match fut.poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Ok(response)) => {
                        let call = admission.take().map(|mut a| {
                            a.record_head(*grpc, response.status(), response.headers());
                            (a, ())
                        });
                        Poll::Ready(Ok(response.map(|body| GovBody::Response { body, call })))
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
            ResponseFutureProj::Rejected { rejection, grpc } => match rejection.take() {
                Some(r) => Poll::Ready(Ok(GovBody::rejected(&r, *grpc))),
                None => Poll::Ready(Err("response future polled after completion".into())),
            },
            ResponseFutureProj::Waiting { fut } => fut.as_mut().poll(cx),
        }
    }
}
