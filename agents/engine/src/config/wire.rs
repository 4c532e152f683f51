//! The conversion of the wire config (`gov_proto::v1::TargetConfig`) into a
//! [`CompiledConfig`]: every value checked, nothing filled in, and every
//! error naming the rule at fault ([`InvalidConfig`]). The one place that
//! turns a rule's `oneof spec` into a [`RuleSpec`].

use std::collections::HashSet;
use std::time::Duration;

use gov_proto::v1 as proto;
use http::{HeaderName, HeaderValue, Method, StatusCode};

use super::{
    BulkheadKey, BulkheadSpec, Classifier, CompareOp, CompiledConfig, Direction, FuseSpec,
    InvalidConfig, LimitAction, LimitKey, LimitScope, LimitSpec, MAX_RULES, RateSpec, RecoverSpec,
    ReleaseSpec, Rule, RuleSpec, SourceRef, Threshold, TripMetric, TripSpec,
};
use crate::route::{Cond, Router};

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

        if t.rules.len() > MAX_RULES {
            return Err(InvalidConfig::TooManyRules {
                count: t.rules.len(),
                max: MAX_RULES,
            });
        }
        let rules = t.rules.iter().map(rule).collect::<Result<Vec<_>, _>>()?;
        let mut seen = HashSet::new();
        for r in &rules {
            if !seen.insert(r.name.clone()) {
                return Err(InvalidConfig::Duplicate {
                    rule: r.name.to_string(),
                });
            }
        }

        let inbound = Router::new(
            rules.iter().map(|r| (r.direction, &r.on)),
            Direction::Inbound,
        );
        let outbound = Router::new(
            rules.iter().map(|r| (r.direction, &r.on)),
            Direction::Outbound,
        );
        Ok(Self {
            service: t.service.as_str().into(),
            domain: t.domain.as_str().into(),
            version: t.version.as_str().into(),
            consumer_header,
            rules,
            inbound,
            outbound,
        })
    }
}

impl TryFrom<proto::TargetConfig> for CompiledConfig {
    type Error = InvalidConfig;

    fn try_from(t: proto::TargetConfig) -> Result<Self, InvalidConfig> {
        Self::try_from(&t)
    }
}

/// Names the rule in every error.
struct Ctx<'a> {
    rule: &'a str,
}

impl<'a> Ctx<'a> {
    fn new(rule: &'a str) -> Self {
        Self { rule }
    }

    fn err(&self, problem: impl Into<String>) -> InvalidConfig {
        InvalidConfig::Rule {
            rule: self.rule.to_string(),
            problem: problem.into(),
        }
    }

    /// The header of `r` with its `spec`.
    fn rule(&self, r: &proto::Rule, spec: RuleSpec) -> Result<Rule, InvalidConfig> {
        if self.rule.is_empty() {
            return Err(self.err("the rule has no name"));
        }
        match proto::Mode::try_from(r.mode) {
            Ok(proto::Mode::Enforce) => {}
            Ok(proto::Mode::Unspecified) => return Err(self.err("`mode` is missing")),
            Err(_) => {
                return Err(self.err(format!(
                    "mode {} is unknown to this agent (upgrade the agent, or apply the rule with mode enforce)",
                    r.mode
                )));
            }
        }
        let on = r.on.as_ref().ok_or_else(|| self.err("`on` is missing"))?;
        let on = self.cond(on, 0)?;
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
            Err(_) => return Err(self.err(format!("direction {} is unknown", r.direction))),
        };
        Ok(Rule {
            name: self.rule.into(),
            source,
            direction,
            spec,
            on,
        })
    }

    fn cond(&self, e: &proto::MatchExpr, depth: usize) -> Result<Cond, InvalidConfig> {
        use proto::match_expr::Kind;
        // Deeply nested wire data must not overflow the stack.
        if depth > 64 {
            return Err(self.err("the match expression is nested deeper than 64 levels"));
        }
        let kind = e
            .kind
            .as_ref()
            .ok_or_else(|| self.err("a match expression is empty"))?;
        Ok(match kind {
            Kind::Path(p) => {
                if !p.value.starts_with('/') {
                    return Err(self.err(format!("path `{}` does not start with `/`", p.value)));
                }
                match self.known::<proto::PathKind>("path.kind", p.kind)? {
                    proto::PathKind::Exact => Cond::PathExact(p.value.as_str().into()),
                    proto::PathKind::Prefix => Cond::PathPrefix(p.value.as_str().into()),
                }
            }
            Kind::Method(m) => Cond::Method(
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| self.err(format!("`{m}` is not an HTTP method")))?,
            ),
            Kind::Header(h) => Cond::Header(
                HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes())
                    .map_err(|_| self.err(format!("`{}` is not a header name", h.name)))?,
                HeaderValue::from_str(&h.value)
                    .map_err(|_| self.err(format!("`{}` is not a header value", h.value)))?,
            ),
            Kind::Consumer(c) => Cond::Consumer(c.as_str().into()),
            Kind::CallsTo(s) => Cond::CallsTo(s.as_str().into()),
            Kind::Any(_) => Cond::Any,
            Kind::And(list) | Kind::Or(list) => {
                if list.exprs.is_empty() {
                    return Err(self.err("an `and`/`or` list is empty"));
                }
                let items = list
                    .exprs
                    .iter()
                    .map(|e| self.cond(e, depth + 1))
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

    /// An enum value this agent knows: an unknown one (from a newer
    /// compiler) is refused, never read as the enum's first value.
    fn known<E: TryFrom<i32>>(&self, field: &str, value: i32) -> Result<E, InvalidConfig> {
        E::try_from(value)
            .map_err(|_| self.err(format!("`{field}` {value} is unknown to this agent")))
    }

    fn positive_ms(&self, field: &str, ms: u64) -> Result<Duration, InvalidConfig> {
        if ms == 0 {
            return Err(self.err(format!("`{field}` must be > 0")));
        }
        Ok(Duration::from_millis(ms))
    }

    fn status(&self, code: u32) -> Result<StatusCode, InvalidConfig> {
        if code == 0 {
            return Err(self.err("`reject_status` is missing"));
        }
        u16::try_from(code)
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .filter(|s| s.as_u16() >= 200)
            .ok_or_else(|| self.err(format!("`reject_status` {code} is not an HTTP status")))
    }

    fn rate(&self, field: &str, r: &proto::Rate) -> Result<RateSpec, InvalidConfig> {
        if r.amount == 0 {
            return Err(self.err(format!("`{field}.amount` must be > 0")));
        }
        Ok(RateSpec {
            amount: r.amount,
            window: self.positive_ms(&format!("{field}.window_ms"), r.window_ms)?,
        })
    }
}

/// One wire rule: its kind's spec, then the shared header. The one place
/// that turns a `oneof spec` into a [`RuleSpec`].
fn rule(r: &proto::Rule) -> Result<Rule, InvalidConfig> {
    use proto::rule::Spec;
    let ctx = Ctx::new(&r.name);
    let spec = match &r.spec {
        Some(Spec::Bulkhead(b)) => RuleSpec::Bulkhead(bulkhead(&ctx, b)?),
        Some(Spec::Limit(l)) => RuleSpec::Limit(limit(&ctx, l)?),
        Some(Spec::Fuse(f)) => RuleSpec::Fuse(fuse(&ctx, f)?),
        None => {
            return Err(ctx.err(
                "the rule has no spec: its kind is missing, or one this agent does not know (upgrade the agent)",
            ));
        }
    };
    ctx.rule(r, spec)
}

fn bulkhead(ctx: &Ctx<'_>, b: &proto::Bulkhead) -> Result<BulkheadSpec, InvalidConfig> {
    if b.max_concurrent == 0 {
        return Err(ctx.err("`max_concurrent` must be > 0"));
    }
    Ok(BulkheadSpec {
        key: match ctx.known::<proto::BulkheadKey>("key", b.key)? {
            proto::BulkheadKey::Operation => BulkheadKey::Operation,
            proto::BulkheadKey::Instance => BulkheadKey::Instance,
            proto::BulkheadKey::InstancePath => BulkheadKey::InstancePath,
        },
        max_concurrent: b.max_concurrent,
        max_wait: Duration::from_millis(b.max_wait_ms),
        max_queue: b.max_queue,
        timeout: (b.timeout_ms > 0).then(|| Duration::from_millis(b.timeout_ms)),
        reject_status: ctx.status(b.reject_status)?,
    })
}

fn limit(ctx: &Ctx<'_>, l: &proto::Limit) -> Result<LimitSpec, InvalidConfig> {
    let calls = l.calls.as_ref().map(|r| ctx.rate("calls", r)).transpose()?;
    let bytes = l.bytes.as_ref().map(|r| ctx.rate("bytes", r)).transpose()?;
    if calls.is_none() && bytes.is_none() {
        return Err(ctx.err("neither `calls` nor `bytes` is set"));
    }
    let action = match ctx.known::<proto::LimitAction>("action", l.action)? {
        proto::LimitAction::Reject => LimitAction::Reject,
        proto::LimitAction::Shape => LimitAction::Shape {
            max_delay: ctx.positive_ms("max_delay_ms", l.max_delay_ms)?,
        },
    };
    let release = match l.release.as_ref().and_then(|r| r.kind.as_ref()) {
        None => None,
        Some(proto::release::Kind::AfterMs(ms)) => Some(ReleaseSpec::After(
            ctx.positive_ms("release.after_ms", *ms)?,
        )),
        Some(proto::release::Kind::Manual(_)) => Some(ReleaseSpec::Manual),
    };
    let scope = match (
        ctx.known::<proto::LimitScope>("scope", l.scope)?,
        ctx.known::<proto::ClusterSync>("sync", l.sync)?,
    ) {
        (proto::LimitScope::Local, _) => LimitScope::Local,
        (proto::LimitScope::Cluster, proto::ClusterSync::Exact) => LimitScope::ClusterExact,
        (proto::LimitScope::Cluster, proto::ClusterSync::Batch) => {
            LimitScope::ClusterBatch(ctx.positive_ms("sync_batch_ms", l.sync_batch_ms)?)
        }
    };
    Ok(LimitSpec {
        calls,
        bytes,
        key: match ctx.known::<proto::LimitKey>("key", l.key)? {
            proto::LimitKey::All => LimitKey::All,
            proto::LimitKey::Domain => LimitKey::Domain,
            proto::LimitKey::Service => LimitKey::Service,
            proto::LimitKey::Consumer => LimitKey::Consumer,
        },
        action,
        reject_status: ctx.status(l.reject_status)?,
        release,
        scope,
    })
}

fn fuse(ctx: &Ctx<'_>, f: &proto::Fuse) -> Result<FuseSpec, InvalidConfig> {
    if f.trips.is_empty() {
        return Err(ctx.err("the fuse has no `trip when` condition"));
    }
    let trips = f
        .trips
        .iter()
        .map(|t| {
            let metric = match ctx.known::<proto::TripMetric>("trip.metric", t.metric)? {
                proto::TripMetric::Errors => TripMetric::Errors,
                proto::TripMetric::ErrorRatio => TripMetric::ErrorRatio,
                proto::TripMetric::BusinessErrors => TripMetric::BusinessErrors,
                proto::TripMetric::BusinessErrorRatio => TripMetric::BusinessErrorRatio,
                proto::TripMetric::SystemErrors => TripMetric::SystemErrors,
                proto::TripMetric::SystemErrorRatio => TripMetric::SystemErrorRatio,
            };
            let threshold = if metric.is_ratio() {
                if t.ratio_milli_percent > 100_000 {
                    return Err(ctx.err("a ratio threshold is above 100%"));
                }
                Threshold::MilliPercent(t.ratio_milli_percent)
            } else {
                Threshold::Count(t.count)
            };
            Ok(TripSpec {
                metric,
                op: match ctx.known::<proto::CompareOp>("trip.op", t.op)? {
                    proto::CompareOp::Gt => CompareOp::Gt,
                    proto::CompareOp::Ge => CompareOp::Ge,
                },
                threshold,
                window: ctx.positive_ms("trip.window_ms", t.window_ms)?,
                min_calls: t.min_calls,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let business = classifier(ctx, "business", f.business.as_ref())?;
    let system = classifier(ctx, "system", f.system.as_ref())?;

    let recover = match f.recover.as_ref().and_then(|r| r.kind.as_ref()) {
        None => return Err(ctx.err("`recover` is missing")),
        Some(proto::recovery::Kind::Manual(_)) => RecoverSpec::Manual,
        Some(proto::recovery::Kind::After(a)) => {
            if a.probes == 0 {
                return Err(ctx.err("`recover.after.probes` must be > 0"));
            }
            RecoverSpec::After {
                after: ctx.positive_ms("recover.after.after_ms", a.after_ms)?,
                probes: a.probes,
            }
        }
    };
    Ok(FuseSpec {
        trips,
        business,
        system,
        recover,
        reject_status: ctx.status(f.reject_status)?,
    })
}

fn classifier(
    ctx: &Ctx<'_>,
    class: &str,
    c: Option<&proto::ErrorClass>,
) -> Result<Classifier, InvalidConfig> {
    let mut out = Classifier::default();
    let Some(c) = c else {
        return Err(ctx.err(format!("`{class}` (the error class) is missing")));
    };
    for r in &c.status {
        let (Ok(from), Ok(to)) = (u16::try_from(r.from), u16::try_from(r.to)) else {
            return Err(ctx.err(format!("status range {}..{} is out of range", r.from, r.to)));
        };
        if from < 100 || to > 599 || from > to {
            return Err(ctx.err(format!("status range {from}..{to} is not within 100..599")));
        }
        out.add_statuses(from, to);
    }
    out.connect_failure = c.connect_failure;
    out.timeout = c.timeout;
    out.reset = c.reset;
    Ok(out)
}
