//! The `RateLimit` headers of an admitted call's response, for the limits
//! that admitted it and say `headers always`.

use super::Admission;
use crate::clock::Now;

impl Admission {
    /// The `RateLimit-Policy` and `RateLimit` values of this call's
    /// response: an item for each limit that admitted it and says `headers
    /// always` (its policy, and what is left to the call's key now with the
    /// seconds until its quota is whole; a cluster limit, whose count is in
    /// the shared store, names its policy alone). `None` when there is no
    /// such limit (or none names what is left: `RateLimit` empty).
    pub fn ratelimit_headers(&self) -> Option<(String, Option<String>)> {
        let call = self.0.as_deref()?;
        let snap = call.snap.as_deref().filter(|s| s.any_headers_always)?;
        let now = Now::read();
        let mut out: Option<(String, Option<String>)> = None;
        // Every rule that granted the call, held plainly (a bit) or not,
        // in decision order.
        for id in call.granted() {
            let (Some(state), Some(rule)) = (
                snap.states.get(id as usize),
                snap.config.rules.get(id as usize),
            ) else {
                continue;
            };
            // A plain hold is in the rule's own scope.
            let scope = (call.held.iter())
                .find(|h| h.rule == id)
                .and_then(|h| call.scope(h));
            let Some((policy, state)) = state.admitted_ratelimit(&rule.name, scope, now) else {
                continue;
            };
            out = Some(match out {
                None => (policy, state),
                Some((p, s)) => (
                    format!("{p}, {policy}"),
                    match (s, state) {
                        (Some(s), Some(t)) => Some(format!("{s}, {t}")),
                        (s, t) => s.or(t),
                    },
                ),
            });
        }
        out
    }

    /// Adds [`Admission::ratelimit_headers`] to a response's `headers`,
    /// after any the upstream sent for its own quotas (a list's items may
    /// come in several fields, RFC 9110 5.3).
    pub fn insert_ratelimit(&self, headers: &mut http::HeaderMap) {
        let Some((policy, state)) = self.ratelimit_headers() else {
            return;
        };
        if let Ok(v) = http::HeaderValue::from_str(&policy) {
            headers.append(crate::RATELIMIT_POLICY, v);
        }
        if let Some(v) = state.and_then(|s| http::HeaderValue::from_str(&s).ok()) {
            headers.append(crate::RATELIMIT, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, Method};

    use crate::{Decision, RequestInfo};

    /// A limit that says `headers always` names what is left to every call
    /// it admits, a call it granted plainly too (issue 39: held as a bit of
    /// the call's plain holds, not a `Held`); one that does not, nothing.
    #[test]
    fn an_admitted_call_names_its_plain_limit() {
        let e = crate::admission::engine_of(
            r#"
service: shop
rules:
- name: shop/told
  on: {path: {kind: PATH_KIND_PREFIX, value: /told}}
  limit:
    calls: {amount: 3, window_ms: 3600000}
    ratelimit_headers_always: true
- name: shop/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /told}}
  bulkhead: {max_concurrent: 9}
- name: shop/quiet
  on: {path: {kind: PATH_KIND_PREFIX, value: /quiet}}
  limit:
    calls: {amount: 3, window_ms: 3600000}
"#,
        );
        let h = HeaderMap::new();
        let admit = |path| match e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
            Decision::Admitted(a) => a,
            _ => panic!("{path} not admitted"),
        };
        for left in [2, 1, 0] {
            let a = admit("/told");
            let (policy, state) = a.ratelimit_headers().expect("the told limit's headers");
            assert_eq!(policy, "\"shop/told\";q=3;w=3600");
            let state = state.expect("what is left");
            assert!(
                state.starts_with(&format!("\"shop/told\";r={left};t=")),
                "{state}"
            );
        }
        assert!(admit("/quiet").ratelimit_headers().is_none());
    }

    /// Every limit that admitted a call and says `headers always` names
    /// itself, in decision order: one held plainly (its own scope, a bit
    /// of the call) and one keyed by consumer (a hold of its own), each
    /// with what is left to its key.
    #[test]
    fn plain_and_keyed_limits_both_name_what_is_left() {
        let e = crate::admission::engine_of(
            r#"
service: order
consumer_header: x-gov-consumer
rules:
- name: order/plain
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  limit:
    calls: {amount: 3, window_ms: 3600000}
    ratelimit_headers_always: true
- name: order/keyed
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  limit:
    calls: {amount: 5, window_ms: 3600000}
    key: LIMIT_KEY_CONSUMER
    ratelimit_headers_always: true
- name: order/quiet
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  limit:
    calls: {amount: 7, window_ms: 3600000}
"#,
        );
        let mut headers = HeaderMap::new();
        headers.insert("x-gov-consumer", HeaderValue::from_static("crm"));
        let req = RequestInfo::inbound(&Method::GET, "/api/x", &headers);
        let Decision::Admitted(a) = e.try_admit(&req) else {
            panic!("admitted");
        };
        let (policy, state) = a.ratelimit_headers().expect("the headers");
        assert_eq!(
            policy,
            "\"order/plain\";q=3;w=3600, \"order/keyed\";q=5;w=3600"
        );
        let state = state.expect("what is left");
        assert!(
            state.starts_with("\"order/plain\";r=2;t=")
                && state.contains(", \"order/keyed\";r=4;t="),
            "{state}"
        );
    }
}
