//! `govc replay POLICY... --log FILE... [--service S] [--against OLD...] [-o json]`:
//! what a policy would have done to recorded traffic.
//!
//! The policy is compiled with the real compiler and its configs run in the
//! agents' own engine over the calls of `gov-agent --decision-log` files, in
//! virtual time ([`sim`]): one engine per recorded agent (`service`,
//! `instance`), as each agent counts its own windows. Per rule it prints the
//! calls it decided, admitted and rejected by consumer, fuse trips and
//! releases and limit latches with their times, an adaptive bulkhead's
//! limit over time ([`timeline`]), and how many calls were decided as they
//! were live. With `--against OLD`, the same calls under the
//! OLD policy too, and what changes: the extra rejections by rule and
//! consumer, and the calls no longer rejected.
//!
//! Exit codes: 0 replayed, 1 errors (a policy that does not compile, a bad
//! log line, an unknown service), 64 usage.

mod calls;
mod sim;
mod timeline;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use gov_engine::{EventKind, RejectReason};
use gov_proto::v1::TargetConfig;
use serde::Serialize;

use self::calls::{Calls, Live, NONE};
use self::sim::{Got, Outcomes};
use crate::cmd::compile::{emit, read_sources};
use crate::report::{Output, ReportArgs, Reporter};

/// Run a policy over recorded calls and show what it would have decided
/// (and where an adaptive bulkhead's limit would have moved).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy files to replay (together: the whole policy).
    #[arg(required = true, value_name = "POLICY")]
    pub files: Vec<PathBuf>,

    /// Decision log files written by `gov-agent --decision-log` (rotated
    /// files too, in any order: calls are replayed by their time).
    #[arg(long, required = true, num_args = 1.., value_name = "FILE")]
    pub log: Vec<PathBuf>,

    /// Replay only the calls of this service.
    #[arg(long, short = 's', value_name = "NAME")]
    pub service: Option<String>,

    /// Another policy (the one in force, say) to compare with: what changes
    /// going from OLD to POLICY.
    #[arg(long, num_args = 1.., value_name = "OLD")]
    pub against: Vec<PathBuf>,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
    pub output: Output,

    #[command(flatten)]
    pub report: ReportArgs,
}

/// Why a replay cannot run.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
enum ReplayError {
    #[error("no service `{name}` in the policy")]
    #[diagnostic(code("gov::unknown-service"), help("{help}"))]
    UnknownService { name: String, help: String },
    #[error("the logs have calls of service `{name}`, which the policy does not define")]
    #[diagnostic(code("gov::replay::unknown-service"), help("{help}"))]
    ServiceNotInPolicy { name: String, help: String },
    #[error("no calls to replay in the logs{}", for_service(.service))]
    #[diagnostic(
        code("gov::replay::no-calls"),
        help("start the agent with --decision-log PATH and give --log that file")
    )]
    NoCalls { service: Option<String> },
    #[error("the policy's config of `{service}` is refused by the engine: {message}")]
    #[diagnostic(code("gov::replay::invalid-config"))]
    InvalidConfig { service: String, message: String },
    #[error("cannot encode the replay as JSON: {0}")]
    #[diagnostic(code("gov::encode"))]
    Encode(String),
}

fn for_service(service: &Option<String>) -> String {
    service
        .as_ref()
        .map(|s| format!(" for service `{s}`"))
        .unwrap_or_default()
}

/// The replay of one policy.
#[derive(Debug, Default, Serialize)]
pub struct PolicyReport {
    pub policy: Vec<String>,
    pub calls: u64,
    pub admitted: u64,
    pub rejected: u64,
    /// Calls this policy decided as the live agent did (admitted, or
    /// rejected by the same rule for the same reason).
    pub as_recorded: u64,
    /// Calls the live agent rejected and this policy admits: their end is
    /// not known, so they end at once without an outcome.
    pub unknown_end: u64,
    pub rules: Vec<RuleReport>,
}

/// One rule in a replay.
#[derive(Debug, Default, Serialize)]
pub struct RuleReport {
    pub rule: String,
    pub kind: String,
    /// Calls the rule decided (admitted or rejected).
    pub matched: u64,
    pub admitted: u64,
    /// Of `admitted`, calls that waited for a permit or a shaping delay.
    pub waited: u64,
    pub rejected: u64,
    pub consumers: Vec<ConsumerRow>,
    /// Fuse trips, half-opens and releases, limit latches and releases, in time order.
    pub events: Vec<EventRow>,
    /// An adaptive bulkhead: its limit over the replay, per agent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limit: Vec<timeline::LimitTimeline>,
}

/// A rule's decisions for one consumer (`null`: calls without one).
#[derive(Debug, Default, Serialize)]
pub struct ConsumerRow {
    pub consumer: Option<String>,
    pub admitted: u64,
    pub rejected: u64,
    pub reasons: BTreeMap<String, u64>,
}

/// A state change of a rule.
#[derive(Debug, Serialize)]
pub struct EventRow {
    /// Unix time in microseconds (the log's clock).
    pub at_us: u64,
    pub instance: String,
    /// `fuse_tripped`, `fuse_half_open`, `fuse_released`, `limit_engaged`, `limit_released`.
    pub event: &'static str,
    /// The latched key (a consumer), if any.
    pub key: String,
    pub reason: String,
}

/// Calls whose decision changes from OLD to POLICY.
#[derive(Debug, Default, Serialize)]
pub struct Change {
    /// Admitted under OLD, rejected under POLICY: by (rule, consumer).
    pub extra_rejections: Vec<ChangeRow>,
    /// Rejected under OLD, admitted under POLICY: by (OLD's rule, consumer).
    pub fewer_rejections: Vec<ChangeRow>,
}

#[derive(Debug, Serialize)]
pub struct ChangeRow {
    pub rule: String,
    pub consumer: Option<String>,
    pub calls: u64,
}

/// What `-o json` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    pub calls: u64,
    pub from_us: u64,
    pub to_us: u64,
    /// The recorded agents, `service/instance`.
    pub agents: Vec<String>,
    pub replay: PolicyReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<PolicyReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

pub fn run(args: Args) -> ExitCode {
    let reporter = Reporter::new(args.report.error_format);
    let fail = |e: &dyn miette::Diagnostic| {
        gov_common::err!("{}", reporter.render(e));
        ExitCode::FAILURE
    };
    let Some(policy) = compile(&args.files, &reporter) else {
        return ExitCode::FAILURE;
    };
    let old = if args.against.is_empty() {
        None
    } else {
        match compile(&args.against, &reporter) {
            Some(old) => Some(old),
            None => return ExitCode::FAILURE,
        }
    };
    if let Some(name) = &args.service
        && !policy.iter().any(|t| &t.service == name)
    {
        return fail(&ReplayError::UnknownService {
            name: name.clone(),
            help: known_services(&policy),
        });
    }
    let mut calls = Calls::default();
    for path in &args.log {
        if let Err(e) = calls.read(path, args.service.as_deref()) {
            return fail(&e);
        }
    }
    if calls.list.is_empty() {
        return fail(&ReplayError::NoCalls {
            service: args.service.clone(),
        });
    }
    for agent in &calls.agents {
        let missing = |p: &[TargetConfig]| !p.iter().any(|t| t.service == agent.service);
        if missing(&policy) || old.as_deref().is_some_and(missing) {
            return fail(&ReplayError::ServiceNotInPolicy {
                name: agent.service.clone(),
                help: format!(
                    "{}; pass --service to replay one of them",
                    known_services(&policy)
                ),
            });
        }
    }
    let report = match build(&args, &policy, old.as_deref(), &calls) {
        Ok(report) => report,
        Err(e) => return fail(&e),
    };
    match args.output {
        Output::Json => match serde_json::to_string_pretty(&report) {
            Ok(text) => gov_common::out!("{text}\n"),
            Err(e) => return fail(&ReplayError::Encode(e.to_string())),
        },
        Output::Text => gov_common::out!("{}", text(&report)),
    }
    ExitCode::SUCCESS
}

fn compile(files: &[PathBuf], reporter: &Reporter) -> Option<Vec<TargetConfig>> {
    let sources = read_sources(files, reporter)?;
    match gov_compiler::compile(&sources) {
        Ok(compiled) => {
            emit(reporter, compiled.warnings);
            Some(compiled.bundle.targets)
        }
        Err(diagnostics) => {
            emit(reporter, diagnostics);
            None
        }
    }
}

fn known_services(policy: &[TargetConfig]) -> String {
    if policy.is_empty() {
        return "the policy defines no service".into();
    }
    let names: Vec<String> = policy.iter().map(|t| format!("`{}`", t.service)).collect();
    format!("services in the policy: {}", names.join(", "))
}

/// Replays every recorded agent under `policy` (and `old`).
fn build(
    args: &Args,
    policy: &[TargetConfig],
    old: Option<&[TargetConfig]>,
    calls: &Calls,
) -> Result<Report, ReplayError> {
    // Each agent's calls in arrival order.
    let mut orders: Vec<Vec<usize>> = vec![Vec::new(); calls.agents.len()];
    for (i, call) in calls.list.iter().enumerate() {
        if let Some(order) = orders.get_mut(call.agent as usize) {
            order.push(i);
        }
    }
    for order in &mut orders {
        order.sort_by_key(|&i| (calls.list[i].t_us, i));
    }
    let run = |targets: &[TargetConfig]| -> Result<Vec<Outcomes>, ReplayError> {
        calls
            .agents
            .iter()
            .zip(&orders)
            .map(|(agent, order)| {
                let Some(target) = targets.iter().find(|t| t.service == agent.service) else {
                    return Ok(Outcomes::default());
                };
                sim::replay(target, calls, order, &agent.epochs).map_err(|e| {
                    ReplayError::InvalidConfig {
                        service: agent.service.clone(),
                        message: e.to_string(),
                    }
                })
            })
            .collect()
    };
    let new = run(policy)?;
    let names = |files: &[PathBuf]| files.iter().map(|f| f.display().to_string()).collect();
    let replay = summarize(names(&args.files), policy, calls, &new);
    let (against, change) = match old {
        Some(old_policy) => {
            let before = run(old_policy)?;
            let change = compare(calls, &before, &new);
            (
                Some(summarize(names(&args.against), old_policy, calls, &before)),
                Some(change),
            )
        }
        None => (None, None),
    };
    Ok(Report {
        calls: calls.list.len() as u64,
        from_us: calls.list.iter().map(|c| c.t_us).min().unwrap_or(0),
        to_us: calls
            .list
            .iter()
            // A hostile log's times may reach u64::MAX: saturate, never panic.
            .map(|c| c.t_us.saturating_add(c.latency_us))
            .max()
            .unwrap_or(0),
        agents: calls
            .agents
            .iter()
            .map(|a| format!("{}/{}", a.service, a.instance))
            .collect(),
        replay,
        against,
        change,
    })
}

fn rule_name(out: &Outcomes, rule: u32) -> &str {
    out.rules.get(rule as usize).map_or("", String::as_str)
}

fn reason_name(reason: u8) -> &'static str {
    RejectReason::ALL
        .get(usize::from(reason))
        .map_or("unknown", |r| r.as_str())
}

fn event_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::FuseTripped => "fuse_tripped",
        EventKind::FuseHalfOpen => "fuse_half_open",
        EventKind::FuseReleased => "fuse_released",
        EventKind::LimitEngaged => "limit_engaged",
        EventKind::LimitReleased => "limit_released",
    }
}

fn consumer_of(calls: &Calls, i: usize) -> Option<String> {
    let c = calls.list[i].consumer;
    (c != NONE).then(|| calls.strings.get(c).to_owned())
}

/// An empty report per rule of `targets`, with its place in source order.
fn rule_reports(targets: &[TargetConfig]) -> BTreeMap<String, (usize, RuleReport)> {
    let mut rules = BTreeMap::new();
    for t in targets {
        for r in &t.rules {
            let kind = r
                .spec
                .as_ref()
                .map_or("rule", |s| s.kind().word())
                .to_owned();
            let n = rules.len();
            rules.insert(
                r.name.clone(),
                (
                    n,
                    RuleReport {
                        rule: r.name.clone(),
                        kind,
                        ..RuleReport::default()
                    },
                ),
            );
        }
    }
    rules
}

/// Whether the replay decided call `i` as it was decided live (the same
/// rule and reason when rejected).
fn as_recorded(out: &Outcomes, calls: &Calls, i: usize, got: Got) -> bool {
    match (got, calls.list[i].live) {
        (Got::Admitted, Live::Admitted) => true,
        (
            Got::Rejected { rule, reason },
            Live::Rejected {
                rule: r,
                reason: why,
            },
        ) => {
            rule_name(out, rule) == calls.strings.get(r)
                && calls.strings.get(why) == reason_name(reason)
        }
        _ => false,
    }
}

/// The per-rule report of one policy's replay.
fn summarize(
    policy: Vec<String>,
    targets: &[TargetConfig],
    calls: &Calls,
    outcomes: &[Outcomes],
) -> PolicyReport {
    let mut report = PolicyReport {
        policy,
        ..PolicyReport::default()
    };
    let mut rules = rule_reports(targets);
    let mut consumers: BTreeMap<(String, Option<String>), ConsumerRow> = BTreeMap::new();
    for (agent, out) in calls.agents.iter().zip(outcomes) {
        report.unknown_end += out.unknown_end;
        for &(i, got) in &out.got {
            report.calls += 1;
            report.as_recorded += u64::from(as_recorded(out, calls, i, got));
            match got {
                Got::Admitted => report.admitted += 1,
                Got::Rejected { rule, reason } => {
                    report.rejected += 1;
                    let name = rule_name(out, rule).to_owned();
                    if let Some((_, r)) = rules.get_mut(&name) {
                        r.matched += 1;
                        r.rejected += 1;
                    }
                    let row = consumers.entry((name, consumer_of(calls, i))).or_default();
                    row.rejected += 1;
                    *row.reasons
                        .entry(reason_name(reason).to_owned())
                        .or_default() += 1;
                }
            }
        }
        for (i, by) in &out.admitted_by {
            for &(rule, waited) in by {
                let name = rule_name(out, rule).to_owned();
                if let Some((_, r)) = rules.get_mut(&name) {
                    r.matched += 1;
                    r.admitted += 1;
                    r.waited += u64::from(waited);
                }
                consumers
                    .entry((name, consumer_of(calls, *i)))
                    .or_default()
                    .admitted += 1;
            }
        }
        for (n, name) in out.rules.iter().enumerate() {
            let n = u32::try_from(n).unwrap_or(NONE);
            if let Some((_, r)) = rules.get_mut(name)
                && let Some(t) = timeline::timeline(out, calls, n, &agent.instance)
            {
                r.limit.push(t);
            }
        }
        for e in &out.events {
            if let Some((_, r)) = rules.get_mut(&e.rule) {
                r.events.push(EventRow {
                    at_us: e.at_us,
                    instance: agent.instance.clone(),
                    event: event_name(e.kind),
                    key: e.key.clone(),
                    reason: e.reason.clone(),
                });
            }
        }
    }
    for ((rule, consumer), mut row) in consumers {
        if let Some((_, r)) = rules.get_mut(&rule) {
            row.consumer = consumer;
            r.consumers.push(row);
        }
    }
    let mut list: Vec<(usize, RuleReport)> = rules.into_values().collect();
    list.sort_by_key(|(n, _)| *n);
    report.rules = list
        .into_iter()
        .map(|(_, mut r)| {
            r.events.sort_by_key(|e| e.at_us);
            r
        })
        .collect();
    report
}

/// The calls whose decision differs between `before` (OLD) and `after` (POLICY).
fn compare(calls: &Calls, before: &[Outcomes], after: &[Outcomes]) -> Change {
    // Per call: the decision, with the name of a rejecting rule.
    let decided = |outcomes: &[Outcomes]| {
        let mut by_call: Vec<Option<(Got, String)>> = vec![None; calls.list.len()];
        for out in outcomes {
            for &(i, got) in &out.got {
                let name = match got {
                    Got::Rejected { rule, .. } => rule_name(out, rule).to_owned(),
                    Got::Admitted => String::new(),
                };
                by_call[i] = Some((got, name));
            }
        }
        by_call
    };
    let (old, new) = (decided(before), decided(after));
    let mut extra: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
    let mut fewer: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
    for (i, (o, n)) in old.iter().zip(&new).enumerate() {
        match (o, n) {
            (Some((Got::Admitted, _)), Some((Got::Rejected { .. }, rule))) => {
                *extra
                    .entry((rule.clone(), consumer_of(calls, i)))
                    .or_default() += 1;
            }
            (Some((Got::Rejected { .. }, rule)), Some((Got::Admitted, _))) => {
                *fewer
                    .entry((rule.clone(), consumer_of(calls, i)))
                    .or_default() += 1;
            }
            _ => {}
        }
    }
    let rows = |m: BTreeMap<(String, Option<String>), u64>| {
        m.into_iter()
            .map(|((rule, consumer), calls)| ChangeRow {
                rule,
                consumer,
                calls,
            })
            .collect()
    };
    Change {
        extra_rejections: rows(extra),
        fewer_rejections: rows(fewer),
    }
}

/// `2026-12-01T08:00:00.123Z`.
fn time(unix_us: u64) -> String {
    let whole = crate::cmd::audit::rfc3339(unix_us / 1000);
    let ms = (unix_us / 1000) % 1000;
    match whole.strip_suffix('Z') {
        Some(s) => format!("{s}.{ms:03}Z"),
        None => whole,
    }
}

fn text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replayed {} calls of {} from {} to {}",
        report.calls,
        report.agents.join(", "),
        time(report.from_us),
        time(report.to_us)
    );
    policy_text(&mut out, &report.replay);
    if let Some(old) = &report.against {
        out.push('\n');
        policy_text(&mut out, old);
    }
    if let Some(change) = &report.change {
        let _ = writeln!(
            out,
            "\nfrom {} to {}:",
            join(report.against.as_ref().map(|r| &r.policy)),
            join(Some(&report.replay.policy))
        );
        if change.extra_rejections.is_empty() && change.fewer_rejections.is_empty() {
            let _ = writeln!(out, "  no call is decided otherwise");
        }
        for (sign, what, rows) in [
            ('+', "rejected", &change.extra_rejections),
            ('-', "no longer rejected", &change.fewer_rejections),
        ] {
            for row in rows {
                let _ = writeln!(
                    out,
                    "  {sign} {} calls of {} {what} by {}",
                    row.calls,
                    consumer_word(&row.consumer),
                    row.rule
                );
            }
        }
    }
    out
}

fn join(files: Option<&Vec<String>>) -> String {
    files.map(|f| f.join(" ")).unwrap_or_default()
}

fn consumer_word(c: &Option<String>) -> String {
    match c {
        Some(c) => format!("consumer `{c}`"),
        None => "no consumer".into(),
    }
}

fn policy_text(out: &mut String, r: &PolicyReport) {
    let _ = writeln!(
        out,
        "policy {}: {} admitted, {} rejected; {} of {} calls decided as recorded",
        r.policy.join(" "),
        r.admitted,
        r.rejected,
        r.as_recorded,
        r.calls
    );
    if r.unknown_end > 0 {
        let _ = writeln!(
            out,
            "  ({} calls rejected live are admitted here; their end is not in the log, so they end at once)",
            r.unknown_end
        );
    }
    for rule in &r.rules {
        let _ = writeln!(
            out,
            "  {} {}: {} matched, {} admitted{}, {} rejected",
            rule.kind,
            rule.rule,
            rule.matched,
            rule.admitted,
            if rule.waited > 0 {
                format!(" ({} after waiting)", rule.waited)
            } else {
                String::new()
            },
            rule.rejected
        );
        for c in &rule.consumers {
            let reasons: Vec<String> = c.reasons.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(
                out,
                "    {}: {} admitted, {} rejected{}",
                consumer_word(&c.consumer),
                c.admitted,
                c.rejected,
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", reasons.join(", "))
                }
            );
        }
        for e in &rule.events {
            let key = if e.key.is_empty() {
                String::new()
            } else {
                format!(" [{}]", e.key)
            };
            let _ = writeln!(
                out,
                "    {} {}{key} on {}{}",
                time(e.at_us),
                e.event,
                e.instance,
                if e.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", e.reason)
                }
            );
        }
        for t in &rule.limit {
            let start = t.intervals.first().map_or(0, |i| i.from_us);
            timeline::text(out, t, &time(start));
        }
    }
}
