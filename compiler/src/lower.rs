//! Lowering: one `TargetConfig` per service, with defaults applied.
//!
//! - Match references are inlined (`on slow` becomes the expression of
//!   `slow`) and `and`/`or` chains flattened; `match_name` keeps the name
//!   when a rule is on one named match.
//! - Every value is written out, so agents never fill one in: the
//!   defaults are [`gov_proto::compiled`]'s (bulkhead rejection 408, limit
//!   429, fuse 503; fuse recovery manual; error classification business =
//!   status 500..599 and system = connect_failure, timeout, reset; consumer
//!   header `x-gov-consumer`), every rule's mode is `enforce`, and
//!   `max_wait` 0 (fail fast) is a value.
//! - Each rule is one `Rule`: the shared header (`Lower::head`) and the
//!   kind's spec.
//! - `wait for R` becomes a wait of R's expiry
//!   (`server_cache + client_refresh + balancer_refresh`).
//! - Each rule is named `service/rule` and carries a
//!   [`SourceRef`](gov_proto::v1::SourceRef) (file, line, column, first
//!   line of its text).
//! - `version` is a content hash (sha-256, 16 hex digits) of the config
//!   encoded with prost with `version` empty and every source reference
//!   cleared, so reformatting or moving text between files never changes
//!   it. Services are sorted by name; rules keep their written order. The
//!   bundle version hashes the per-service versions.

use gov_lang::ast::{
    self, Action as AstAction, ConsumerSource, HttpCall as AstHttpCall, MatchExpr as AstExpr,
    OnInvalid, ServiceStmt, ShutdownStep as AstShutdownStep, Span, WarmupStep as AstWarmupStep,
};
use gov_proto::compiled;
use gov_proto::v1 as pb;
use prost::Message as _;
use sha2::{Digest, Sha256};

use crate::kind::{LowerCx, Rule, RuleExpiry, RuleMode};
use crate::resolve::{Ctx, File, Norm, Svc};
use crate::units::{millis, u32_of, unsigned};

/// At most this many lines of a rule's text travel as its `SourceRef` snippet.
const MAX_SNIPPET_LINES: usize = 40;

/// The longest a `wait for gov` step waits for every caller to acknowledge an
/// endpoint set without the instance (then it goes on and says who had not).
pub(crate) const WAIT_FOR_GOV_TIMEOUT_MS: u64 = 30_000;

/// Whether `wait for NAME` means govd's own registry: `gov`, when no registry
/// is declared with that name.
pub(crate) fn is_gov(cx: &Ctx<'_>, name: &str) -> bool {
    name == "gov" && cx.registry(name).is_none()
}

/// Lowers every service (first definitions, sorted by name).
pub(crate) fn bundle(cx: &Ctx<'_>) -> pb::Bundle {
    // `service_index` is a BTreeMap: iteration is sorted by name.
    let targets: Vec<pb::TargetConfig> = cx.unique_services().map(|svc| target(cx, svc)).collect();
    let version = bundle_version(&targets);
    pb::Bundle { targets, version }
}

/// Puts every rule of `bundle` in mode shadow (`govc apply --shadow`; a
/// `stamp` written in the policy stays) and recomputes the versions.
pub fn shadow_all(bundle: &mut pb::Bundle) {
    for t in &mut bundle.targets {
        for r in &mut t.rules {
            r.mode = pb::Mode::Shadow as i32;
        }
        version_in_place(t);
    }
    bundle.version = bundle_version(&bundle.targets);
}

/// Anchors every `for D` rule of `bundle` at an apply made at
/// `now_unix_ms` against the policy in force, `before`: a rule that
/// `before` has under the same name with the same `for` keeps the expiry
/// it had there (an apply that keeps a rule never restarts its clock, even
/// once it has expired); any other (a new rule, a rule whose `for`
/// changed, a rule that had none) expires `D` from now. Recomputes the
/// versions: an apply that keeps every anchor keeps them too.
pub fn anchor_expiry(bundle: &mut pb::Bundle, before: &pb::Bundle, now_unix_ms: u64) {
    let kept: std::collections::HashMap<(&str, u64), u64> = before
        .targets
        .iter()
        .flat_map(|t| &t.rules)
        .filter(|r| r.for_ms > 0 && r.expires_at_unix_ms > 0)
        .map(|r| ((r.name.as_str(), r.for_ms), r.expires_at_unix_ms))
        .collect();
    let mut changed = false;
    for t in &mut bundle.targets {
        let mut anchored = false;
        for r in t.rules.iter_mut().filter(|r| r.for_ms > 0) {
            r.expires_at_unix_ms = kept
                .get(&(r.name.as_str(), r.for_ms))
                .copied()
                .unwrap_or_else(|| now_unix_ms.saturating_add(r.for_ms));
            anchored = true;
        }
        if anchored {
            version_in_place(t);
            changed = true;
        }
    }
    if changed {
        bundle.version = bundle_version(&bundle.targets);
    }
}

/// The version of a bundle: a hash over its services' names and versions.
pub fn bundle_version(targets: &[pb::TargetConfig]) -> String {
    let mut h = Sha256::new();
    for t in targets {
        h.update(t.service.as_bytes());
        h.update([0]);
        h.update(t.version.as_bytes());
        h.update([0]);
    }
    short(&h.finalize())
}

/// The content hash of one config, ignoring `version` and source references.
pub fn target_version(t: &pb::TargetConfig) -> String {
    let mut t = t.clone();
    version_in_place(&mut t);
    t.version
}

/// Sets `t.version` without cloning: the source references are taken out
/// for the encoding and put back.
fn version_in_place(t: &mut pb::TargetConfig) {
    t.version.clear();
    let mut taken = Vec::new();
    each_source(t, &mut |s| taken.push(s.take()));
    let digest = Sha256::digest(t.encode_to_vec());
    let mut taken = taken.into_iter();
    each_source(t, &mut |s| *s = taken.next().flatten());
    t.version = short(&digest);
}

fn short(digest: &[u8]) -> String {
    hex::encode(&digest[..8])
}

/// Clears every source reference, the only part that depends on layout.
pub fn clear_sources(t: &mut pb::TargetConfig) {
    each_source(t, &mut |s| *s = None);
}

/// Visits every source reference of a config, always in the same order.
fn each_source(t: &mut pb::TargetConfig, f: &mut dyn FnMut(&mut Option<pb::SourceRef>)) {
    for m in &mut t.matches {
        f(&mut m.source);
    }
    for r in &mut t.rules {
        f(&mut r.source);
        if let Some(spec) = &mut r.spec
            && let Some(kind) = crate::kind::of_spec(spec)
        {
            kind.sources(spec, f);
        }
    }
    if let Some(w) = &mut t.warmup {
        f(&mut w.source);
        for s in &mut w.steps {
            f(&mut s.source);
        }
    }
    if let Some(s) = &mut t.shutdown {
        f(&mut s.source);
        for step in &mut s.steps {
            f(&mut step.source);
        }
    }
}

/// What lowering one service reads; a kind's lowering gets it too.
pub(crate) struct Lower<'c, 'a> {
    cx: &'c Ctx<'a>,
    svc: &'c Svc<'a>,
    file: &'c File<'a>,
}

fn on_invalid_wire(on_invalid: OnInvalid) -> pb::OnInvalid {
    match on_invalid {
        OnInvalid::Reject => pb::OnInvalid::Reject,
        OnInvalid::Count => pb::OnInvalid::Count,
    }
}

fn target(cx: &Ctx<'_>, svc: &Svc<'_>) -> pb::TargetConfig {
    let file = &cx.files[svc.file];
    let l = Lower { cx, svc, file };
    let mut t = pb::TargetConfig {
        service: svc.name().to_string(),
        domain: svc.domain.map(|d| d.node.clone()).unwrap_or_default(),
        version: String::new(),
        consumer_header: match svc.consumer.map(|c| &c.source) {
            Some(ConsumerSource::Header { header, .. }) => header.node.to_ascii_lowercase(),
            Some(ConsumerSource::Jwt(_) | ConsumerSource::Peer { .. }) | None => {
                compiled::CONSUMER_HEADER.to_string()
            }
        },
        consumer_source: match svc.consumer.map(|c| &c.source) {
            Some(ConsumerSource::Jwt(j)) => Some(pb::ConsumerSource {
                kind: Some(pb::consumer_source::Kind::Jwt(pb::JwtSource {
                    header: j.header.node.to_ascii_lowercase(),
                    issuer: j.issuer.node.clone(),
                    audience: j.audience.node.clone(),
                    keys_file: j.keys.node.clone(),
                    claim: j.claim.node.clone(),
                    on_invalid: on_invalid_wire(j.on_invalid.node) as i32,
                })),
            }),
            Some(ConsumerSource::Peer { on_invalid }) => Some(pb::ConsumerSource {
                kind: Some(pb::consumer_source::Kind::Peer(pb::PeerSource {
                    on_invalid: on_invalid_wire(on_invalid.node) as i32,
                })),
            }),
            Some(ConsumerSource::Header { trusted, .. }) if !trusted.is_empty() => {
                Some(pb::ConsumerSource {
                    kind: Some(pb::consumer_source::Kind::TrustedHeader(
                        pb::TrustedHeader {
                            peers: trusted.iter().map(|p| p.node.clone()).collect(),
                        },
                    )),
                })
            }
            Some(ConsumerSource::Header { .. }) | None => None,
        },
        registry: svc
            .registry
            .map(|r| r.name.node.clone())
            .unwrap_or_default(),
        paths: svc.reading().to_wire().into(),
        ..Default::default()
    };
    for stmt in &svc.ast.body {
        match stmt {
            ServiceStmt::Match(m) => {
                if !std::ptr::eq(svc.matches[m.name.node.as_str()], m) {
                    continue;
                }
                t.matches.push(pb::Match {
                    name: m.name.node.clone(),
                    expr: Some(l.expr(&m.expr)),
                    latency_ms: m.latency.as_ref().map_or(0, |d| unsigned(millis(&d.node))),
                    source: Some(l.source(m.span)),
                    criticality: match m.criticality.as_ref().map(|c| c.node) {
                        None => pb::Criticality::Unspecified,
                        Some(gov_lang::ast::Criticality::Sheddable) => pb::Criticality::Sheddable,
                        Some(gov_lang::ast::Criticality::Default) => pb::Criticality::Default,
                        Some(gov_lang::ast::Criticality::Critical) => pb::Criticality::Critical,
                    } as i32,
                });
            }
            ServiceStmt::Warmup(w) if svc.warmup.is_some_and(|x| std::ptr::eq(x, w)) => {
                t.warmup = Some(l.warmup(w));
            }
            ServiceStmt::Shutdown(s) if svc.shutdown.is_some_and(|x| std::ptr::eq(x, s)) => {
                t.shutdown = Some(l.shutdown(s));
            }
            _ => {}
        }
    }
    (t.outlier, t.outlier_targets) = crate::outlier::lower(&svc.outliers);
    for (rule, norm) in svc.rules_with_norms() {
        t.rules.push(pb::Rule {
            spec: Some(rule.imp.lower(rule.def, &l)),
            ..l.head(rule, norm)
        });
    }
    version_in_place(&mut t);
    t
}

fn lower_norm(n: &Norm<'_>) -> pb::MatchExpr {
    use pb::match_expr::Kind;
    let kind = match n {
        Norm::Any | Norm::Invalid => Kind::Any(true),
        Norm::PathExact(v) => Kind::Path(pb::PathMatch {
            kind: pb::PathKind::Exact as i32,
            value: (*v).to_string(),
        }),
        Norm::PathPrefix(v) => Kind::Path(pb::PathMatch {
            kind: pb::PathKind::Prefix as i32,
            value: (*v).to_string(),
        }),
        Norm::Method(m) => Kind::Method((*m).to_string()),
        Norm::Header(name, value) => Kind::Header(pb::HeaderMatch {
            name: name.to_string(),
            value: (*value).to_string(),
        }),
        Norm::Consumer(c) => Kind::Consumer((*c).to_string()),
        Norm::CallsTo(s) => Kind::CallsTo((*s).to_string()),
        Norm::And(parts) => Kind::And(pb::MatchList {
            exprs: parts.iter().map(lower_norm).collect(),
        }),
        Norm::Or(parts) => Kind::Or(pb::MatchList {
            exprs: parts.iter().map(lower_norm).collect(),
        }),
    };
    pb::MatchExpr { kind: Some(kind) }
}

impl LowerCx for Lower<'_, '_> {
    fn source(&self, span: Span) -> pb::SourceRef {
        Lower::source(self, span)
    }

    fn captures(&self, on: &AstExpr) -> Vec<(String, String)> {
        let svc: &Svc<'_> = self.svc;
        svc.captures(on)
    }
}

impl Lower<'_, '_> {
    /// Where `span` is: file, line, column and the text, for the wire.
    pub(crate) fn source(&self, span: Span) -> pb::SourceRef {
        let line = self
            .file
            .lines
            .partition_point(|&start| start <= span.start);
        let line_start = self
            .file
            .lines
            .get(line.saturating_sub(1))
            .copied()
            .unwrap_or(0);
        let prefix = self
            .file
            .text
            .get(line_start..span.start)
            .unwrap_or_default();
        // The whole rule, verbatim (as config.proto promises), so the TUI's
        // detail pane and NACK reports show what was written. Bounded so one
        // huge rule cannot bloat every config on the wire.
        let text = self.file.text.get(span.start..span.end).unwrap_or_default();
        // Later lines lose the indentation the rule itself has, so the
        // snippet reads as if the rule started at column 1.
        let indent = prefix.len() - prefix.trim_start().len();
        let mut snippet = text
            .lines()
            .take(MAX_SNIPPET_LINES)
            .enumerate()
            .map(|(i, l)| {
                let l = l.trim_end();
                let lead = l.len() - l.trim_start().len();
                if i == 0 {
                    l
                } else {
                    l.get(lead.min(indent)..).unwrap_or(l)
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        if text.lines().nth(MAX_SNIPPET_LINES).is_some() {
            snippet.push_str("\n...");
        }
        pb::SourceRef {
            file: self.file.name.to_string(),
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(prefix.chars().count() + 1).unwrap_or(u32::MAX),
            snippet,
        }
    }

    fn expr(&self, e: &AstExpr) -> pb::MatchExpr {
        lower_norm(&self.svc.normalize(e))
    }

    /// The header every rule shares (its `spec` unset).
    fn head(&self, rule: &Rule<'_>, norm: &Norm<'_>) -> pb::Rule {
        let direction = if norm.is_outbound() {
            pb::Direction::Outbound
        } else {
            pb::Direction::Inbound
        };
        let match_name = match rule.on() {
            AstExpr::Ref { name } => name.node.clone(),
            _ => String::new(),
        };
        let mode = RuleMode::of(rule.def);
        let (expires_at_unix_ms, for_ms) = RuleExpiry::wire(rule.def);
        pb::Rule {
            name: format!("{}/{}", self.svc.name(), rule.name().node),
            source: Some(self.source(rule.span())),
            on: Some(lower_norm(norm)),
            match_name,
            direction: direction as i32,
            mode: if mode.shadow {
                pb::Mode::Shadow
            } else {
                pb::Mode::Enforce
            } as i32,
            stamp_would_reject: mode.stamp,
            expires_at_unix_ms,
            for_ms,
            spec: None,
        }
    }

    fn warmup(&self, w: &ast::Warmup) -> pb::Warmup {
        use pb::warmup_step::Step;
        let steps = w
            .steps
            .iter()
            .map(|s| {
                let (step, span) = match s {
                    AstWarmupStep::Ready {
                        probe,
                        status,
                        every,
                        after,
                        timeout,
                        span,
                    } => (
                        Step::Ready(pb::ReadyProbe {
                            probe: Some(http(probe)),
                            status: u32_of(status.node),
                            every_ms: unsigned(millis(&every.node)),
                            after_ms: after.as_ref().map_or(0, |d| unsigned(millis(&d.node))),
                            timeout_ms: timeout.as_ref().map_or_else(
                                || compiled::probe_timeout_ms(unsigned(millis(&every.node))),
                                |d| unsigned(millis(&d.node)),
                            ),
                        }),
                        *span,
                    ),
                    AstWarmupStep::Register { span } => (Step::Register(true), *span),
                    AstWarmupStep::Ramp { over, from, span } => (
                        Step::Ramp(pb::Ramp {
                            over_ms: unsigned(millis(&over.node)),
                            from_milli_percent: u32_of(from.node.milli),
                        }),
                        *span,
                    ),
                    AstWarmupStep::Start { what, action, span } => {
                        (Step::Start(invoke(what, action)), *span)
                    }
                };
                pb::WarmupStep {
                    source: Some(self.source(span)),
                    step: Some(step),
                }
            })
            .collect();
        pb::Warmup {
            steps,
            source: Some(self.source(w.span)),
        }
    }

    fn shutdown(&self, s: &ast::Shutdown) -> pb::Shutdown {
        use pb::shutdown_step::Step;
        let steps = s
            .steps
            .iter()
            .map(|step| {
                let (lowered, span) = match step {
                    AstShutdownStep::Deregister { span } => (Step::Deregister(true), *span),
                    AstShutdownStep::Wait { duration, span } => (
                        Step::Wait(pb::Wait {
                            duration_ms: unsigned(millis(&duration.node)),
                            registry: String::new(),
                        }),
                        *span,
                    ),
                    AstShutdownStep::WaitFor { registry, span }
                        if is_gov(self.cx, &registry.node) =>
                    {
                        (
                            Step::WaitForGov(pb::WaitForGov {
                                timeout_ms: WAIT_FOR_GOV_TIMEOUT_MS,
                            }),
                            *span,
                        )
                    }
                    AstShutdownStep::WaitFor { registry, span } => (
                        Step::Wait(pb::Wait {
                            duration_ms: self
                                .cx
                                .registry(&registry.node)
                                .map_or(0, |r| unsigned(crate::resolve::registry_expiry_ms(r))),
                            registry: registry.node.clone(),
                        }),
                        *span,
                    ),
                    AstShutdownStep::Stop { what, action, span } => {
                        (Step::Stop(invoke(what, action)), *span)
                    }
                    AstShutdownStep::Drain { deadline, span } => {
                        (Step::DrainMs(unsigned(millis(&deadline.node))), *span)
                    }
                };
                pb::ShutdownStep {
                    source: Some(self.source(span)),
                    step: Some(lowered),
                }
            })
            .collect();
        pb::Shutdown {
            steps,
            source: Some(self.source(s.span)),
        }
    }
}

fn http(call: &AstHttpCall) -> pb::HttpCall {
    pb::HttpCall {
        method: call.method.node.clone(),
        path: call.path.node.clone(),
    }
}

fn invoke(what: &ast::Ident, action: &AstAction) -> pb::Invoke {
    let kind = match action {
        AstAction::Http(call) => pb::action::Kind::Http(http(call)),
        AstAction::Signal { signal, .. } => pb::action::Kind::Signal(signal.node.clone()),
    };
    pb::Invoke {
        what: what.node.clone(),
        action: Some(pb::Action { kind: Some(kind) }),
    }
}
