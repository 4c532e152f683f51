//! Route matching: which rules apply to a request.
//!
//! Compiled once per config. Each rule's match expression becomes a `Cond`
//! tree; a `Router` per direction indexes rules by the path their match
//! requires (an exact path in a hash map, a prefix in a list sorted
//! longest-first), so a request only evaluates the trees of rules whose path
//! can match, plus the rules whose match has no path requirement. Matching
//! does not allocate for up to [`INLINE_RULES`] matched rules.

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use smallvec::SmallVec;

use crate::config::{Direction, Rule, RuleId};

/// Matched rules kept inline (no allocation) per request.
pub const INLINE_RULES: usize = 8;

/// The rules that matched one request, in rule-id order.
pub type Matched = SmallVec<[RuleId; INLINE_RULES]>;

/// A compiled match expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cond {
    Any,
    PathExact(Box<str>),
    PathPrefix(Box<str>),
    Method(Method),
    Header(HeaderName, HeaderValue),
    Consumer(Box<str>),
    CallsTo(Box<str>),
    And(Box<[Cond]>),
    Or(Box<[Cond]>),
}

/// Where the engine reads request headers from: an `http::HeaderMap`, or the
/// headers of a head parsed in place by `httparse` (no map is built).
#[derive(Clone, Copy, Debug)]
pub enum Headers<'a> {
    Map(&'a HeaderMap),
    Raw(&'a [httparse::Header<'a>]),
}

impl<'a> Headers<'a> {
    /// The first value of `name`, as bytes.
    pub fn get(&self, name: &HeaderName) -> Option<&'a [u8]> {
        match *self {
            Headers::Map(map) => map.get(name).map(HeaderValue::as_bytes),
            Headers::Raw(raw) => raw
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name.as_str()))
                .map(|h| h.value),
        }
    }

    /// The first value of `name` when it is visible ASCII (as
    /// `HeaderValue::to_str` accepts), else `None`.
    pub fn get_str(&self, name: &HeaderName) -> Option<&'a str> {
        let value = self.get(name)?;
        if value.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
            std::str::from_utf8(value).ok()
        } else {
            None
        }
    }
}

/// The parts of a request that matches look at.
#[derive(Debug)]
pub(crate) struct View<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub headers: Headers<'a>,
    /// The header carrying the caller identity.
    pub consumer_header: &'a HeaderName,
    /// The called service (outbound).
    pub target: Option<&'a str>,
    /// The consumer, once looked up (most requests never need it).
    consumer: Cell<Option<Option<&'a str>>>,
}

impl<'a> View<'a> {
    pub(crate) fn new(
        method: &'a Method,
        path: &'a str,
        headers: Headers<'a>,
        consumer_header: &'a HeaderName,
        target: Option<&'a str>,
    ) -> Self {
        Self {
            method,
            path,
            headers,
            consumer_header,
            target,
            consumer: Cell::new(None),
        }
    }

    /// The caller identity (the consumer header), read on first use.
    pub(crate) fn consumer(&self) -> Option<&'a str> {
        if let Some(c) = self.consumer.get() {
            return c;
        }
        let c = self.headers.get_str(self.consumer_header);
        self.consumer.set(Some(c));
        c
    }
}

impl Cond {
    pub(crate) fn eval(&self, r: &View<'_>) -> bool {
        match self {
            Cond::Any => true,
            Cond::PathExact(p) => r.path == &**p,
            Cond::PathPrefix(p) => r.path.starts_with(&**p),
            Cond::Method(m) => r.method == m,
            Cond::Header(name, value) => r.headers.get(name) == Some(value.as_bytes()),
            Cond::Consumer(c) => r.consumer() == Some(&**c),
            Cond::CallsTo(s) => r.target == Some(&**s),
            Cond::And(items) => items.iter().all(|c| c.eval(r)),
            Cond::Or(items) => items.iter().any(|c| c.eval(r)),
        }
    }

    /// A path every matching request must have, if the expression requires one.
    fn required_path(&self) -> Option<PathReq<'_>> {
        match self {
            Cond::PathExact(p) => Some(PathReq::Exact(p)),
            Cond::PathPrefix(p) => Some(PathReq::Prefix(p)),
            Cond::And(items) => items.iter().find_map(Cond::required_path),
            _ => None,
        }
    }
}

enum PathReq<'a> {
    Exact(&'a str),
    Prefix(&'a str),
}

/// FxHash (rustc's hasher): paths are not attacker-chosen keys here (the map
/// is built from the config, requests only look up), and SipHash would cost
/// more than the rest of the decision.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut buf = [0u8; 8];
            buf.copy_from_slice(c);
            self.add(u64::from_le_bytes(buf));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

/// The rules of one direction, indexed by required path.
#[derive(Debug, Default)]
pub(crate) struct Router {
    exact: HashMap<Box<str>, Vec<RuleId>, FxBuild>,
    // INVARIANT: sorted by prefix length, longest first.
    prefixes: Vec<(Box<str>, Vec<RuleId>)>,
    /// Rules without a path requirement: always evaluated.
    always: Vec<RuleId>,
    /// Whether the router has any rule at all.
    pub(crate) is_empty: bool,
}

impl Router {
    pub(crate) fn new(rules: &[Rule], direction: Direction) -> Self {
        let mut router = Router::default();
        let mut prefixes: HashMap<&str, Vec<RuleId>> = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            if rule.direction != direction {
                continue;
            }
            // The config has at most MAX_RULES rules, so the index fits.
            let id = RuleId(u32::try_from(i).unwrap_or(u32::MAX));
            match rule.on.required_path() {
                Some(PathReq::Exact(p)) => router.exact.entry(p.into()).or_default().push(id),
                Some(PathReq::Prefix(p)) => prefixes.entry(p).or_default().push(id),
                None => router.always.push(id),
            }
        }
        router.prefixes = prefixes
            .into_iter()
            .map(|(p, ids)| (Box::<str>::from(p), ids))
            .collect();
        router
            .prefixes
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        router.is_empty =
            router.exact.is_empty() && router.prefixes.is_empty() && router.always.is_empty();
        router
    }

    /// The rules whose match holds for `r`, in rule-id order.
    pub(crate) fn matches(&self, rules: &[Rule], r: &View<'_>, out: &mut Matched) {
        let mut push = |id: RuleId| {
            if rules[id.0 as usize].on.eval(r) {
                out.push(id);
            }
        };
        if !self.exact.is_empty()
            && let Some(ids) = self.exact.get(r.path)
        {
            ids.iter().copied().for_each(&mut push);
        }
        for (prefix, ids) in &self.prefixes {
            if r.path.starts_with(&**prefix) {
                ids.iter().copied().for_each(&mut push);
            }
        }
        self.always.iter().copied().for_each(&mut push);
        // Rule-id order gives every request the same acquisition order.
        // Insertion sort: a handful of ids, mostly in order already (the
        // slice sort's setup costs more than the sorting here).
        for i in 1..out.len() {
            let mut j = i;
            while j > 0 && out[j - 1] > out[j] {
                out.swap(j - 1, j);
                j -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CompiledConfig;
    use gov_proto::v1 as proto;
    use proto::match_expr::Kind;

    fn expr(kind: Kind) -> proto::MatchExpr {
        proto::MatchExpr { kind: Some(kind) }
    }

    fn prefix(p: &str) -> proto::MatchExpr {
        expr(Kind::Path(proto::PathMatch {
            kind: proto::PathKind::Prefix as i32,
            value: p.into(),
        }))
    }

    fn exact(p: &str) -> proto::MatchExpr {
        expr(Kind::Path(proto::PathMatch {
            kind: proto::PathKind::Exact as i32,
            value: p.into(),
        }))
    }

    fn timeout(name: &str, on: proto::MatchExpr) -> proto::Timeout {
        proto::Timeout {
            rule: format!("svc/{name}"),
            on: Some(on),
            timeout_ms: 100,
            ..Default::default()
        }
    }

    fn matched(
        cfg: &CompiledConfig,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Vec<String> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let view = View::new(
            &method,
            path,
            Headers::Map(&map),
            &cfg.consumer_header,
            None,
        );
        let mut out = Matched::new();
        cfg.inbound.matches(&cfg.rules, &view, &mut out);
        out.iter()
            .map(|id| cfg.rules[id.0 as usize].name.to_string())
            .collect()
    }

    #[test]
    fn matches_paths_methods_headers_consumers() {
        let t = proto::TargetConfig {
            service: "svc".into(),
            timeouts: vec![
                timeout("a_prefix", prefix("/a")),
                timeout("ab_prefix", prefix("/a/b")),
                timeout("exact", exact("/a/b/c")),
                timeout("any", expr(Kind::Any(true))),
                timeout(
                    "post_orders",
                    expr(Kind::And(proto::MatchList {
                        exprs: vec![
                            expr(Kind::Or(proto::MatchList {
                                exprs: vec![
                                    expr(Kind::Method("POST".into())),
                                    expr(Kind::Method("PUT".into())),
                                ],
                            })),
                            prefix("/orders"),
                        ],
                    })),
                ),
                timeout(
                    "crm",
                    expr(Kind::And(proto::MatchList {
                        exprs: vec![prefix("/mdm"), expr(Kind::Consumer("crm".into()))],
                    })),
                ),
                timeout(
                    "gold",
                    expr(Kind::Header(proto::HeaderMatch {
                        name: "X-Tenant".into(),
                        value: "gold".into(),
                    })),
                ),
            ],
            ..Default::default()
        };
        let cfg = CompiledConfig::try_from(&t).unwrap();
        assert_eq!(matched(&cfg, "GET", "/zzz", &[]), ["svc/any"]);
        assert_eq!(
            matched(&cfg, "GET", "/a/b/c", &[]),
            ["svc/a_prefix", "svc/ab_prefix", "svc/exact", "svc/any"]
        );
        assert_eq!(
            matched(&cfg, "GET", "/ab", &[]),
            ["svc/a_prefix", "svc/any"]
        );
        assert_eq!(
            matched(&cfg, "PUT", "/orders/1", &[]),
            ["svc/any", "svc/post_orders"]
        );
        assert_eq!(matched(&cfg, "GET", "/orders/1", &[]), ["svc/any"]);
        assert_eq!(
            matched(&cfg, "GET", "/mdm/x", &[("x-gov-consumer", "crm")]),
            ["svc/any", "svc/crm"]
        );
        assert_eq!(
            matched(&cfg, "GET", "/mdm/x", &[("x-gov-consumer", "shop")]),
            ["svc/any"]
        );
        assert_eq!(
            matched(&cfg, "GET", "/", &[("x-tenant", "gold")]),
            ["svc/any", "svc/gold"]
        );
    }

    #[test]
    fn prefixes_sorted_longest_first() {
        let t = proto::TargetConfig {
            timeouts: vec![
                timeout("a", prefix("/a")),
                timeout("abc", prefix("/abc")),
                timeout("ab", prefix("/ab")),
            ],
            ..Default::default()
        };
        let cfg = CompiledConfig::try_from(&t).unwrap();
        let lens: Vec<usize> = cfg.inbound.prefixes.iter().map(|(p, _)| p.len()).collect();
        assert_eq!(lens, [4, 3, 2]);
    }
}
