//! The compiled config as the engine uses it, converted once from the wire
//! type (`gov_proto::v1::TargetConfig`) at the edge: the header every rule
//! shares here, each kind's settings beside its primitive (`state/<kind>.rs`,
//! listed in `state.rs`), the errors that
//! name the rule at fault in `config/invalid.rs`.
//!
//! Everything the hot path needs is decided here, once per config: rules get
//! dense indices ([`RuleId`]), match expressions become `Cond` trees in a
//! `Router`, durations become [`Duration`](std::time::Duration)s, status
//! codes [`StatusCode`](http::StatusCode)s and header names
//! [`HeaderName`]s. Bad wire data is a
//! typed [`InvalidConfig`] that names the rule at fault, so the agent can NACK
//! it with the rule and keep its previous config. Nothing is filled in: the
//! compiler writes every value (`gov_proto::compiled`), and a config without
//! one, or with a kind, mode or enum value this agent does not know, is
//! refused.

use std::collections::HashSet;
use std::sync::Arc;

use gov_proto::v1 as proto;
use http::{HeaderName, HeaderValue, Method};

use self::classes::Classes;
use self::invalid::Ctx;
pub use self::invalid::InvalidConfig;
use crate::criticality::Class;
use crate::route::{Cond, Plan, PlanAt, Router, RuleMeta};
pub use crate::route::{Direction, RuleId};
/// [`RuleSpec`] and every kind's spec type, listed where the kinds are
/// (`state.rs`), so that a new kind does not touch this file.
pub use crate::state::specs::*;

pub(crate) mod classes;
pub(crate) mod consumer;
pub(crate) mod invalid;
pub use self::consumer::{ConsumerSource, JwtSpec, OnInvalid};

/// A validated, compiled `TargetConfig`.
#[derive(Debug)]
pub struct CompiledConfig {
    /// The service these rules protect.
    pub service: Arc<str>,
    /// Its domain (the key of `per domain` limits). Empty: none.
    pub domain: Arc<str>,
    /// The content hash the compiler set (empty for hand-made configs).
    pub version: Arc<str>,
    /// The header carrying the caller's identity (as the client sends it, or
    /// as the proxy wrote it from a verified source).
    pub consumer_header: HeaderName,
    /// Where the consumer comes from (`consumer from ...`).
    pub consumer_source: ConsumerSource,
    /// How the service reads request paths (`paths servlet case-insensitive`):
    /// the proxy normalizes inbound paths with it
    /// ([`gov_proto::path::normalize`]); case-insensitive, the inbound rules'
    /// paths are folded to lower case here, and an inbound request's path when
    /// it is matched.
    pub paths: gov_proto::path::Reading,
    /// Every rule; `RuleId(i)` is `rules[i]`.
    pub rules: Vec<Rule>,
    /// The consumer header, then the headers rules match on, each once: what
    /// the proxy checks reach the upstream as judged ([`crate::judged`]).
    judged: Box<[HeaderName]>,
    /// The claims rules key on (`per claim`), each once: what the agent
    /// hands the engine of a verified token.
    claims: Box<[Box<str>]>,
    /// What a decision needs of each rule, by rule id.
    pub(crate) metas: Box<[RuleMeta]>,
    /// Whether a rule has an expiry (decisions then skip the expired ones).
    pub(crate) expiring: bool,
    /// The rules of each direction, by [`Direction`] (issue 39: a decision
    /// finds its router by an index, not a branch, and a load: boxed, not
    /// a multiple of a router's size).
    routers: [Box<Router>; 2],
    /// The plan of every node of both routers, by its [`PlanAt`]'s number
    /// (issue 39: a decision reads its plan by its number alone, not
    /// through its router).
    plans: Box<[Plan]>,
    /// The classes its named matches declare ([`crate::criticality`]).
    pub(crate) classes: Classes,
}

/// One enforced rule.
#[derive(Debug)]
pub struct Rule {
    /// `service/rule`.
    pub name: Arc<str>,
    /// Where it was written.
    pub source: SourceRef,
    /// Which listener it applies to.
    pub direction: Direction,
    /// Whether it rejects, or only counts what it would reject. Not part of
    /// the rule's identity: a re-apply that changes only the mode keeps the
    /// rule's state.
    pub mode: Mode,
    /// When it stops being enforced (`expires T`, `for D`); `None`: never.
    pub expires: Option<Expiry>,
    /// What it does.
    pub spec: RuleSpec,
    pub(crate) on: Cond,
}

/// When a rule stops being enforced: the instant the config names (UTC),
/// and where it falls on this engine's clock (`tokio::time`), worked out
/// once when the config is converted, by this machine's wall clock.
///
/// From then on the engine goes by the monotonic clock alone: a decision
/// at or after `at` skips the rule, so the rule stops on time on every
/// agent whether or not govd is reachable, and a later jump of the wall
/// clock does not move it. An agent whose wall clock is off by S stops
/// the rule S early or late (NTP keeps S small); a config loaded after its
/// instant never enforces the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiry {
    /// Milliseconds since the Unix epoch, as the config says.
    pub unix_ms: u64,
    /// The same instant on the engine's clock.
    pub at: tokio::time::Instant,
}

impl Expiry {
    /// The expiry at `unix_ms`, placed on the engine's clock by reading the
    /// wall clock and `tokio::time` now.
    pub fn at_unix_ms(unix_ms: u64) -> Self {
        let now = tokio::time::Instant::now();
        let wall = crate::latch::unix_ms(std::time::SystemTime::now());
        let left = std::time::Duration::from_millis(unix_ms.saturating_sub(wall));
        Self {
            unix_ms,
            at: now
                .checked_add(left)
                .unwrap_or(now + std::time::Duration::from_secs(100 * 365 * 86_400)),
        }
    }

    /// Whether the rule is no longer enforced at `now`.
    pub fn passed(&self, now: tokio::time::Instant) -> bool {
        now >= self.at
    }
}

/// What a rule does with the calls it matches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// It admits, delays and rejects.
    #[default]
    Enforce,
    /// It is evaluated with its own state (windows, latches, fuse states)
    /// but never rejects or delays: a call it would refuse is counted
    /// ([`crate::RuleStats::shadow_rejected`]), listed on the call
    /// ([`crate::Admission::would_reject`]) and goes on to the other rules.
    Shadow {
        /// The proxy marks such a call to the upstream
        /// (`gov-would-reject-by`, [`crate::Admission::stamps`]).
        stamp: bool,
    },
}

impl Mode {
    pub fn is_shadow(self) -> bool {
        matches!(self, Mode::Shadow { .. })
    }
}

/// Where a rule was written in the `.gov` sources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceRef {
    pub file: Arc<str>,
    pub line: u32,
    pub column: u32,
    pub snippet: Arc<str>,
}

/// The kind of a rule, for stats and commands: the wire's enum (kinds are
/// named once, in gov-proto, with their word, [`RuleKind::word`]).
pub use proto::RuleKind;

/// Most rules one config may hold (rule ids are `u32`, and nobody writes more).
pub const MAX_RULES: usize = 1 << 20;

// === impl CompiledConfig ===

impl CompiledConfig {
    /// The rules of `direction`.
    #[inline]
    pub(crate) fn router(&self, direction: Direction) -> &Router {
        &self.routers[direction as usize]
    }

    /// The plan at `at`, which a router of this config gave (`scratch`: the
    /// one it was given): [`Router::resolve`] without finding the router.
    #[inline]
    pub(crate) fn plan<'a>(&'a self, at: PlanAt, scratch: &'a Option<Plan>) -> &'a Plan {
        match self.plans.get(at.index()) {
            Some(plan) => plan,
            // The scratch plan's number is past every node's.
            None if at == PlanAt::SCRATCH => self.routers[0].resolve(at, scratch),
            None => self.routers[0].resolve(PlanAt::SCRATCH, &None),
        }
    }

    /// A config with no rules (everything is admitted).
    pub fn empty(service: &str) -> Self {
        Self {
            service: service.into(),
            domain: "".into(),
            version: "".into(),
            consumer_header: HeaderName::from_static(gov_proto::compiled::CONSUMER_HEADER),
            consumer_source: ConsumerSource::Header,
            paths: gov_proto::path::Reading::default(),
            rules: Vec::new(),
            judged: Box::new([HeaderName::from_static(
                gov_proto::compiled::CONSUMER_HEADER,
            )]),
            claims: Box::new([]),
            metas: Box::new([]),
            expiring: false,
            routers: Default::default(),
            plans: Box::new([]),
            classes: Classes::default(),
        }
    }

    /// The request headers the rules' matches read (`header "x" = "v"`),
    /// each once, in rule order: what a decision log keeps of a request so a
    /// replay can match it again.
    pub fn match_headers(&self) -> Vec<HeaderName> {
        let mut out = Vec::new();
        for rule in &self.rules {
            rule.on.headers(&mut out);
        }
        out
    }

    /// The consumer header, then the headers the rules match on, each once:
    /// the headers a decision reads, which must reach the upstream as judged
    /// ([`crate::judged::check`]).
    pub fn judged_headers(&self) -> &[HeaderName] {
        &self.judged
    }

    /// The claims of a verified token the rules key on (`per claim`), each
    /// once: the agent reads these of the token it verified.
    pub fn keyed_claims(&self) -> &[Box<str>] {
        &self.claims
    }

    /// Gives every keyed limit and bulkhead whose policy names no
    /// `max_keys` the agent's cap (`--max-keys-per-rule`).
    pub(crate) fn default_max_keys(&mut self, max: u32) {
        for rule in &mut self.rules {
            if let Some(keys) = rule.spec.keys_mut() {
                keys.max.get_or_insert(max);
            }
        }
    }

    /// The rule called `name` (`service/rule`).
    pub fn rule_id(&self, name: &str) -> Option<RuleId> {
        self.rules
            .iter()
            .position(|r| &*r.name == name)
            .and_then(|i| u32::try_from(i).ok())
            .map(RuleId)
    }

    /// The rule with this id.
    pub fn rule(&self, id: RuleId) -> Option<&Rule> {
        self.rules.get(id.0 as usize)
    }
}

impl TryFrom<&proto::TargetConfig> for CompiledConfig {
    type Error = InvalidConfig;

    fn try_from(t: &proto::TargetConfig) -> Result<Self, InvalidConfig> {
        if t.consumer_header.is_empty() {
            return Err(InvalidConfig::NoConsumerHeader);
        }
        let consumer_header = HeaderName::from_bytes(
            t.consumer_header.to_ascii_lowercase().as_bytes(),
        )
        .map_err(|_| InvalidConfig::ConsumerHeader {
            header: t.consumer_header.clone(),
        })?;

        let paths = gov_proto::path::Reading::from_wire(t.paths)
            .ok_or(InvalidConfig::Paths { value: t.paths })?;

        let mut rules = rules(&t.rules, paths.case_insensitive)?;

        // Before the rules' metas: a bulkhead keyed by class keys its calls.
        let classes = classes(&t.service, &t.matches, paths.case_insensitive)?;
        if !classes.is_empty() {
            for r in &mut rules {
                match &mut r.spec {
                    RuleSpec::Bulkhead(b) => b.by_class = true,
                    RuleSpec::Limit(l) => l.by_class = true,
                    _ => {}
                }
            }
        }
        let metas: Box<[RuleMeta]> = rules
            .iter()
            .map(|r| RuleMeta {
                phase: r.spec.phase(),
                consumer: r.spec.needs_consumer(),
                keyed: r.spec.keyed(),
                timeout: r.spec.timeout().filter(|_| !r.mode.is_shadow()),
                expires_ns: r.expires.map_or(u64::MAX, |e| crate::clock::ns(e.at)),
            })
            .collect();
        let expiring = rules.iter().any(|r| r.expires.is_some());
        let mut inbound = Router::new(
            rules.iter().map(|r| (r.direction, &r.on)),
            &metas,
            Direction::Inbound,
            0,
        );
        let mut outbound = Router::new(
            rules.iter().map(|r| (r.direction, &r.on)),
            &metas,
            Direction::Outbound,
            inbound.end(),
        );
        let plans = inbound.plans().chain(outbound.plans()).cloned().collect();
        inbound.plan_by_path(!(expiring || paths.case_insensitive));
        outbound.plan_by_path(!expiring);
        let consumer_source = ConsumerSource::from_wire(t.consumer_source.as_ref())?;
        let claims = claims(&rules, &consumer_source)?;
        let judged = judged(&rules, &consumer_header, &consumer_source);
        Ok(Self {
            service: t.service.as_str().into(),
            domain: t.domain.as_str().into(),
            version: t.version.as_str().into(),
            consumer_header,
            consumer_source,
            paths,
            rules,
            judged,
            claims,
            metas,
            expiring,
            routers: [Box::new(inbound), Box::new(outbound)],
            plans,
            classes,
        })
    }
}

/// The rules of the wire, at most [`MAX_RULES`], each converted, their names
/// unique; inbound ones folded for a case-insensitive service (`fold`).
fn rules(wire: &[proto::Rule], fold: bool) -> Result<Vec<Rule>, InvalidConfig> {
    if wire.len() > MAX_RULES {
        return Err(InvalidConfig::TooManyRules {
            count: wire.len(),
            max: MAX_RULES,
        });
    }
    let mut rules = wire.iter().map(rule).collect::<Result<Vec<_>, _>>()?;
    // The declaration is the service's own: outbound calls go to other
    // services, read case-sensitively.
    if fold {
        for r in rules
            .iter_mut()
            .filter(|r| r.direction == Direction::Inbound)
        {
            r.on.fold_case();
            if let RuleSpec::Limit(l) = &mut r.spec {
                l.fold_case();
            }
        }
    }
    let mut seen = HashSet::new();
    for r in &rules {
        if !seen.insert(r.name.clone()) {
            return Err(InvalidConfig::Duplicate {
                rule: r.name.to_string(),
            });
        }
    }
    Ok(rules)
}

/// The token claims limits key on, each once; refused on a rule that could
/// not have them (only a verified token has claims, and only inbound).
fn claims(rules: &[Rule], source: &ConsumerSource) -> Result<Box<[Box<str>]>, InvalidConfig> {
    let mut claims: Vec<Box<str>> = Vec::new();
    for r in rules {
        if let RuleSpec::Limit(l) = &r.spec {
            for part in &l.parts {
                let KeyPart::Claim(c) = part else { continue };
                if source.jwt().is_none() || r.direction != Direction::Inbound {
                    return Err(Ctx::new(&r.name).err(format!(
                        "keyed on `claim \"{c}\"`, but claims are verified only on inbound calls of a service with `consumer from jwt`"
                    )));
                }
                if !claims.contains(c) {
                    claims.push(c.clone());
                }
            }
        }
    }
    Ok(claims.into_boxed_slice())
}

/// The headers the engine judges, each once: the consumer's (and the
/// token's), those the rules match on, and those limits key on.
fn judged(
    rules: &[Rule],
    consumer_header: &HeaderName,
    source: &ConsumerSource,
) -> Box<[HeaderName]> {
    let mut judged = vec![consumer_header.clone()];
    if let Some(jwt) = source.jwt()
        && !judged.contains(&jwt.header)
    {
        judged.push(jwt.header.clone());
    }
    for r in rules {
        r.on.headers(&mut judged);
        // A header a key reads is judged too: sent twice, the engine
        // would key on one copy while the upstream reads another.
        if let RuleSpec::Limit(l) = &r.spec {
            for part in &l.parts {
                if let KeyPart::Header(h) = part
                    && !judged.contains(h)
                {
                    judged.push(h.clone());
                }
            }
        }
    }
    judged.into_boxed_slice()
}

/// The named matches of `matches` that declare a class: each checked (a
/// class this agent does not know is refused, never read as `default`),
/// inbound paths folded for a case-insensitive service.
fn classes(service: &str, matches: &[proto::Match], fold: bool) -> Result<Classes, InvalidConfig> {
    let mut out = Vec::new();
    for m in matches {
        let name = format!("{service}/match {}", m.name);
        let ctx = Ctx::new(&name);
        let class = match ctx.known::<proto::Criticality>("criticality", m.criticality)? {
            proto::Criticality::Unspecified => continue,
            proto::Criticality::Sheddable => Class::Sheddable,
            proto::Criticality::Default => Class::Default,
            proto::Criticality::Critical => Class::Critical,
        };
        let expr = m
            .expr
            .as_ref()
            .ok_or_else(|| ctx.err("`expr` is missing"))?;
        let outbound = cond(&ctx, expr, 0)?;
        let mut inbound = outbound.clone();
        if fold {
            inbound.fold_case();
        }
        out.push((class, inbound, outbound));
    }
    Ok(Classes::new(out))
}

impl TryFrom<proto::TargetConfig> for CompiledConfig {
    type Error = InvalidConfig;

    fn try_from(t: proto::TargetConfig) -> Result<Self, InvalidConfig> {
        Self::try_from(&t)
    }
}

/// One wire rule: its kind's spec ([`crate::state::spec`]), then the shared header.
fn rule(r: &proto::Rule) -> Result<Rule, InvalidConfig> {
    let ctx = Ctx::new(&r.name);
    let spec = crate::state::spec(&ctx, r)?;
    header(&ctx, r, spec)
}

/// The header of `r` with its `spec`.
fn header(ctx: &Ctx<'_>, r: &proto::Rule, spec: RuleSpec) -> Result<Rule, InvalidConfig> {
    if ctx.rule.is_empty() {
        return Err(ctx.err("the rule has no name"));
    }
    let mode = match proto::Mode::try_from(r.mode) {
        Ok(proto::Mode::Enforce) if r.stamp_would_reject => {
            return Err(ctx.err(
                "`stamp_would_reject` is set on a rule in mode enforce (only a shadow rule stamps)",
            ));
        }
        Ok(proto::Mode::Enforce) => Mode::Enforce,
        Ok(proto::Mode::Shadow) => {
            if let RuleSpec::Limit(l) = &spec
                && matches!(l.scope, LimitScope::ClusterExact(_))
            {
                return Err(ctx.err(
                    "a shadow limit cannot count with `sync exact` (each call would wait for the cluster store, and a shadow rule never delays a call): use `sync batch` or `scope local` while in shadow",
                ));
            }
            Mode::Shadow {
                stamp: r.stamp_would_reject,
            }
        }
        Ok(proto::Mode::Unspecified) => return Err(ctx.err("`mode` is missing")),
        Err(_) => {
            return Err(ctx.err(format!(
                "mode {} is unknown to this agent (upgrade the agent, or apply the rule with mode enforce)",
                r.mode
            )));
        }
    };
    let on = r.on.as_ref().ok_or_else(|| ctx.err("`on` is missing"))?;
    let on = cond(ctx, on, 0)?;
    let source = r
        .source
        .as_ref()
        .map(|s| SourceRef {
            file: s.file.as_str().into(),
            line: s.line,
            column: s.column,
            snippet: s.snippet.as_str().into(),
        })
        .unwrap_or_default();
    let direction = match proto::Direction::try_from(r.direction) {
        Ok(proto::Direction::Inbound) => Direction::Inbound,
        Ok(proto::Direction::Outbound) => Direction::Outbound,
        Err(_) => return Err(ctx.err(format!("direction {} is unknown", r.direction))),
    };
    let expires = match (r.expires_at_unix_ms, r.for_ms) {
        (0, 0) => None,
        (0, _) => {
            return Err(ctx.err(
                "`for_ms` is set but `expires_at_unix_ms` is not: a `for` starts at govd's apply, which sets the instant (give a config loaded without govd an `expires` instead)",
            ));
        }
        (unix_ms, _) => Some(Expiry::at_unix_ms(unix_ms)),
    };
    Ok(Rule {
        name: ctx.rule.into(),
        source,
        direction,
        mode,
        expires,
        spec,
        on,
    })
}

fn cond(ctx: &Ctx<'_>, e: &proto::MatchExpr, depth: usize) -> Result<Cond, InvalidConfig> {
    use proto::match_expr::Kind;
    // Deeply nested wire data must not overflow the stack.
    if depth > 64 {
        return Err(ctx.err("the match expression is nested deeper than 64 levels"));
    }
    let kind = e
        .kind
        .as_ref()
        .ok_or_else(|| ctx.err("a match expression is empty"))?;
    Ok(match kind {
        Kind::Path(p) => {
            if !p.value.starts_with('/') {
                return Err(ctx.err(format!("path `{}` does not start with `/`", p.value)));
            }
            match ctx.known::<proto::PathKind>("path.kind", p.kind)? {
                proto::PathKind::Exact => Cond::PathExact(p.value.as_str().into()),
                proto::PathKind::Prefix => Cond::PathPrefix(p.value.as_str().into()),
            }
        }
        Kind::Method(m) => Cond::Method(
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| ctx.err(format!("`{m}` is not an HTTP method")))?,
        ),
        Kind::Header(h) => Cond::Header(
            HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes())
                .map_err(|_| ctx.err(format!("`{}` is not a header name", h.name)))?,
            HeaderValue::from_str(&h.value)
                .map_err(|_| ctx.err(format!("`{}` is not a header value", h.value)))?,
        ),
        Kind::Consumer(c) => Cond::Consumer(c.as_str().into()),
        Kind::CallsTo(s) => Cond::CallsTo(s.as_str().into()),
        Kind::Any(_) => Cond::Any,
        Kind::And(list) | Kind::Or(list) => {
            if list.exprs.is_empty() {
                return Err(ctx.err("an `and`/`or` list is empty"));
            }
            let items = list
                .exprs
                .iter()
                .map(|e| cond(ctx, e, depth + 1))
                .collect::<Result<Vec<_>, _>>()?
                .into_boxed_slice();
            if matches!(kind, Kind::And(_)) {
                Cond::And(items)
            } else {
                Cond::Or(items)
            }
        }
    })
}
