//! What the attempts of one outbound call on hyper's side share: the
//! request to send again, the pick of the attempt in flight, its target.

use http::uri::{Authority, PathAndQuery, Scheme, Uri};

use crate::sidecar::upstream::{Pick, Upstream};

/// What another attempt of an outbound call needs besides its body.
pub(super) struct Again {
    pub(super) method: http::Method,
    pub(super) version: http::Version,
    pub(super) headers: http::HeaderMap,
    pub(super) path: PathAndQuery,
    /// The `:authority` of a request sent over HTTP/2 (the client's), else
    /// the endpoint's address is the target's authority.
    pub(super) authority: Option<Authority>,
    pub(super) client: Upstream,
}

impl Again {
    /// The target of an attempt sent to `to`.
    pub(super) fn uri(&self, to: Authority) -> Option<Uri> {
        upstream_uri(self.authority.clone().unwrap_or(to), self.path.clone())
    }
}

/// The pick of a request sent and not answered yet. Dropped so (the engine's
/// deadline passed, or the client left), the time it waited is the endpoint's
/// latency sample: an endpoint that hangs must not look fast.
pub(super) struct Awaiting(pub(super) Option<Pick>);

impl Drop for Awaiting {
    fn drop(&mut self) {
        if let Some(pick) = self.0.take() {
            pick.timed_out();
        }
    }
}

/// `http://{to}{path}`, the target of a request sent upstream.
pub(super) fn upstream_uri(to: Authority, path: PathAndQuery) -> Option<Uri> {
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(to);
    uri.path_and_query = Some(path);
    Uri::from_parts(uri).ok()
}
