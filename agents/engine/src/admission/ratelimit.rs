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
        for h in &call.held {
            let (Some(state), Some(rule)) = (
                snap.states.get(h.rule as usize),
                snap.config.rules.get(h.rule as usize),
            ) else {
                continue;
            };
            let scope = h
                .keyed()
                .then(|| call.keyed.iter().flatten().find(|(r, _)| *r == h.rule))
                .flatten()
                .map(|(_, s)| s);
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
