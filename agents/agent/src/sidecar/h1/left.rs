//! A call whose client left in the middle of its request body (it closed, or
//! stalled past the client timeout) on the HTTP/1 path.
//!
//! The upstream already has the request's head and may be working on it (a
//! servlet does, whatever happens to the connection): the call's admission
//! (bulkhead permits, in-flight counts) is held until the upstream answers or
//! closes, at most for the listener's hold bound (`--client-gone-hold`), as
//! on hyper's side ([`crate::sidecar::abandoned`]), on a task of its own while
//! the client connection closes. Counted in `/metrics` with hyper's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::codec::{MAX_HEADERS, head_end};
use super::pool::Upstream;
use super::relay::READ_CHUNK;
use crate::sidecar::serve::Connections;
use gov_engine::{Admission, Outcome};

/// Holds `admission` until `upstream` answers (its status is the call's
/// outcome) or closes (no outcome: the client broke the call off), at most
/// `hold`; then drops the connection.
pub(super) fn hold(
    mut upstream: Upstream,
    mut admission: Admission,
    hold: Duration,
    conns: Arc<Connections>,
) {
    conns.client_gone.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        let answered = tokio::time::timeout(hold, async {
            loop {
                if let Ok(Some(_)) = head_end(&upstream.buf, 0, false) {
                    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let mut resp = httparse::Response::new(&mut slots);
                    if let (Ok(_), Some(code)) = (resp.parse(&upstream.buf), resp.code) {
                        admission.record(Outcome::Status(code));
                    }
                    return;
                }
                upstream.buf.reserve(READ_CHUNK);
                match upstream.stream.read_buf(&mut upstream.buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        if answered.is_err() {
            conns.client_gone_cut.fetch_add(1, Ordering::Relaxed);
        }
        drop(admission);
    });
}
