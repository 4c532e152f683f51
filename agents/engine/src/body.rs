//! The one body type of a governed call, [`GovBody`]: the request body
//! counted for the call's byte limits as it streams, the response body
//! counted the same way and holding the call's [`Admission`] (its permits,
//! its in-flight count) until it ends, or a short body the agent made
//! itself (a rejection). Made by [`crate::Govern`] (which the sidecar's
//! hyper path runs through too); never buffered, and an enum rather than a boxed trait object,
//! so a response costs no allocation.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

use crate::admission::{Admission, ByteMeter};
use crate::outcome::Outcome;
use crate::rejection::Rejection;

pin_project! {
    /// A body of a governed call.
    #[project = GovBodyProj]
    pub enum GovBody<B> {
        /// A request body, counted by its call's byte meter (`None`: no byte
        /// limit matched).
        Request {
            #[pin]
            body: B,
            meter: Option<ByteMeter>,
        },
        /// A response body; the call ends (permits released) when it ends,
        /// fails, or is dropped (the client left).
        Response {
            #[pin]
            body: B,
            call: Option<Admission>,
        },
        /// Made here (a rejection, or an answer of the agent's own).
        Local {
            body: Full<Bytes>,
        },
    }
}

/// A request body counted for its call's byte limits.
pub type MeteredBody<B> = GovBody<B>;

impl<B> GovBody<B> {
    /// The request body of `admission`'s call.
    pub fn request(body: B, admission: &Admission) -> Self {
        Self::metered(body, admission.byte_meter())
    }

    /// A request body counted by `meter` (`None`: not counted).
    pub fn metered(body: B, meter: Option<ByteMeter>) -> Self {
        GovBody::Request { body, meter }
    }

    /// The response body of `admission`'s call, which it holds until the
    /// body ends. Record the outcome at the head before
    /// ([`Admission::record_head`]); a gRPC call's status, when its head
    /// did not carry it, is recorded from the trailers here. (Something
    /// else the response must hold until it ends, such as a balancer's pick
    /// of the endpoint, is the inner body's to hold.)
    pub fn response(body: B, admission: Admission) -> Self {
        GovBody::Response {
            body,
            call: Some(admission),
        }
    }

    /// A short body made here.
    pub fn local(bytes: impl Into<Bytes>) -> Self {
        GovBody::Local {
            body: Full::new(bytes.into()),
        }
    }

    /// The response to a rejection of a call that is gRPC (`grpc`) or not,
    /// from its one mapping to HTTP.
    pub fn rejected(rejection: &Rejection, grpc: bool) -> http::Response<Self> {
        rejection.respond(grpc).map(|body| GovBody::Local { body })
    }

    /// The inner body (`None` for a local one).
    pub fn into_inner(self) -> Option<B> {
        match self {
            GovBody::Request { body, .. } | GovBody::Response { body, .. } => Some(body),
            GovBody::Local { .. } => None,
        }
    }
}

impl<B> Body for GovBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            GovBodyProj::Request { body, meter } => {
                let polled = body.poll_frame(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(meter)) = (&polled, meter.as_ref())
                    && let Some(data) = frame.data_ref()
                {
                    meter.add(data.len() as u64);
                }
                polled
            }
            GovBodyProj::Response { body, call } => {
                let polled = body.poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(admission) = call.as_mut() {
                            if let Some(data) = frame.data_ref() {
                                admission.add_bytes(data.len() as u64);
                            } else if let Some(outcome) =
                                frame.trailers_ref().and_then(crate::grpc::trailers_outcome)
                            {
                                // A gRPC call's status (first record wins: a
                                // call recorded at its head keeps that).
                                admission.record(outcome);
                            }
                        }
                    }
                    // The call is over: release its permits now, not when the
                    // body is dropped. A gRPC call whose status never came
                    // ended `UNKNOWN` (or reset), as its client sees it.
                    Poll::Ready(None) => {
                        if let Some(mut admission) = call.take() {
                            admission.end_of_response();
                        }
                    }
                    Poll::Ready(Some(Err(_))) => {
                        if let Some(mut admission) = call.take() {
                            admission.record(Outcome::Reset);
                        }
                    }
                    Poll::Pending => {}
                }
                polled
            }
            GovBodyProj::Local { body } => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GovBody::Request { body, .. } | GovBody::Response { body, .. } => body.is_end_stream(),
            GovBody::Local { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GovBody::Request { body, .. } | GovBody::Response { body, .. } => body.size_hint(),
            GovBody::Local { body } => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use http_body_util::BodyExt;

    use super::*;
    use crate::{Decision, Engine, Outcome, RequestInfo};

    const ONE_AT_A_TIME: &str = r#"
service: order
rules:
- name: order/one
  on: {path: {kind: PATH_KIND_PREFIX, value: /}}
  bulkhead:
    max_concurrent: 1
"#;

    fn admitted(engine: &Engine) -> bool {
        let h = http::HeaderMap::new();
        let info = RequestInfo::inbound(&http::Method::GET, "/x", &h);
        matches!(engine.try_admit(&info), Decision::Admitted(_))
    }

    #[tokio::test]
    async fn a_response_body_holds_its_call_until_its_last_frame() {
        let engine = Engine::empty("order");
        let mut target = serde_yaml::from_str(ONE_AT_A_TIME).expect("the test config parses");
        gov_proto::compiled::fill(&mut target);
        assert!(engine.apply_target(&target).is_ok());
        let h = http::HeaderMap::new();
        let info = RequestInfo::inbound(&http::Method::GET, "/x", &h);
        let Decision::Admitted(mut admission) = engine.try_admit(&info) else {
            panic!("the first call is admitted");
        };
        admission.record(Outcome::Status(200));
        let body = GovBody::response(Full::new(Bytes::from("hello")), admission);
        let mut body = pin!(body);
        assert!(
            !admitted(&engine),
            "the permit is held while the body streams"
        );
        let mut received = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            received.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref()));
        }
        assert_eq!(received, b"hello");
        // The body is not dropped yet: its end released the permit.
        assert!(admitted(&engine));
        assert_eq!(engine.stats().rules[0].in_flight, 0);
    }

    #[tokio::test]
    async fn a_grpc_response_without_a_status_ends_unknown_and_no_other_does() {
        let engine = Engine::empty("order");
        let mut target = serde_yaml::from_str(ONE_AT_A_TIME).expect("the test config parses");
        gov_proto::compiled::fill(&mut target);
        assert!(engine.apply_target(&target).is_ok());
        let h = http::HeaderMap::new();
        let info = RequestInfo::inbound(&http::Method::POST, "/x", &h);
        for grpc in [true, false] {
            let Decision::Admitted(mut admission) = engine.try_admit(&info) else {
                panic!("one call at a time is admitted");
            };
            if grpc {
                // A gRPC head without `grpc-status`: the status is awaited.
                admission.record_head(true, http::StatusCode::OK, &h);
            }
            let body = GovBody::response(Full::new(Bytes::from("x")), admission);
            let collected = body.collect().await.map(|c| c.to_bytes());
            assert_eq!(collected.ok().as_deref(), Some(&b"x"[..]));
        }
        let stats = &engine.stats().rules[0];
        assert_eq!(stats.grpc[2], 1, "UNKNOWN: {:?}", stats.grpc);
        assert_eq!(
            stats.grpc.iter().sum::<u64>(),
            1,
            "the plain call is no gRPC call"
        );
        assert_eq!(stats.in_flight, 0);
    }
}
