//! Route matching: which rules apply to a request.
//!
//! Compiled once per config. Each rule's match expression becomes a `Cond`
//! tree; a `Router` per direction indexes rules by the path their match
//! requires (exact paths and prefixes in lists by their second byte, each
//! longest first, compared first by their leading 8 bytes as one word; many
//! exact paths in a hash map instead), so a request only evaluates the
//! trees of rules whose path can match, plus the rules whose match has no
//! path requirement. Under a path index a rule keeps only what remains of
//! its match once the path is known to meet it (nothing for a rule matching
//! a path alone). Matching does not allocate for up to [`INLINE_RULES`]
//! matched rules. The gate of the rules without a path tells most requests
//! that they match none of those; a request that passes no gate and meets
//! an entry whose rules match on the path alone takes its plan from one scan
//! of the index (`Router::path_plan`). Else one bit (the second byte of
//! every exact path and prefix, `filter::PathFilter`) tells most requests
//! that match nothing so (`Router::reach_past_gate`).
//!
//! A path that meets a prefix (or equals an exact path) meets every shorter
//! prefix that prefix (or path) starts with, so each index entry holds, when
//! the config is compiled, the `Plan` of every rule its path alone
//! matches: the rules in the order their steps run, whether a scope needs
//! the consumer, and the shortest deadline. A request takes the plan of
//! the one entry it meets by reference (`PlanAt`), and copies it only to
//! add rules whose match has more to check and holds.

use std::cell::Cell;
use std::collections::HashMap;

use http::{HeaderName, HeaderValue, Method};

mod filter;
mod fx;
mod headers;
mod plan;
mod prefix;

use filter::PathFilter;
pub(crate) use fx::FxBuild;
pub use headers::Headers;
use headers::len_bit;
pub use plan::{INLINE_RULES, Matched, RuleId};
pub(crate) use plan::{Plan, PlanAt, RuleMeta};
use prefix::{Met, Prefix, Prefixes, SCANNED_EXACT};

/// Inbound (server side) or outbound (client side, `calls to X`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Inbound,
    Outbound,
}

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
    /// Folds every path it compares to lower case (ASCII), for a service that
    /// reads paths case-insensitively: requests are matched folded too.
    pub(crate) fn fold_case(&mut self) {
        match self {
            Cond::PathExact(p) | Cond::PathPrefix(p) => p.make_ascii_lowercase(),
            Cond::And(items) | Cond::Or(items) => items.iter_mut().for_each(Cond::fold_case),
            _ => {}
        }
    }

    /// Adds the header names this condition reads to `out` (each once).
    pub(crate) fn headers(&self, out: &mut Vec<HeaderName>) {
        match self {
            Cond::Header(name, _) if !out.contains(name) => out.push(name.clone()),
            Cond::And(items) | Cond::Or(items) => items.iter().for_each(|c| c.headers(out)),
            _ => {}
        }
    }

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

    /// A header every matching request must have, if the expression
    /// requires one.
    fn required_header(&self) -> Option<&HeaderName> {
        match self {
            Cond::Header(name, _) => Some(name),
            Cond::And(items) => items.iter().find_map(Cond::required_header),
            _ => None,
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

    /// What is left to check once the request's path is known to meet
    /// [`Cond::required_path`]: `None` when nothing is.
    fn residual(&self) -> Option<Cond> {
        match self {
            Cond::PathExact(_) | Cond::PathPrefix(_) => None,
            Cond::And(items) => {
                let k = items.iter().position(|c| c.required_path().is_some())?;
                if !matches!(items[k], Cond::PathExact(_) | Cond::PathPrefix(_)) {
                    // Required by a nested expression: check it all again.
                    return Some(self.clone());
                }
                let mut rest: Vec<Cond> = items.iter().take(k).cloned().collect();
                rest.extend(items.iter().skip(k + 1).cloned());
                match rest.len() {
                    0 => None,
                    1 => rest.pop(),
                    _ => Some(Cond::And(rest.into())),
                }
            }
            _ => Some(self.clone()),
        }
    }
}

enum PathReq<'a> {
    Exact(&'a str),
    Prefix(&'a str),
}

/// A rule under a path index, with what its match still has to check once
/// the request's path is known to meet the index (`None`: nothing, so a
/// rule matching only on a path costs no evaluation).
#[derive(Debug)]
struct Entry {
    id: RuleId,
    rest: Option<Cond>,
}

/// What a request meeting one index entry (a path, or a prefix) matches:
/// the plan of the rules its path alone matches, and the rules that have
/// more to check.
#[derive(Debug, Default)]
struct Node {
    plan: Plan,
    rest: Vec<Entry>,
}

impl Node {
    /// Whether a request meeting it matches exactly the rules of its plan
    /// (no rule has more to check) and some rule: its plan is the request's.
    fn plain(&self) -> bool {
        self.rest.is_empty() && !self.plan.is_empty()
    }

    /// The node of the rules of `entries` (each once).
    fn new<'a>(entries: impl IntoIterator<Item = &'a Entry>, metas: &[RuleMeta]) -> Self {
        let mut node = Node::default();
        for e in entries {
            match &e.rest {
                None => node.plan.add(e.id, &metas[e.id.0 as usize]),
                Some(c) => node.rest.push(Entry {
                    id: e.id,
                    rest: Some(c.clone()),
                }),
            }
        }
        node
    }
}

/// The rules of one direction, indexed by required path.
#[derive(Debug)]
pub(crate) struct Router {
    /// With more than [`SCANNED_EXACT`] exact paths, each one's node in
    /// `nodes` (with the rules of every prefix it starts with) and whether
    /// it is plain ([`Met::plain`]); else empty, the exact paths are in
    /// `prefixes`.
    exact: HashMap<Box<str>, Met, FxBuild>,
    /// The nodes of the exact paths and prefixes, by [`PlanAt`] less
    /// `base`.
    nodes: Vec<Node>,
    /// The [`PlanAt`] of its first node: the nodes of both routers
    /// are numbered as one list, so that a plan is found by its number
    /// alone ([`CompiledConfig::plan`](crate::config::CompiledConfig::plan)).
    base: u32,
    /// Bit `len % 64` is set for the length of every exact path of `exact`:
    /// most requests skip the hash lookup (none when it is empty).
    exact_lens: u64,
    /// The prefixes (and the exact paths, unless in `exact`), by their
    /// second byte, each group longest first.
    prefixes: Prefixes,
    /// Rules without a path requirement: evaluated for every request that
    /// passes `gate`.
    always: Vec<Entry>,
    /// Which requests may match a rule of `always`.
    gate: Gate,
    /// Whether a request that meets no rule without a path may be planned
    /// by its path alone (the config has no expiring rule, and does not
    /// fold this direction's paths): set by the config
    /// ([`Router::plan_by_path`]).
    by_path: bool,
    /// Bit `len % 64` is set for the lengths of path [`Router::path_plan`]
    /// does not plan by the prefix scan alone: every one unless `by_path`
    /// (as by default), else those of `exact_lens` (issue 39: one test of
    /// the path for both).
    unscanned: u64,
    /// The second bytes of the exact paths and prefixes: most requests
    /// that meet none are told so by one bit.
    filter: PathFilter,
    /// The empty plan.
    none: Plan,
}

/// No rules: planned by path alone only once the config says so.
impl Default for Router {
    fn default() -> Self {
        Self {
            exact: HashMap::default(),
            nodes: Vec::new(),
            base: 0,
            exact_lens: 0,
            prefixes: Prefixes::default(),
            always: Vec::new(),
            gate: Gate::default(),
            by_path: false,
            unscanned: u64::MAX,
            filter: PathFilter::default(),
            none: Plan::default(),
        }
    }
}

/// Which requests may match a router's rules without a path, told by one
/// match (issue 39: not a test of the rules, then of their names).
#[derive(Debug, Default)]
enum Gate {
    /// None: the router has no rule without a path.
    #[default]
    Shut,
    /// Every one: a rule without a path requires no header.
    Open,
    /// Every rule without a path requires this header: a request with it
    /// (tested apart from [`Gate::Names`], so that the test of it is not
    /// merged into theirs: issue 39).
    One(HeaderName),
    /// Every rule without a path requires a header: a request with any of
    /// these names (and the [`len_bit`]s of their lengths). A request with
    /// none of them matches none of those rules, and is not checked
    /// against them.
    Names(Box<[HeaderName]>, u64),
}

/// What of a router one request may reach ([`Router::reach_past_gate`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reach {
    /// Its path may meet an exact path or a prefix.
    path: bool,
    /// It passes the gate of the rules without a path (there are some).
    always: bool,
}

impl Reach {
    /// Whether the request matches no rule of the router.
    #[inline]
    pub(crate) fn nothing(self) -> bool {
        !self.path && !self.always
    }
}

impl Router {
    /// The router of `direction` over every rule's direction, match and
    /// [`RuleMeta`], in rule-id order, its nodes numbered from `base`.
    pub(crate) fn new<'a>(
        rules: impl IntoIterator<Item = (Direction, &'a Cond)>,
        metas: &[RuleMeta],
        direction: Direction,
        base: u32,
    ) -> Self {
        let mut router = Router {
            base,
            ..Router::default()
        };
        let mut exact: HashMap<&str, Vec<Entry>> = HashMap::new();
        let mut prefixes: HashMap<&str, Vec<Entry>> = HashMap::new();
        for (i, (rule_direction, on)) in rules.into_iter().enumerate() {
            if rule_direction != direction {
                continue;
            }
            // The config has at most MAX_RULES rules, so the index fits.
            let id = RuleId(u32::try_from(i).unwrap_or(u32::MAX));
            match on.required_path() {
                Some(PathReq::Exact(p)) => {
                    router.filter.add(p);
                    let rest = on.residual();
                    exact.entry(p).or_default().push(Entry { id, rest });
                }
                Some(PathReq::Prefix(p)) => {
                    router.filter.add(p);
                    let rest = on.residual();
                    prefixes.entry(p).or_default().push(Entry { id, rest });
                }
                None => router.always.push(Entry {
                    id,
                    rest: Some(on.clone()),
                }),
            }
        }
        // A path meeting `p` meets every prefix `p` starts with.
        let under = |p: &str| -> Vec<&Entry> {
            prefixes
                .iter()
                .filter(|(q, _)| p.starts_with(**q))
                .flat_map(|(_, entries)| entries)
                .collect()
        };
        let mut nodes = Vec::new();
        let mut node = |n: Node| {
            nodes.push(n);
            // At most MAX_RULES paths a direction, so the number fits.
            base.saturating_add(u32::try_from(nodes.len() - 1).unwrap_or(u32::MAX))
        };
        let hashed = exact.len() > SCANNED_EXACT;
        let mut list = Vec::new();
        for (&p, entries) in &exact {
            let n = Node::new(entries.iter().chain(under(p)), metas);
            let plain = n.plain();
            let i = node(n);
            if hashed {
                router.exact_lens |= len_bit(p.len());
                router.exact.insert(p.into(), Met { node: i, plain });
            } else {
                list.push(Prefix::new(p, true, i, plain));
            }
        }
        for &p in prefixes.keys() {
            let n = Node::new(under(p), metas);
            let plain = n.plain();
            list.push(Prefix::new(p, false, node(n), plain));
        }
        router.prefixes = Prefixes::new(list);
        router.nodes = nodes;
        let names = router
            .always
            .iter()
            .map(|e| e.rest.as_ref().and_then(Cond::required_header))
            .collect::<Option<Vec<_>>>();
        router.gate = match names {
            _ if router.always.is_empty() => Gate::Shut,
            None => Gate::Open,
            Some(names) => {
                let mut gate: Vec<HeaderName> = Vec::new();
                for n in names {
                    if !gate.contains(n) {
                        gate.push(n.clone());
                    }
                }
                let lens = gate.iter().fold(0, |m, n| m | len_bit(n.as_str().len()));
                match <[HeaderName; 1]>::try_from(gate) {
                    Ok([one]) => Gate::One(one),
                    Err(gate) => Gate::Names(gate.into_boxed_slice(), lens),
                }
            }
        };
        router
    }

    /// [`Router::reach_past_gate`] of a request with `path` and `headers`.
    #[cfg(test)]
    pub(crate) fn reach(&self, path: &str, headers: &Headers<'_>) -> Reach {
        self.reach_past_gate(path, self.passes_gate(headers))
    }

    /// Whether a request with `headers` may match a rule without a path
    /// (there are some, and it passes their gate).
    #[inline]
    pub(crate) fn passes_gate(&self, headers: &Headers<'_>) -> bool {
        match &self.gate {
            Gate::Shut => false,
            Gate::Open => true,
            Gate::One(name) => headers.has(name),
            Gate::Names(names, lens) => headers.has_any(names, *lens),
        }
    }

    /// What of the router a request with `path` whose
    /// [`Router::passes_gate`] is `always` may reach ([`Reach::nothing`]: it
    /// matches no rule): an exact path or a prefix (by [`PathFilter`]), the
    /// rules without a path (by their gate).
    #[inline]
    pub(crate) fn reach_past_gate(&self, path: &str, always: bool) -> Reach {
        Reach {
            path: self.filter.may_meet(path.as_bytes()),
            always,
        }
    }

    /// What of this router a request must miss to match none of its rules,
    /// in one word ([`crate::quick`]): in the lower half, bit `b & 31` for
    /// the second byte `b` of each exact path and prefix (every bit when a
    /// rule without a path has no gate, or an entry is shorter than 2
    /// bytes); in the upper half, bit `len % 32` for the length of each of
    /// its gate's names.
    pub(crate) fn miss_word(&self) -> u64 {
        let fold = |w: u64| (w | w >> 32) & 0xffff_ffff;
        let seconds = fold(self.filter.words().into_iter().fold(0, |m, w| m | w));
        match &self.gate {
            Gate::One(name) => seconds | fold(len_bit(name.as_str().len())) << 32,
            Gate::Names(_, lens) => seconds | fold(*lens) << 32,
            Gate::Shut => seconds,
            Gate::Open => 0xffff_ffff,
        }
    }

    /// The plan of the rules whose match holds for `r` (`metas`: the
    /// config's, by rule id), copied into `out`.
    #[cfg(test)]
    pub(crate) fn matches(&self, r: &View<'_>, metas: &[RuleMeta], out: &mut Plan) {
        let mut scratch = None;
        let reach = self.reach(r.path, &r.headers);
        match self.plan(r, reach, metas, &mut scratch) {
            Some(at) => out.clone_from(self.resolve(at, &scratch)),
            None => out.clone_from(&Plan::default()),
        }
    }

    /// Where the plan of the rules whose match holds for `r` is (`reach`:
    /// [`Router::reach_past_gate`] of `r`; `metas`: the config's, by rule id): the
    /// compiled plan of the index entry the path meets, unless a rule with
    /// more to check matches too; then that plan copied into `scratch` with
    /// those rules added. `None`: no rule matched.
    #[inline]
    pub(crate) fn plan(
        &self,
        r: &View<'_>,
        reach: Reach,
        metas: &[RuleMeta],
        scratch: &mut Option<Plan>,
    ) -> Option<PlanAt> {
        let found = if reach.path { self.node(r.path) } else { None };
        let mut at = None;
        if let Some((i, n)) = found {
            if !n.plan.is_empty() {
                at = Some(PlanAt::node(i));
            }
            for e in &n.rest {
                extra(e, r, metas, &n.plan, scratch, &mut at);
            }
        }
        if reach.always {
            let base = found.map_or(&self.none, |(_, n)| &n.plan);
            for e in &self.always {
                extra(e, r, metas, base, scratch, &mut at);
            }
        }
        at
    }

    /// The index entry `path` meets (the exact path it equals, else the
    /// longest prefix it starts with): its node, and whether the node is
    /// plain ([`Node::plain`]). Without a hashed exact path of its length,
    /// a scan that calls nothing but in tail position (issue 39: so it
    /// needs no frame).
    #[inline]
    fn meet(&self, path: &str) -> Option<&Met> {
        if self.exact_lens & len_bit(path.len()) != 0 {
            return self.hashed(path);
        }
        self.prefixes.find(path.as_bytes())
    }

    /// [`Router::meet`] of a path that may equal an exact path of `exact`:
    /// out of line, so that the scan keeps no registers for a hash.
    #[inline(never)]
    fn hashed(&self, path: &str) -> Option<&Met> {
        if let Some(met) = self.exact.get(path) {
            return Some(met);
        }
        self.prefixes.find(path.as_bytes())
    }

    /// The node of the exact path or longest prefix `path` meets, and its
    /// index.
    #[inline]
    fn node(&self, path: &str) -> Option<(u32, &Node)> {
        let i = self.meet(path)?.node;
        Some((i, self.nodes.get(i.wrapping_sub(self.base) as usize)?))
    }

    /// The number of the node after its last: the next router's `base`.
    pub(crate) fn end(&self) -> u32 {
        let len = u32::try_from(self.nodes.len()).unwrap_or(u32::MAX);
        self.base.saturating_add(len)
    }

    /// The plan of each of its nodes, in their order.
    pub(crate) fn plans(&self) -> impl Iterator<Item = &Plan> {
        self.nodes.iter().map(|n| &n.plan)
    }

    /// Sets whether a request that meets no rule without a path may be
    /// planned by its path alone ([`Router::path_plan`]).
    pub(crate) fn plan_by_path(&mut self, by_path: bool) {
        self.by_path = by_path;
        self.unscanned = if by_path { self.exact_lens } else { u64::MAX };
    }

    /// [`Router::plan`] of a request that reaches no rule without a path
    /// (`reach.always` false), by its `path` alone: `None` when a rule of
    /// the node it meets has more to check, or the router does not plan by
    /// path alone ([`Router::plan_by_path`]; then ask [`Router::plan`]).
    /// Neither the request's view nor a scratch plan is built, nor the node
    /// read: the index entry says whether it is plain (issue 39).
    #[inline]
    pub(crate) fn path_plan(&self, path: &str) -> Option<Option<PlanAt>> {
        let met = if self.unscanned & len_bit(path.len()) == 0 {
            self.prefixes.find(path.as_bytes())
        } else if self.by_path {
            self.hashed(path)
        } else {
            return None;
        };
        match met {
            None => Some(None),
            Some(&Met { node, plain: true }) => Some(Some(PlanAt::node(node))),
            Some(_) => None,
        }
    }

    /// The plan at `at` (`scratch`: the one [`Router::plan`] was given;
    /// the empty plan if it holds none).
    #[inline]
    pub(crate) fn resolve<'a>(&'a self, at: PlanAt, scratch: &'a Option<Plan>) -> &'a Plan {
        let node =
            (at.node_number()).and_then(|i| self.nodes.get(i.wrapping_sub(self.base) as usize));
        match (node, scratch) {
            (Some(n), _) => &n.plan,
            (None, Some(plan)) => plan,
            (None, None) => &self.none,
        }
    }
}

/// Adds rule `e` to the plan at `at` when its match holds for `r`, the
/// plan copied from `base` into `scratch` first (once).
#[inline]
fn extra(
    e: &Entry,
    r: &View<'_>,
    metas: &[RuleMeta],
    base: &Plan,
    scratch: &mut Option<Plan>,
    at: &mut Option<PlanAt>,
) {
    if e.rest.as_ref().is_some_and(|c| !c.eval(r)) {
        return;
    }
    let plan = scratch.get_or_insert_default();
    if *at != Some(PlanAt::SCRATCH) {
        plan.clone_from(base);
        *at = Some(PlanAt::SCRATCH);
    }
    plan.add(e.id, &metas[e.id.0 as usize]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CompiledConfig;
    use gov_proto::v1 as proto;
    use http::HeaderMap;
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

    /// A rule that only matches: a bulkhead, the simplest kind.
    fn rule(name: &str, on: proto::MatchExpr) -> proto::Rule {
        proto::Rule {
            name: format!("svc/{name}"),
            on: Some(on),
            mode: proto::Mode::Enforce as i32,
            spec: Some(proto::rule::Spec::Bulkhead(proto::Bulkhead {
                max_concurrent: 1,
                reject_status: proto::RuleKind::Bulkhead.reject_status(),
                reject_grpc_status: proto::RuleKind::Bulkhead.reject_grpc() as i32,
                ..Default::default()
            })),
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
        let mut out = Plan::default();
        cfg.router(Direction::Inbound)
            .matches(&view, &cfg.metas, &mut out);
        out.ids()
            .map(|id| cfg.rules[id.0 as usize].name.to_string())
            .collect()
    }

    #[test]
    fn matches_paths_methods_headers_consumers() {
        let t = proto::TargetConfig {
            service: "svc".into(),
            rules: vec![
                rule("a_prefix", prefix("/a")),
                rule("ab_prefix", prefix("/a/b")),
                rule("exact", exact("/a/b/c")),
                rule("any", expr(Kind::Any(true))),
                rule(
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
                rule(
                    "crm",
                    expr(Kind::And(proto::MatchList {
                        exprs: vec![prefix("/mdm"), expr(Kind::Consumer("crm".into()))],
                    })),
                ),
                rule(
                    "gold",
                    expr(Kind::Header(proto::HeaderMatch {
                        name: "X-Tenant".into(),
                        value: "gold".into(),
                    })),
                ),
            ],
            ..gov_proto::compiled::target("svc")
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
    fn long_prefixes_and_residual_conditions() {
        let and = |exprs| expr(Kind::And(proto::MatchList { exprs }));
        let get = || expr(Kind::Method("GET".into()));
        let t = proto::TargetConfig {
            service: "svc".into(),
            rules: vec![
                rule("eight", prefix("/abcdefg")),
                rule("ten", prefix("/abcdefghi")),
                rule("ten_other", prefix("/abcdefgXY")),
                rule("get_ten", and(vec![get(), prefix("/abcdefghi")])),
                // The path requirement sits in a nested `and`.
                rule("nested", and(vec![and(vec![prefix("/n"), get()]), get()])),
                rule("exact_get", and(vec![exact("/e"), get()])),
            ],
            ..gov_proto::compiled::target("svc")
        };
        let cfg = CompiledConfig::try_from(&t).unwrap();
        assert_eq!(matched(&cfg, "GET", "/abcdef", &[]), Vec::<String>::new());
        assert_eq!(matched(&cfg, "PUT", "/abcdefg", &[]), ["svc/eight"]);
        assert_eq!(matched(&cfg, "PUT", "/abcdefgh", &[]), ["svc/eight"]);
        assert_eq!(
            matched(&cfg, "GET", "/abcdefghij", &[]),
            ["svc/eight", "svc/ten", "svc/get_ten"]
        );
        assert_eq!(
            matched(&cfg, "PUT", "/abcdefghij", &[]),
            ["svc/eight", "svc/ten"]
        );
        assert_eq!(
            matched(&cfg, "GET", "/abcdefgXY", &[]),
            ["svc/eight", "svc/ten_other"]
        );
        assert_eq!(matched(&cfg, "GET", "/abcdefgX", &[]), ["svc/eight"]);
        assert_eq!(matched(&cfg, "GET", "/n/1", &[]), ["svc/nested"]);
        assert_eq!(matched(&cfg, "PUT", "/n/1", &[]), Vec::<String>::new());
        assert_eq!(matched(&cfg, "GET", "/e", &[]), ["svc/exact_get"]);
        assert_eq!(matched(&cfg, "PUT", "/e", &[]), Vec::<String>::new());
        assert_eq!(matched(&cfg, "GET", "/e/", &[]), Vec::<String>::new());
    }

    /// The nodes of both routers are numbered as one list: a decision reads
    /// an outbound request's plan by its number alone (issue 39), the plan
    /// its router holds.
    #[test]
    fn both_routers_plans_are_read_by_their_number() {
        let bulkhead = "bulkhead: {max_concurrent: 9}";
        let out = "direction: DIRECTION_OUTBOUND";
        let yaml = format!(
            "service: order\nrules:\n\
             - {{name: order/in_api, on: {{path: {{kind: PATH_KIND_PREFIX, value: /api}}}}, {bulkhead}}}\n\
             - {{name: order/in_x, on: {{path: {{kind: PATH_KIND_EXACT, value: /x}}}}, {bulkhead}}}\n\
             - {{name: order/out_api, on: {{path: {{kind: PATH_KIND_PREFIX, value: /api/v2}}}}, {out}, {bulkhead}}}\n\
             - {{name: order/out_b, on: {{path: {{kind: PATH_KIND_PREFIX, value: /b}}}}, {out}, {bulkhead}}}\n"
        );
        let mut target = serde_yaml::from_str(&yaml).unwrap();
        gov_proto::compiled::fill(&mut target);
        let cfg = CompiledConfig::try_from(&target).unwrap();
        let (map, get) = (HeaderMap::new(), Method::GET);
        let outbound = |path| crate::RequestInfo::outbound(&get, path, &map, "inv", None);
        for (req, expected) in [
            (
                crate::RequestInfo::inbound(&get, "/api/1", &map),
                "order/in_api",
            ),
            (crate::RequestInfo::inbound(&get, "/x", &map), "order/in_x"),
            (outbound("/api/v2/1"), "order/out_api"),
            (outbound("/b/1"), "order/out_b"),
        ] {
            let mut scratch = None;
            let at = crate::decision::route(&cfg, &req, &mut scratch).unwrap();
            let plan = cfg.plan(at, &scratch);
            assert_eq!(plan, cfg.router(req.direction).resolve(at, &scratch));
            let names: Vec<String> = plan
                .ids()
                .map(|id| cfg.rules[id.0 as usize].name.to_string())
                .collect();
            assert_eq!(names, [expected], "{}", req.path);
            assert_ne!(at, PlanAt::SCRATCH);
        }
        // The scratch plan's number is past every node's: it reads the
        // scratch plan (the empty plan without one), and a number past the
        // nodes reads the empty plan, not the scratch plan.
        let mut built = Plan::default();
        built.add(RuleId(1), &cfg.metas[1]);
        let scratch = Some(built.clone());
        assert_eq!(cfg.plan(PlanAt::SCRATCH, &scratch), &built);
        assert!(cfg.plan(PlanAt::SCRATCH, &None).is_empty());
        let past = cfg.router(Direction::Outbound).end();
        assert!(cfg.plan(PlanAt::node(past), &scratch).is_empty());
        for d in [Direction::Inbound, Direction::Outbound] {
            assert_eq!(cfg.router(d).resolve(PlanAt::SCRATCH, &scratch), &built);
        }
    }

    /// Exact paths past the scanned few (hashed) in both directions, the
    /// same texts in each: a request finds its own direction's rule by its
    /// node's number, and a prefix of equal length or a text differing
    /// after its 8th byte does not stand in for it (issue 39).
    #[test]
    fn hashed_exact_paths_of_both_directions_plan_by_their_number() {
        let bulkhead = "bulkhead: {max_concurrent: 9}";
        let mut yaml = String::from("service: order\nrules:\n");
        for dir in ["in", "out"] {
            let d = if dir == "out" {
                "direction: DIRECTION_OUTBOUND, "
            } else {
                ""
            };
            for i in 0..20 {
                yaml.push_str(&format!(
                    "- {{name: order/{dir}{i}, {d}on: {{path: {{kind: PATH_KIND_EXACT, value: /api/orders/{i}}}}}, {bulkhead}}}\n"
                ));
            }
            yaml.push_str(&format!(
                "- {{name: order/{dir}_pre, {d}on: {{path: {{kind: PATH_KIND_PREFIX, value: /api/orders/1}}}}, {bulkhead}}}\n"
            ));
        }
        let mut target = serde_yaml::from_str(&yaml).unwrap();
        gov_proto::compiled::fill(&mut target);
        let cfg = CompiledConfig::try_from(&target).unwrap();
        let (map, get) = (HeaderMap::new(), Method::GET);
        for dir in ["in", "out"] {
            let cases: Vec<(String, Vec<String>)> = (0..20)
                .map(|i| {
                    let mut want = vec![format!("order/{dir}{i}")];
                    if (10..20).contains(&i) || i == 1 {
                        want.push(format!("order/{dir}_pre"));
                    }
                    (format!("/api/orders/{i}"), want)
                })
                .chain([
                    ("/api/orders/1x".into(), vec![format!("order/{dir}_pre")]),
                    ("/api/orders/x".into(), vec![]),
                    ("/api/orderz/1".into(), vec![]),
                ])
                .collect();
            for (path, mut want) in cases {
                let r = match dir {
                    "in" => crate::RequestInfo::inbound(&get, &path, &map),
                    _ => crate::RequestInfo::outbound(&get, &path, &map, "inv", None),
                };
                let mut scratch = None;
                let mut names: Vec<String> = match crate::decision::route(&cfg, &r, &mut scratch) {
                    Some(at) => (cfg.plan(at, &scratch).ids())
                        .map(|id| cfg.rules[id.0 as usize].name.to_string())
                        .collect(),
                    None => vec![],
                };
                names.sort();
                want.sort();
                assert_eq!(names, want, "{dir} {path}");
            }
        }
    }

    /// A router the config does not let plan by path alone (an expiring
    /// rule, paths read case-insensitively) plans no path by it, hashed
    /// exact paths' lengths or not; one it lets plans by the scan, or by
    /// the hash for an exact path's length (issue 39: one word tests both).
    #[test]
    fn only_a_router_planned_by_path_plans_by_the_path_alone() {
        let bulkhead = "bulkhead: {max_concurrent: 9}";
        let mut yaml = String::from("service: order\nrules:\n");
        for i in 0..20 {
            yaml.push_str(&format!(
                "- {{name: order/x{i}, on: {{path: {{kind: PATH_KIND_EXACT, value: /api/orders/{i}}}}}, {bulkhead}}}\n"
            ));
        }
        yaml.push_str(&format!(
            "- {{name: order/api, on: {{path: {{kind: PATH_KIND_PREFIX, value: /api}}}}, {bulkhead}}}\n"
        ));
        let mut target = serde_yaml::from_str(&yaml).unwrap();
        gov_proto::compiled::fill(&mut target);
        let cfg = CompiledConfig::try_from(&target).unwrap();
        let rules = || cfg.rules.iter().map(|r| (r.direction, &r.on));
        let mut router = Router::new(rules(), &cfg.metas, Direction::Inbound, 0);
        let map = HeaderMap::new();
        let paths = ["/api/orders/7", "/api/orders/12", "/api/x", "/static", "/"];
        for path in paths {
            assert_eq!(router.path_plan(path), None, "{path}");
        }
        for by_path in [false, true, false] {
            router.plan_by_path(by_path);
            for path in paths {
                let want = by_path.then(|| {
                    let (mut scratch, reach) = (None, router.reach(path, &Headers::Map(&map)));
                    let view = View::new(
                        &Method::GET,
                        path,
                        Headers::Map(&map),
                        &cfg.consumer_header,
                        None,
                    );
                    router.plan(&view, reach, &cfg.metas, &mut scratch)
                });
                assert_eq!(router.path_plan(path), want, "{path} {by_path}");
            }
        }
        router.plan_by_path(true);
        let exact = router.path_plan("/api/orders/12").flatten();
        let prefix = router.path_plan("/api/orders/x").flatten();
        assert!(exact.is_some() && prefix.is_some() && exact != prefix);
        assert_eq!(router.path_plan("/static"), Some(None));
    }

    /// The rules `cfg` routes an inbound `GET path` to, as a decision does
    /// (by the path alone when it can), by name.
    fn routed(cfg: &CompiledConfig, path: &str) -> Vec<String> {
        let map = HeaderMap::new();
        let req = crate::request::RequestInfo::inbound(&Method::GET, path, &map);
        let mut scratch = None;
        let mut found: Vec<String> = crate::decision::route(cfg, &req, &mut scratch)
            .map(|at| {
                let plan = cfg.router(Direction::Inbound).resolve(at, &scratch);
                plan.ids()
                    .map(|id| cfg.rules[id.0 as usize].name.to_string())
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    }

    /// Exact paths are met in the index's lists up to `SCANNED_EXACT` of
    /// them, in a hash map beyond: the same rules either way.
    #[test]
    fn exact_paths_listed_or_hashed_meet_the_same_rules() {
        for n in [3, SCANNED_EXACT, SCANNED_EXACT + 1, 40] {
            let mut rules: Vec<proto::Rule> = (0..n)
                .map(|i| rule(&format!("e{i}"), exact(&format!("/e{i}"))))
                .collect();
            rules.push(rule("p", prefix("/e1")));
            rules.push(rule("long", exact("/e1/a/much/longer/path")));
            let t = proto::TargetConfig {
                rules,
                ..gov_proto::compiled::target("svc")
            };
            let cfg = CompiledConfig::try_from(&t).unwrap();
            assert_eq!(
                cfg.router(Direction::Inbound).exact.len() > SCANNED_EXACT,
                n + 1 > SCANNED_EXACT
            );
            assert_eq!(routed(&cfg, "/e0"), ["svc/e0"], "{n}");
            assert_eq!(routed(&cfg, "/e1"), ["svc/e1", "svc/p"], "{n}");
            assert_eq!(routed(&cfg, "/e2"), ["svc/e2"], "{n}");
            assert_eq!(routed(&cfg, "/e1x"), ["svc/p"], "{n}");
            assert_eq!(routed(&cfg, "/e2x"), Vec::<String>::new(), "{n}");
            assert_eq!(
                routed(&cfg, "/e1/a/much/longer/path"),
                ["svc/long", "svc/p"],
                "{n}"
            );
            assert_eq!(routed(&cfg, "/e1/a/much/longer/pat"), ["svc/p"], "{n}");
            assert_eq!(
                matched(&cfg, "GET", "/e1/a/much/longer/path", &[]),
                ["svc/p", "svc/long"],
                "{n}"
            );
        }
    }

    #[test]
    fn prefixes_sorted_longest_first() {
        let t = proto::TargetConfig {
            rules: vec![
                rule("a", prefix("/a")),
                rule("abc", prefix("/abc")),
                rule("ab", prefix("/ab")),
            ],
            ..gov_proto::compiled::target("svc")
        };
        let cfg = CompiledConfig::try_from(&t).unwrap();
        let lens: Vec<usize> = cfg.router(Direction::Inbound).prefixes.lens().collect();
        assert_eq!(lens, [4, 3, 2]);
    }

    /// A plan lists the rules of every prefix and exact path a request
    /// meets, and those whose match holds beyond the path, in phase order
    /// (fuses, limits, bulkheads; rule id within one), with the shortest
    /// enforced deadline (a shadow rule's is not) and whether a scope needs
    /// the consumer.
    #[test]
    fn plans_run_fuses_then_limits_then_bulkheads_with_the_shortest_deadline() {
        let mut t: proto::TargetConfig = serde_yaml::from_str(
            r#"
service: svc
rules:
- name: svc/slow
  on: {path: {kind: PATH_KIND_EXACT, value: /a/b/c}}
  bulkhead: {max_concurrent: 5, timeout_ms: 3000}
- name: svc/shadow_fast
  on: {path: {kind: PATH_KIND_PREFIX, value: /a}}
  mode: MODE_SHADOW
  bulkhead: {max_concurrent: 5, timeout_ms: 100}
- name: svc/per_consumer
  on: {path: {kind: PATH_KIND_PREFIX, value: /a/b}}
  limit: {calls: {amount: 5, window_ms: 1000}, key: LIMIT_KEY_CONSUMER}
- name: svc/fast
  on: {header: {name: x-fast, value: "1"}}
  bulkhead: {max_concurrent: 5, timeout_ms: 2000}
- name: svc/fuse
  on: {and: {exprs: [{path: {kind: PATH_KIND_PREFIX, value: /a}}, {method: GET}]}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 2, window_ms: 60000}
- name: svc/also_fast
  on: {path: {kind: PATH_KIND_PREFIX, value: /a/b/c}}
  bulkhead: {max_concurrent: 5, timeout_ms: 2000}
"#,
        )
        .unwrap();
        gov_proto::compiled::fill(&mut t);
        let cfg = CompiledConfig::try_from(&t).unwrap();
        let plan = |method: &str, path: &str, headers: &[(&str, &str)]| {
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
            let mut out = Plan::default();
            cfg.router(Direction::Inbound)
                .matches(&view, &cfg.metas, &mut out);
            let names: Vec<String> = out
                .ids()
                .map(|id| cfg.rules[id.0 as usize].name.to_string())
                .collect();
            let deadline = out
                .timeout
                .map(|(t, id)| (t.as_millis(), cfg.rules[id.0 as usize].name.to_string()));
            // What a call keeps of the deadline: its rule's id.
            assert_eq!(out.deadline_rule, out.timeout.map(|(_, id)| id.0));
            (names, out.consumer, deadline)
        };
        assert_eq!(
            plan("GET", "/a/b/c", &[]),
            (
                vec![
                    "svc/fuse".into(),
                    "svc/per_consumer".into(),
                    "svc/slow".into(),
                    "svc/shadow_fast".into(),
                    "svc/also_fast".into()
                ],
                true,
                Some((2000, "svc/also_fast".into()))
            )
        );
        assert_eq!(
            plan("PUT", "/a/b/c", &[("x-fast", "1")]),
            (
                vec![
                    "svc/per_consumer".into(),
                    "svc/slow".into(),
                    "svc/shadow_fast".into(),
                    "svc/fast".into(),
                    "svc/also_fast".into()
                ],
                true,
                // Equal deadlines: the rule written first.
                Some((2000, "svc/fast".into()))
            )
        );
        assert_eq!(
            plan("PUT", "/a/x", &[]),
            (vec!["svc/shadow_fast".into()], false, None)
        );
        assert_eq!(plan("GET", "/b", &[]), (vec![], false, None));
    }

    /// A gate of one name is kept as that name: a request with it (in any
    /// case, raw) reaches the rule, one without it does not.
    #[test]
    fn a_gate_of_one_name_finds_it() {
        let t = proto::TargetConfig {
            rules: vec![rule(
                "admin",
                expr(Kind::Header(proto::HeaderMatch {
                    name: "x-admin".into(),
                    value: "yes".into(),
                })),
            )],
            ..gov_proto::compiled::target("svc")
        };
        let cfg = CompiledConfig::try_from(&t).unwrap();
        let router = cfg.router(Direction::Inbound);
        assert!(matches!(router.gate, Gate::One(..)));
        assert_eq!(
            matched(&cfg, "GET", "/", &[("accept", "*/*")]),
            Vec::<String>::new()
        );
        assert_eq!(
            matched(&cfg, "GET", "/", &[("accept", "*/*"), ("x-admin", "yes")]),
            ["svc/admin"]
        );
        let raw = [httparse::Header {
            name: "X-Admin",
            value: b"yes",
        }];
        assert!(router.passes_gate(&Headers::Raw(&raw)));
        assert!(
            !cfg.router(Direction::Outbound)
                .passes_gate(&Headers::Raw(&raw))
        );
    }

    /// Rules matched on headers alone are checked only for a request with
    /// one of their names: each name found in a map (scanned or, with many
    /// headers, looked up) or among raw headers in any case.
    #[test]
    fn header_rules_are_gated_on_the_names_they_read() {
        let and = |exprs| expr(Kind::And(proto::MatchList { exprs }));
        let header = |name: &str, value: &str| {
            expr(Kind::Header(proto::HeaderMatch {
                name: name.into(),
                value: value.into(),
            }))
        };
        let t = proto::TargetConfig {
            rules: vec![
                rule("gold", header("x-tenant", "gold")),
                rule(
                    "admin_get",
                    and(vec![
                        expr(Kind::Method("GET".into())),
                        header("x-admin", "yes"),
                    ]),
                ),
            ],
            ..gov_proto::compiled::target("svc")
        };
        let cfg = CompiledConfig::try_from(&t).unwrap();
        assert!(matches!(
            cfg.router(Direction::Inbound).gate,
            Gate::Names(..)
        ));
        assert_eq!(matched(&cfg, "GET", "/", &[]), Vec::<String>::new());
        assert_eq!(
            matched(&cfg, "GET", "/", &[("x-admin", "yes"), ("accept", "*/*")]),
            ["svc/admin_get"]
        );
        assert_eq!(
            matched(
                &cfg,
                "PUT",
                "/",
                &[("x-tenant", "gold"), ("x-admin", "yes")]
            ),
            ["svc/gold"]
        );
        let mut many: Vec<(String, String)> =
            (0..20).map(|i| (format!("x-h{i}"), "v".into())).collect();
        many.push(("x-tenant".into(), "gold".into()));
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert_eq!(matched(&cfg, "GET", "/", &many), ["svc/gold"]);
        let raw = [httparse::Header {
            name: "X-Admin",
            value: b"yes",
        }];
        let view = View::new(
            &Method::GET,
            "/",
            Headers::Raw(&raw),
            &cfg.consumer_header,
            None,
        );
        let mut out = Plan::default();
        cfg.router(Direction::Inbound)
            .matches(&view, &cfg.metas, &mut out);
        assert_eq!(out.ids().collect::<Vec<_>>(), [RuleId(1)]);
    }

    /// A rule of the property below: a prefix, an exact path, a header, or
    /// a prefix with a method (the index keeps what is left to check).
    fn rule_of(i: usize, kind: u8, text: &str) -> proto::Rule {
        let on = match kind % 4 {
            0 => prefix(text),
            1 => exact(text),
            2 => expr(Kind::Header(proto::HeaderMatch {
                name: "x-admin".into(),
                value: "yes".into(),
            })),
            _ => expr(Kind::And(proto::MatchList {
                exprs: vec![expr(Kind::Method("POST".into())), prefix(text)],
            })),
        };
        rule(&format!("r{i}"), on)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        /// The decision's routing (the path filter, the index, the gate)
        /// finds exactly the rules whose match, evaluated alone on the
        /// request (its path folded for a case-insensitive service), holds.
        #[test]
        fn routing_matches_every_rule_evaluated_alone(
            rules in proptest::collection::vec((0u8..4, "/(A|a|_|\u{e9}){0,2}"), 0..6),
            path in "/?(A|a|_|/|\u{e9}){0,3}",
            post in proptest::bool::ANY,
            admin in proptest::bool::ANY,
            insensitive in proptest::bool::ANY,
        ) {
            let t = proto::TargetConfig {
                service: "svc".into(),
                rules: rules.iter().enumerate().map(|(i, (k, text))| rule_of(i, *k, text)).collect(),
                paths: if insensitive {
                    proto::PathDialect::StrictCaseInsensitive as i32
                } else {
                    proto::PathDialect::Strict as i32
                },
                ..gov_proto::compiled::target("svc")
            };
            let cfg = CompiledConfig::try_from(&t).unwrap();
            let mut map = HeaderMap::new();
            map.insert("accept", HeaderValue::from_static("*/*"));
            if admin {
                map.insert("x-admin", HeaderValue::from_static("yes"));
            }
            let method = if post { Method::POST } else { Method::GET };
            let req = crate::request::RequestInfo::inbound(&method, &path, &map);
            let mut scratch = None;
            let mut found: Vec<RuleId> = crate::decision::route(&cfg, &req, &mut scratch)
                .map(|at| cfg.router(Direction::Inbound).resolve(at, &scratch).ids().collect())
                .unwrap_or_default();
            found.sort();
            let folded = if insensitive { path.to_ascii_lowercase() } else { path.clone() };
            let view = View::new(&method, &folded, Headers::Map(&map), &cfg.consumer_header, None);
            let expected: Vec<RuleId> = (0..cfg.rules.len())
                .filter(|&i| cfg.rules[i].on.eval(&view))
                .map(|i| RuleId(i as u32))
                .collect();
            proptest::prop_assert_eq!(found, expected);
        }
    }
}
