//! A call whose client leaves is finished anyway, on hyper's side.
//!
//! An admitted call holds its admission (bulkhead permits, in-flight counts)
//! in its response body until that body ends. When the client leaves (a
//! disconnect, an HTTP/2 `RST_STREAM`, a handed-over connection closing
//! early), hyper drops the call's future or its response body, which would
//! release the permit while the upstream is still working on the request: a
//! client that connects, asks and leaves could then keep any number of calls
//! running at the upstream behind `max_concurrent 5` (a paced HTTP/2 Rapid
//! Reset). So a call whose future is dropped goes on by itself on a task of
//! its own ([`Detached`]), and a response body dropped before its end
//! ([`Held`]) is read to its end and discarded on another task, at most for
//! the listener's hold bound: the permit goes back when the upstream is
//! done, as on the HTTP/1 path. A call whose client stays starts no task.
//!
//! Limits and fuses count such a call once, with the upstream's own outcome
//! (its status at the head, its end or reset from the body). Both what left
//! and what was cut at the bound are counted in `/metrics`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;

use super::serve::Connections;
use super::upstream::PickedBody;

/// What [`Held`] wraps: the engine's body of a governed call.
pub(crate) type Inner = gov_engine::GovBody<PickedBody>;

/// How long, at most, the agent goes on with a call whose client left, by
/// default (`--client-gone-hold`): the upstream's answer is read and
/// discarded until then, and the call's permits held.
pub const DEFAULT_CLIENT_GONE_HOLD: Duration = Duration::from_secs(60);

/// How many admitted calls one connection may abandon in a second before
/// it is closed: a browser or a client hedging its calls leaves a few; a
/// client that asks and resets faster makes the upstream work for nothing.
pub const ABANDON_BUDGET_PER_SECOND: u32 = 100;

/// What a listener's held calls report to, how long they are held, and the
/// connection's budget of abandoned calls.
#[derive(Clone)]
pub(crate) struct Hold {
    pub(crate) bound: Duration,
    pub(crate) conns: Arc<Connections>,
    pub(crate) budget: Arc<Budget>,
}

/// One connection's abandoned calls in the current second; over
/// [`ABANDON_BUDGET_PER_SECOND`], `close` is cancelled: the connection
/// finishes what it has (HTTP/2: GOAWAY) and takes nothing new.
pub(crate) struct Budget {
    /// (start of the current second, calls abandoned in it).
    window: std::sync::Mutex<(tokio::time::Instant, u32)>,
    close: tokio_util::sync::CancellationToken,
}

impl Budget {
    pub(crate) fn new(close: tokio_util::sync::CancellationToken) -> Self {
        Self {
            window: std::sync::Mutex::new((tokio::time::Instant::now(), 0)),
            close,
        }
    }
}

impl Hold {
    /// Counts one call whose client left; closes the connection once it
    /// leaves more than its budget in a second.
    fn abandoned(&self) {
        self.conns.client_gone.fetch_add(1, Ordering::Relaxed);
        let over = {
            let Ok(mut window) = self.budget.window.lock() else {
                return;
            };
            let now = tokio::time::Instant::now();
            if now.duration_since(window.0) >= Duration::from_secs(1) {
                *window = (now, 0);
            }
            window.1 = window.1.saturating_add(1);
            window.1 > ABANDON_BUDGET_PER_SECOND
        };
        if over && !self.budget.close.is_cancelled() {
            self.budget.close.cancel();
            self.conns.closed_abandoning.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                budget = ABANDON_BUDGET_PER_SECOND,
                "closing a connection that abandons admitted calls faster than its budget"
            );
        }
    }
}

/// The body of every response of the proxy listeners: [`Inner`] (the
/// upstream's, holding the call's admission and endpoint pick; or the
/// agent's own), which, dropped before its end, is read to its end on a
/// task of its own (bounded by [`Hold::bound`]) instead of being dropped
/// with the call's admission in it.
pub(crate) struct Held {
    body: Inner,
    /// `None`: nothing to finish (an answer of the agent's own).
    hold: Option<Hold>,
    ended: bool,
}

impl Held {
    /// A body with nothing to finish if it is dropped.
    pub(crate) fn free(body: Inner) -> Self {
        Self {
            body,
            hold: None,
            ended: false,
        }
    }

    /// An upstream's body, finished under `hold` if it is dropped early.
    pub(crate) fn upstream(body: Inner, hold: Hold) -> Self {
        Self {
            body,
            hold: Some(hold),
            ended: false,
        }
    }
}

impl Body for Held {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Held {
    /// Hands a body dropped before its end to a task that reads it to the
    /// end, counted, unless there is nothing to finish.
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some((body, hold)) = self.unfinished() {
            hold.abandoned();
            let until = tokio::time::Instant::now() + hold.bound;
            runtime.spawn(drain(body, hold, until));
        }
    }
}

impl Held {
    /// The upstream's body and its hold, unless it has ended or there is
    /// nothing to finish; what is left behind does nothing when dropped.
    fn unfinished(&mut self) -> Option<(Inner, Hold)> {
        let hold = self.hold.take()?;
        if self.ended || self.body.is_end_stream() {
            return None;
        }
        let body = std::mem::replace(&mut self.body, Inner::local(Bytes::new()));
        Some((body, hold))
    }
}

/// Reads `body` to its end (or its first error), at most until `until`.
async fn drain(mut body: Inner, hold: Hold, until: tokio::time::Instant) {
    let read = async {
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
    };
    if tokio::time::timeout_at(until, read).await.is_err() {
        cut(&hold);
    }
}

/// A call whose client left ran past the hold bound: it is cut (its permits
/// go back with it).
fn cut(hold: &Hold) {
    hold.conns.client_gone_cut.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(bound = ?hold.bound, "a call whose client left ran past the hold bound; cut");
}

/// A call run in place, that goes on by itself if its caller stops
/// waiting: hyper drops a call's future when its client leaves, and this
/// future's drop then hands the call (already boxed, so it is not copied)
/// to a task of its own, which runs it for at most `hold.bound` and reads
/// its response body to the end within the same bound; the permits go back
/// when the upstream is done. A call whose client stays costs one
/// allocation and no task. A call never polled is never run.
pub(crate) struct Detached<F: Future<Output = Response<Held>> + Send + 'static> {
    call: Option<Pin<Box<F>>>,
    hold: Option<Hold>,
}

impl<F: Future<Output = Response<Held>> + Send + 'static> Detached<F> {
    pub(crate) fn new(call: F, hold: Hold) -> Self {
        Self {
            call: Some(Box::pin(call)),
            hold: Some(hold),
        }
    }
}

impl<F: Future<Output = Response<Held>> + Send + 'static> Future for Detached<F> {
    type Output = Response<Held>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response<Held>> {
        let Some(call) = self.call.as_mut() else {
            // Polled after its answer: nothing more to give.
            return Poll::Pending;
        };
        let response = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(response)
    }
}

impl<F: Future<Output = Response<Held>> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        let (Some(call), Some(hold)) = (self.call.take(), self.hold.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        hold.abandoned();
        let until = tokio::time::Instant::now() + hold.bound;
        runtime.spawn(async move {
            match tokio::time::timeout_at(until, call).await {
                Ok(response) => {
                    if let Some((body, _)) = response.into_body().unfinished() {
                        drain(body, hold, until).await;
                    }
                }
                Err(_) => cut(&hold),
            }
        });
    }
}
