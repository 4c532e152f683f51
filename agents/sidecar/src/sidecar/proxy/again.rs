//! What the attempts of one outbound call on hyper's side share: the
//! request to send again, the pick of the attempt in flight, its target.

use http::uri::{Authority, PathAndQuery, Scheme, Uri};

use crate::sidecar::upstream::{Pick, UpstreamClient};

/// What another attempt of an outbound call needs besides its body.
pub(super) struct Again {
    pub(super) method: http::Method,
    pub(super) version: http::Version,
    pub(super) headers: http::HeaderMap,
    pub(super) path: PathAndQuery,
    pub(super) client: UpstreamClient,
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
