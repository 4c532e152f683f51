//! The engine as a tower layer: [`GovernLayer`] wraps any
//! `Service<http::Request<B>>` so a Rust service can enforce its policy in
//! process, without the sidecar. This is the one lifecycle of an admitted
//! call on hyper's side: the sidecar's hyper path is a [`Govern`] around its
//! forwarding service (its HTTP/1 path drives the same [`Admission`] calls
//! on its own connection state machine).
//!
//! The decision needs the request (its path, method, headers, and for an
//! outbound call its [`CallTarget`] extension), so unlike tower's
//! `ConcurrencyLimit` it is taken in `call`, not `poll_ready`: `poll_ready`
//! only asks the inner service. An [`Observe`]r given by
//! [`GovernLayer::observe`] is told the decisions it samples. An admitted
//! request carries the shadow rules that would have refused it
//! ([`Admission::stamp`]). An admitted call holds its permits until the
//! response body ends; its outcome (status) is recorded at the response head,
//! or, when the inner service fails, from its [`CallError`] (a reset
//! otherwise); request and response bytes are counted for byte limits as they
//! stream. A call still without a response head at its deadline is answered
//! 504 (or DEADLINE_EXCEEDED) by [`Admission::timed_out`], and the inner
//! service's future is dropped. A rejection never reaches the inner service
//! and is answered by [`Rejection::respond`] (the gRPC form for a gRPC call).
//! A gRPC call's outcome is its `grpc-status` ([`crate::grpc`]). The
//! caller's deadline (`grpc-timeout`, or `gov-timeout` for any other
//! request, [`crate::deadline`]) is the call's when sooner than its rules';
//! a call whose deadline is used up on arrival or while it waits is refused
//! without taking a permit, and the inner service gets the request with
//! what is left of it. Only a call that must wait (a bulkhead permit, a
//! shaping delay) allocates.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service, ServiceExt};

use crate::admission::Admission;
use crate::body::{GovBody, MeteredBody};
use crate::config::Direction;
use crate::deadline::{self, DeadlineHeader};
use crate::decision::{Decision, Observe, observed};
use crate::engine::Engine;
use crate::grpc::GrpcCall;
use crate::outcome::Outcome;
use crate::rejection::Rejection;
use crate::request::{RequestInfo, Target};

/// Errors of the inner service, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Request extension naming the destination of an outbound call, for a
/// [`GovernLayer::outbound`] stack (`calls to SERVICE`, per-instance
/// bulkheads): put it on the request before [`Govern`] decides, with the
/// instance when the caller has already picked one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallTarget {
    pub service: Arc<str>,
    pub instance: Option<Arc<str>>,
}

/// An inner service's error that says how the call ended, for fuses and
/// latency: [`Govern`] records its outcome ([`Outcome::ConnectFailure`]: the
/// destination could not be reached), or none when the request was never
/// sent (the permits go back uncounted). Any other error of the inner
/// service is recorded as [`Outcome::Reset`].
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("the governed service failed ({outcome:?}): {source}")]
pub struct CallError {
    outcome: Option<Outcome>,
    source: BoxError,
}

impl CallError {
    /// The call failed with `outcome` because of `source`.
    pub fn failed(outcome: Outcome, source: impl Into<BoxError>) -> Self {
        Self {
            outcome: Some(outcome),
            source: source.into(),
        }
    }

    /// The request was never sent (`source` says why): no outcome.
    pub fn unsent(source: impl Into<BoxError>) -> Self {
        Self {
            outcome: None,
            source: source.into(),
        }
    }

    /// The outcome [`Govern`] records (`None`: none).
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// The outcome recorded for any error of an inner service: its
    /// [`CallError`]'s, else a reset.
    pub fn outcome_of(error: &BoxError) -> Option<Outcome> {
        match error.downcast_ref::<CallError>() {
            Some(e) => e.outcome,
            None => Some(Outcome::Reset),
        }
    }
}

/// Applies the engine's decision around an inner service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct GovernLayer<O = ()> {
    engine: Engine,
    direction: Direction,
    observer: O,
}

impl GovernLayer {
    /// Server-side rules: requests arriving at this service.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            direction: Direction::Inbound,
            observer: (),
        }
    }

    /// Client-side rules: calls this service makes, each with a [`CallTarget`] extension.
    pub fn outbound(engine: Engine) -> Self {
        Self {
            engine,
            direction: Direction::Outbound,
            observer: (),
        }
    }
}

impl<O> GovernLayer<O> {
    /// The same layer telling `observer` the decisions it samples (a
    /// decision log).
    pub fn observe<P: Observe>(self, observer: P) -> GovernLayer<P> {
        GovernLayer {
            engine: self.engine,
            direction: self.direction,
            observer,
        }
    }
}

impl<S, O: Clone> Layer<S> for GovernLayer<O> {
    type Service = Govern<S, O>;

    /// One context per service built, so that clones of one [`Govern`]
    /// (one per request, as hyper and axum make them) share a count no
    /// other service touches.
    fn layer(&self, inner: S) -> Govern<S, O> {
        Govern {
            inner,
            cx: Arc::new(Cx {
                engine: self.engine.clone(),
                direction: self.direction,
                observer: self.observer.clone(),
            }),
        }
    }
}

/// The service built by [`GovernLayer`].
#[derive(Clone, Debug)]
pub struct Govern<S, O = ()> {
    inner: S,
    cx: Arc<Cx<O>>,
}

impl<S, O> Govern<S, O> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, to change.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

#[derive(Debug)]
struct Cx<O> {
    engine: Engine,
    direction: Direction,
    observer: O,
}

impl<O> Cx<O> {
    fn info<'a, B>(&self, req: &'a Request<B>) -> RequestInfo<'a> {
        let target = req.extensions().get::<CallTarget>();
        RequestInfo {
            direction: self.direction,
            method: req.method(),
            path: req.uri().path(),
            query: req.uri().query().unwrap_or_default(),
            claims: req
                .extensions()
                .get::<crate::request::VerifiedClaims>()
                .map_or(&[], |c| c.0.as_slice()),
            headers: crate::Headers::Map(req.headers()),
            target: target.map(|t| Target {
                service: &t.service,
                instance: t.instance.as_deref(),
            }),
        }
    }
}

impl<S, O, ReqB, ResB> Service<Request<ReqB>> for Govern<S, O>
where
    S: Service<Request<MeteredBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    O: Observe,
    ReqB: Body + Send + 'static,
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
        let header = DeadlineHeader::of(grpc.is_some());
        let caller = deadline::read(header, crate::Headers::Map(req.headers()), Instant::now);
        let sample = self.cx.observer.sample();
        let decision = {
            let info = self.cx.info(&req);
            // Doomed work is refused before the rules are asked.
            let decision = match self.cx.engine.refuse_doomed(self.cx.direction, caller) {
                Some(doomed) => Decision::Rejected(doomed),
                None => self.cx.engine.try_admit(&info),
            };
            match (decision, sample) {
                (Decision::Wait(pending), sample) => Err((pending, sample)),
                (Decision::Admitted(a), None) => Ok(Ok(a)),
                (Decision::Rejected(r), None) => Ok(Err(r)),
                (Decision::Admitted(a), Some(s)) => {
                    let bytes = req.body().size_hint().exact();
                    Ok(observed(&self.cx.observer, s, &info, bytes, Ok(a)))
                }
                (Decision::Rejected(r), Some(s)) => {
                    let bytes = req.body().size_hint().exact();
                    Ok(observed(&self.cx.observer, s, &info, bytes, Err(r)))
                }
            }
        };
        match decision {
            Ok(Ok(mut admission)) => {
                mark(&req, &mut admission);
                admission.set_caller_deadline(caller);
                let req = admitted(req, &admission, header);
                let fut = self.inner.call(req);
                ResponseFuture::called(fut, admission, grpc)
            }
            Ok(Err(rejection)) => ResponseFuture::Rejected {
                rejection: Some(rejection),
                grpc: grpc.is_some(),
            },
            Err((pending, sample)) => {
                // The ready service goes with the call; keep a fresh clone.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let cx = self.cx.clone();
                ResponseFuture::Waiting {
                    fut: Box::pin(async move {
                        let waited = cx.engine.wait_until(pending, cx.direction, caller).await;
                        let waited = match sample {
                            None => waited,
                            Some(s) => {
                                let info = cx.info(&req);
                                let bytes = req.body().size_hint().exact();
                                observed(&cx.observer, s, &info, bytes, waited)
                            }
                        };
                        let mut admission = match waited {
                            Ok(a) => a,
                            Err(r) => return Ok(GovBody::rejected(&r, grpc.is_some())),
                        };
                        mark(&req, &mut admission);
                        admission.set_caller_deadline(caller);
                        let req = admitted(req, &admission, header);
                        let fut = inner.ready().await.map_err(Into::into)?.call(req);
                        ResponseFuture::called(fut, admission, grpc).await
                    }),
                }
            }
        }
    }
}

/// A request extension: fuses count the call as a system error whatever
/// its outcome ([`Admission::count_as_system_error`]): the proxy's mark on a
/// call whose credential did not verify (`on invalid count`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountAsSystemError;

fn mark<B>(req: &Request<B>, admission: &mut Admission) {
    if req.extensions().get::<CountAsSystemError>().is_some() {
        admission.count_as_system_error();
    }
}

/// The request of an admitted call as the inner service gets it: stamped
/// with the shadow rules that would have refused it, carrying its deadline
/// in `header` (what is left of it, [`Admission::forwarded_deadline`]), its
/// body counted.
fn admitted<B>(
    mut req: Request<B>,
    admission: &Admission,
    header: DeadlineHeader,
) -> Request<MeteredBody<B>> {
    admission.stamp(req.headers_mut());
    if let Some(retry) = admission.retry() {
        req.extensions_mut().insert(retry);
    }
    deadline::write(req.headers_mut(), header, admission.forwarded_deadline());
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
            // Inline, not boxed: a call with a deadline allocates nothing.
            #[pin]
            deadline: Option<Sleep>,
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
    fn called(fut: F, admission: Admission, grpc: Option<GrpcCall>) -> Self {
        let deadline = admission.timeout().map(tokio::time::sleep);
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
                if let Some(d) = deadline.as_pin_mut()
                    && d.poll(cx).is_ready()
                    && let Some(a) = admission.take()
                {
                    return Poll::Ready(Ok(GovBody::rejected(&a.timed_out(), *grpc)));
                }
                match fut.poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Ok(mut response)) => {
                        let call = admission.take().map(|mut a| {
                            a.record_head(*grpc, response.status(), response.headers());
                            a.insert_ratelimit(response.headers_mut());
                            a
                        });
                        Poll::Ready(Ok(response.map(|body| GovBody::Response { body, call })))
                    }
                    Poll::Ready(Err(e)) => {
                        // The service failed without a response.
                        let e = e.into();
                        if let Some(a) = admission.take()
                            && let Some(outcome) = CallError::outcome_of(&e)
                        {
                            a.finish(outcome);
                        }
                        Poll::Ready(Err(e))
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
