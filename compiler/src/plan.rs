//! Plan: what changes between two compiled bundles, per service and per
//! rule, with field-level old -> new values in readable units.
//!
//! ```text
//! ~ service order
//!   ~ bulkhead order/slow_calls: max_concurrent 10 -> 20
//!   + limit order/burst
//! + service payments
//!
//! Plan: 1 service to add, 1 to change, 0 to remove.
//! ```
//!
//! Services are compared by name, rules by kind and `service/rule` name.
//! A service whose version is unchanged is unchanged: versions are content
//! hashes (see [`crate::lower`]), so this is exact.

use gov_proto::path::Reading;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use gov_proto::v1 as pb;
use serde::Serialize;

use crate::paths;
use crate::units::{fmt_milli_percent, fmt_ms, push};

/// The difference between two bundles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub old_version: String,
    pub new_version: String,
    /// Every service of either bundle, sorted by name (unchanged ones too).
    pub services: Vec<ServicePlan>,
    /// Every service whose retry amplification changes, sorted by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub amplification: Vec<AmplificationChange>,
}

/// A service whose retry amplification changes: how many attempts one call
/// at the top of its worst call path can cause at it (see
/// `gov::lint::retry-amplification`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AmplificationChange {
    pub service: String,
    /// The worst path to it, top first (after the change; before it when the
    /// service is no longer reached).
    pub path: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<Amplification>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<Amplification>,
}

/// The amplification at one service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Amplification {
    /// Attempts when every attempt fails and the budgets' floors pay every
    /// retry (the product of the attempts on the path).
    pub worst: u64,
    /// With every budget holding its share, in thousandths (1,000: none).
    pub budgeted_milli: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServicePlan {
    pub service: String,
    pub change: Change,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_version: Option<String>,
    /// Changed, added and removed parts; empty when unchanged.
    pub rules: Vec<RuleChange>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Unchanged,
    Added,
    Removed,
    Changed,
}

/// What part of a service changed: a rule, a match, the lifecycle blocks
/// or the service's own settings (`Service`). The wire's enum: kinds are
/// named once, in gov-proto.
pub use pb::RuleKind;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleChange {
    #[serde(serialize_with = "kind_word_ser")]
    pub kind: RuleKind,
    /// `service/rule` (`service` for the service's own settings).
    pub rule: String,
    pub change: Change,
    /// For a changed rule: every field that differs.
    pub fields: Vec<FieldChange>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    pub field: String,
    /// `None`: the field is not set on that side.
    pub old: Option<String>,
    pub new: Option<String>,
}

/// Compares two bundles.
pub fn plan(old: &pb::Bundle, new: &pb::Bundle) -> Plan {
    let olds: BTreeMap<&str, &pb::TargetConfig> = old
        .targets
        .iter()
        .map(|t| (t.service.as_str(), t))
        .collect();
    let news: BTreeMap<&str, &pb::TargetConfig> = new
        .targets
        .iter()
        .map(|t| (t.service.as_str(), t))
        .collect();
    let mut names: Vec<&str> = olds.keys().chain(news.keys()).copied().collect();
    names.sort_unstable();
    names.dedup();
    let services = names
        .into_iter()
        .map(|name| {
            let (o, n) = (olds.get(name).copied(), news.get(name).copied());
            let rules = diff_items(
                o.map(items).unwrap_or_default(),
                n.map(items).unwrap_or_default(),
            );
            let change = match (o, n) {
                (None, _) => Change::Added,
                (_, None) => Change::Removed,
                (Some(o), Some(n)) if o.version == n.version && rules.is_empty() => {
                    Change::Unchanged
                }
                _ => Change::Changed,
            };
            ServicePlan {
                service: name.to_string(),
                change,
                old_version: o.map(|t| t.version.clone()),
                new_version: n.map(|t| t.version.clone()),
                rules,
            }
        })
        .collect();
    Plan {
        old_version: old.version.clone(),
        new_version: new.version.clone(),
        services,
        amplification: amplification(old, new),
    }
}

/// The services whose amplification differs between the bundles, where it
/// is above one attempt on either side.
fn amplification(old: &pb::Bundle, new: &pb::Bundle) -> Vec<AmplificationChange> {
    let (before, after) = (
        paths::reach(&paths::bundle_hops(old)),
        paths::reach(&paths::bundle_hops(new)),
    );
    let of = |r: &paths::Reach<'_>| Amplification {
        worst: r.worst,
        budgeted_milli: r.budgeted_milli,
    };
    let mut names: Vec<&str> = before.keys().chain(after.keys()).copied().collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let (b, a) = (before.get(name), after.get(name));
            let (old, new) = (b.map(of), a.map(of));
            let amplified = [old, new].iter().flatten().any(|x| x.worst > 1);
            (old != new && amplified).then(|| AmplificationChange {
                service: name.to_string(),
                path: a
                    .or(b)
                    .map(|r| r.path.iter().map(|s| (*s).to_string()).collect())
                    .unwrap_or_default(),
                old,
                new,
            })
        })
        .collect()
}

// === impl Plan ===

impl Plan {
    /// Whether anything is added, removed or changed.
    pub fn has_changes(&self) -> bool {
        self.services.iter().any(|s| s.change != Change::Unchanged)
    }

    fn count(&self, change: Change) -> usize {
        self.services.iter().filter(|s| s.change == change).count()
    }

    /// The human-readable plan (also what `Display` prints).
    pub fn render(&self) -> String {
        self.to_string()
    }

    /// The wire form, for the control plane's `ApplyResult`.
    pub fn to_proto(&self) -> pb::Plan {
        let change = |c: Change| match c {
            Change::Unchanged => pb::Change::Unchanged,
            Change::Added => pb::Change::Added,
            Change::Removed => pb::Change::Removed,
            Change::Changed => pb::Change::Changed,
        } as i32;
        let kind = |k: RuleKind| k as i32;
        pb::Plan {
            services: self
                .services
                .iter()
                .map(|s| pb::ServicePlan {
                    service: s.service.clone(),
                    change: change(s.change),
                    old_version: s.old_version.clone().unwrap_or_default(),
                    new_version: s.new_version.clone().unwrap_or_default(),
                    rules: s
                        .rules
                        .iter()
                        .map(|r| pb::RuleChange {
                            rule: r.rule.clone(),
                            kind: kind(r.kind),
                            change: change(r.change),
                            fields: r
                                .fields
                                .iter()
                                .map(|f| pb::FieldChange {
                                    field: f.field.clone(),
                                    old: f.old.clone().unwrap_or_default(),
                                    new: f.new.clone().unwrap_or_default(),
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
            rendered: self.render(),
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.has_changes() {
            return writeln!(
                f,
                "No changes: {} service(s) up to date (version {}).",
                self.services.len(),
                self.new_version
            );
        }
        for s in &self.services {
            let sign = match s.change {
                Change::Unchanged => continue,
                Change::Added => '+',
                Change::Removed => '-',
                Change::Changed => '~',
            };
            writeln!(f, "{sign} service {}", s.service)?;
            for r in &s.rules {
                // The settings of a whole added or removed service say nothing new.
                if r.kind == RuleKind::Service && s.change != Change::Changed {
                    continue;
                }
                let sign = match r.change {
                    Change::Unchanged => continue,
                    Change::Added => '+',
                    Change::Removed => '-',
                    Change::Changed => '~',
                };
                let kind = kind_word(r.kind);
                if r.fields.is_empty() || r.change != Change::Changed {
                    writeln!(f, "  {sign} {kind} {}", r.rule)?;
                    continue;
                }
                for field in &r.fields {
                    let show =
                        |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_string());
                    writeln!(
                        f,
                        "  ~ {kind} {}: {} {} -> {}",
                        r.rule,
                        field.field,
                        show(&field.old),
                        show(&field.new)
                    )?;
                }
            }
        }
        if !self.amplification.is_empty() {
            writeln!(
                f,
                "\nRetry amplification (attempts one call at the top of the worst path can cause; with the budgets' shares):"
            )?;
            let show = |a: &Option<Amplification>| {
                a.map_or_else(
                    || "(none)".to_string(),
                    |a| format!("{} ({})", a.worst, paths::times(a.budgeted_milli)),
                )
            };
            for c in &self.amplification {
                writeln!(
                    f,
                    "  ~ {}: {} -> {} via {}",
                    c.service,
                    show(&c.old),
                    show(&c.new),
                    c.path.join(" -> ")
                )?;
            }
        }
        writeln!(
            f,
            "\nPlan: {} service(s) to add, {} to change, {} to remove.",
            self.count(Change::Added),
            self.count(Change::Changed),
            self.count(Change::Removed)
        )
    }
}

/// The kind's word in a plan: its keyword, and `settings` for a service's own.
fn kind_word(k: RuleKind) -> &'static str {
    match k {
        RuleKind::Service => "settings",
        k => k.word(),
    }
}

/// A kind in `-o json`: its word (`bulkhead`, `service`, ...).
fn kind_word_ser<S: serde::Serializer>(k: &RuleKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(k.word())
}

/// Where a part of a service is listed: its settings, its matches, its
/// rules (of every kind, by kind), then its lifecycle blocks.
fn section(k: RuleKind) -> u8 {
    match k {
        RuleKind::Service => 0,
        RuleKind::Match => 1,
        RuleKind::Warmup => 3,
        RuleKind::Shutdown => 4,
        _ => 2,
    }
}

// === Flattening ===

/// One comparable part of a service: its kind, name and readable fields.
type Item = (RuleKind, String, Vec<(String, String)>);

fn diff_items(old: Vec<Item>, new: Vec<Item>) -> Vec<RuleChange> {
    let mut out = Vec::new();
    let find = |items: &[Item], k: RuleKind, n: &str| {
        items
            .iter()
            .position(|(kind, name, _)| *kind == k && name == n)
    };
    for (kind, name, fields) in &old {
        match find(&new, *kind, name) {
            None => out.push(RuleChange {
                kind: *kind,
                rule: name.clone(),
                change: Change::Removed,
                fields: Vec::new(),
            }),
            Some(j) => {
                let changes = diff_fields(fields, &new[j].2);
                if !changes.is_empty() {
                    out.push(RuleChange {
                        kind: *kind,
                        rule: name.clone(),
                        change: Change::Changed,
                        fields: changes,
                    });
                }
            }
        }
    }
    for (kind, name, _) in &new {
        if find(&old, *kind, name).is_none() {
            out.push(RuleChange {
                kind: *kind,
                rule: name.clone(),
                change: Change::Added,
                fields: Vec::new(),
            });
        }
    }
    out.sort_by(|a, b| (section(a.kind), a.kind, &a.rule).cmp(&(section(b.kind), b.kind, &b.rule)));
    out
}

fn diff_fields(old: &[(String, String)], new: &[(String, String)]) -> Vec<FieldChange> {
    let get =
        |v: &[(String, String)], k: &str| v.iter().find(|(f, _)| f == k).map(|(_, x)| x.clone());
    let mut keys: Vec<&String> = old.iter().map(|(k, _)| k).collect();
    keys.extend(
        new.iter()
            .map(|(k, _)| k)
            .filter(|k| !old.iter().any(|(o, _)| o == *k)),
    );
    keys.into_iter()
        .filter_map(|k| {
            let (o, n) = (get(old, k), get(new, k));
            (o != n).then(|| FieldChange {
                field: k.clone(),
                old: o,
                new: n,
            })
        })
        .collect()
}

/// A rule's mode as written (`enforce` shows as nothing: the default).
fn mode_text(r: &pb::Rule) -> String {
    match (r.mode(), r.stamp_would_reject) {
        (pb::Mode::Shadow, true) => "shadow stamp".into(),
        (pb::Mode::Shadow, false) => "shadow".into(),
        _ => String::new(),
    }
}

/// When a rule expires: its instant (UTC) and the `for` it came from;
/// `for D` alone before an apply anchored it; nothing when it never does.
pub fn expiry_text(r: &pb::Rule) -> String {
    let at = gov_common::instant::Utc(r.expires_at_unix_ms);
    match (r.expires_at_unix_ms, r.for_ms) {
        (0, 0) => String::new(),
        (0, d) => format!("for {} from the apply", fmt_ms(d)),
        (_, 0) => at.to_string(),
        (_, d) => format!("{at} (for {})", fmt_ms(d)),
    }
}

fn items(t: &pb::TargetConfig) -> Vec<Item> {
    let mut out = Vec::new();
    let mut settings = Vec::new();
    push(&mut settings, "domain", quoted(&t.domain));
    push(&mut settings, "consumer_header", quoted(&t.consumer_header));
    let source = if t.consumer_source.is_some() {
        gov_proto::compiled::consumer_source_words(t)
    } else {
        String::new()
    };
    push(&mut settings, "consumer from", source);
    push(&mut settings, "registry", t.registry.clone());
    push(&mut settings, "paths", paths_word(t.paths));
    crate::outlier::fields(t, &mut settings);
    out.push((RuleKind::Service, t.service.clone(), settings));
    for m in &t.matches {
        let mut f = vec![("expr".to_string(), expr_opt(m.expr.as_ref()))];
        if m.latency_ms != 0 {
            f.push(("latency".to_string(), fmt_ms(m.latency_ms)));
        }
        out.push((RuleKind::Match, format!("{}/{}", t.service, m.name), f));
    }
    for r in &t.rules {
        let mut f = Vec::new();
        push(&mut f, "on", expr_opt(r.on.as_ref()));
        push(&mut f, "mode", mode_text(r));
        push(&mut f, "expires", expiry_text(r));
        if let Some(spec) = &r.spec
            && let Some(kind) = crate::kind::of_spec(spec)
        {
            kind.fields(spec, &mut f);
        }
        out.push((r.kind(), r.name.clone(), f));
    }
    if let Some(w) = &t.warmup {
        let f = w
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("step {}", i + 1), warmup_text(s)))
            .collect();
        out.push((RuleKind::Warmup, format!("{}/warmup", t.service), f));
    }
    if let Some(s) = &t.shutdown {
        let f = s
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("step {}", i + 1), shutdown_text(s)))
            .collect();
        out.push((RuleKind::Shutdown, format!("{}/shutdown", t.service), f));
    }
    out
}

/// The word of a service's `paths`; empty for the default, as a service without
/// the statement shows.
fn paths_word(value: i32) -> String {
    match Reading::from_wire(value) {
        Some(reading) => reading.words().join(" "),
        None => format!("unknown ({value})"),
    }
}

fn quoted(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("{s:?}")
    }
}

fn expr_opt(e: Option<&pb::MatchExpr>) -> String {
    e.map(|e| expr_text(e, false)).unwrap_or_default()
}

/// A match expression in `.gov` syntax; `nested` adds parentheses around
/// an `or` inside an `and`.
pub fn expr_text(e: &pb::MatchExpr, nested: bool) -> String {
    use pb::match_expr::Kind;
    match &e.kind {
        None | Some(Kind::Any(_)) => "any".to_string(),
        Some(Kind::Path(p)) => {
            let kind = if p.kind() == pb::PathKind::Exact {
                "exact"
            } else {
                "prefix"
            };
            format!("path {kind} {:?}", p.value)
        }
        Some(Kind::Method(m)) => format!("method {m}"),
        Some(Kind::Header(h)) => format!("header {:?} = {:?}", h.name, h.value),
        Some(Kind::Consumer(c)) => format!("consumer {c:?}"),
        Some(Kind::CallsTo(s)) => format!("calls to {s}"),
        Some(Kind::And(l)) => l
            .exprs
            .iter()
            .map(|x| expr_text(x, true))
            .collect::<Vec<_>>()
            .join(" and "),
        Some(Kind::Or(l)) => {
            let s = l
                .exprs
                .iter()
                .map(|x| expr_text(x, false))
                .collect::<Vec<_>>()
                .join(" or ");
            if nested { format!("({s})") } else { s }
        }
    }
}

fn action_text(a: Option<&pb::Action>) -> String {
    match a.and_then(|a| a.kind.as_ref()) {
        Some(pb::action::Kind::Http(h)) => format!("http {} {:?}", h.method, h.path),
        Some(pb::action::Kind::Signal(s)) => format!("signal {s}"),
        None => String::new(),
    }
}

fn warmup_text(s: &pb::WarmupStep) -> String {
    use pb::warmup_step::Step;
    match &s.step {
        Some(Step::Ready(r)) => {
            let probe = r
                .probe
                .as_ref()
                .map(|p| format!("http {} {:?}", p.method, p.path))
                .unwrap_or_default();
            let mut s = format!(
                "ready when {probe} is {} every {}",
                r.status,
                fmt_ms(r.every_ms)
            );
            if r.after_ms != 0 {
                let _ = write!(s, " after {}", fmt_ms(r.after_ms));
            }
            // The compiler writes the period when the text gives no timeout.
            if r.timeout_ms != gov_proto::compiled::probe_timeout_ms(r.every_ms) {
                let _ = write!(s, " timeout {}", fmt_ms(r.timeout_ms));
            }
            s
        }
        Some(Step::Register(_)) => "register".to_string(),
        Some(Step::Ramp(r)) => format!(
            "ramp {} from {}",
            fmt_ms(r.over_ms),
            fmt_milli_percent(i64::from(r.from_milli_percent))
        ),
        Some(Step::Start(i)) => format!("start {} via {}", i.what, action_text(i.action.as_ref())),
        None => String::new(),
    }
}

fn shutdown_text(s: &pb::ShutdownStep) -> String {
    use pb::shutdown_step::Step;
    match &s.step {
        Some(Step::Deregister(_)) => "deregister".to_string(),
        Some(Step::Wait(w)) if !w.registry.is_empty() => {
            format!("wait for {} ({})", w.registry, fmt_ms(w.duration_ms))
        }
        Some(Step::Wait(w)) => format!("wait {}", fmt_ms(w.duration_ms)),
        Some(Step::Stop(i)) => format!("stop {} via {}", i.what, action_text(i.action.as_ref())),
        Some(Step::DrainMs(ms)) => format!("drain {}", fmt_ms(*ms)),
        Some(Step::WaitForGov(w)) => format!("wait for gov (at most {})", fmt_ms(w.timeout_ms)),
        None => String::new(),
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::Unchanged => "unchanged",
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Changed => "changed",
        })
    }
}
