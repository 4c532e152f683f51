//! `govc apply FILE...`: plan the policy against `govd` (a dry run), show the
//! plan (a removed service called out), ask for confirmation, then send it:
//! `govd` compiles it, pushes the changed configs and waits (bounded) for
//! every connected agent of a changed service to ACK or NACK. Prints the
//! outcome per service and agent.
//!
//! As with `terraform apply`, only `yes` on a terminal confirms;
//! `--auto-approve` skips the question and is required when standard input is
//! not a terminal (a script must say it means it).
//!
//! Exit codes: 0 applied and every connected agent SYNCED (or nothing to
//! change), 1 invalid policy, control plane error, declined, any NACK or any
//! agent still STALE when the wait ends (unless `--wait 0s`), 64 usage
//! (including no terminal and no `--auto-approve`). An agent UNSAVED (it
//! enforces the config but could not save it in its state directory) leaves
//! the exit code 0 with a warning on stderr: the config is in force
//! everywhere, and applying again cannot fix a full disk (the same apply
//! changes nothing); `govc status` and govd's `/metrics` keep showing it
//! until the agent saves a config again.
//!
//! [`plan_remote`] is `govc plan FILE...` against the live control plane (a
//! dry-run apply).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use gov_common::flag::parse_duration;
use gov_proto::v1 as pb;

use crate::input;
use crate::remote::{self, RemoteArgs, WireDiagnostic, sync_name};
use crate::report::{ReportArgs, Reporter};

/// Apply policy files through the control plane and wait for the agents.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy files (together: the whole policy), or one plan saved by
    /// `govc plan FILE... --out PLAN`: applied as planned, without a
    /// question, and refused if another version was applied since.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    #[command(flatten)]
    pub remote: RemoteArgs,

    /// How long to wait for every connected agent of a changed service to ACK or
    /// NACK (`10s`, `500ms`; `0s` does not wait).
    #[arg(long, env = "GOV_WAIT", default_value = "10s", value_parser = parse_duration)]
    pub wait: Duration,

    /// Who applies, for the audit log of a govd without tokens (`--insecure`),
    /// where it is recorded as unverified. Default: `$USER`. With tokens,
    /// govd records the token's name instead.
    #[arg(long, env = "GOV_WHO")]
    pub who: Option<String>,

    /// Apply without asking. Required when standard input is not a terminal.
    #[arg(long)]
    pub auto_approve: bool,

    /// Put every rule of this apply in mode shadow, whatever its `mode`
    /// says: evaluated with its own state, it rejects and delays nothing and
    /// counts what it would have rejected. The audit log records it. Apply
    /// again without `--shadow` to enforce (the rules keep their state).
    #[arg(long)]
    pub shadow: bool,

    /// Apply a policy with no service although services are in force: it
    /// removes every rule from every agent. Without it govc and govd refuse
    /// such an apply (an empty or wrong file is the usual cause).
    #[arg(long)]
    pub remove_all_services: bool,

    /// `text` for people; `json` prints only the result (version, plan,
    /// each agent's outcome) as one JSON object, and needs --auto-approve
    /// or a saved plan.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
    pub output: Output,

    #[command(flatten)]
    pub canary: crate::cmd::canary::CanaryArgs,

    #[command(flatten)]
    pub report: ReportArgs,
}

/// How `govc apply` prints its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// One apply as `govc apply`, a saved plan and `govc rollback` make it.
pub(crate) struct Flow<'a> {
    pub remote: &'a RemoteArgs,
    pub report: &'a ReportArgs,
    pub wait: Duration,
    pub who: String,
    pub auto_approve: bool,
    pub shadow: bool,
    pub remove_all_services: bool,
    pub json: bool,
    /// A saved plan's version (or [`NOTHING_APPLIED`]); empty: any.
    pub expect_version: String,
    /// `govc rollback`'s version.
    pub rollback_to: String,
    /// `--canary`.
    pub canary: Option<pb::CanarySpec>,
}

/// A saved plan's `planned_against` when nothing was applied yet.
pub const NOTHING_APPLIED: &str = "(none)";

pub fn run(args: Args) -> ExitCode {
    let (files, saved) = match read_input(&args.files) {
        Ok(input) => input,
        Err(code) => return code,
    };
    let flow = Flow {
        remote: &args.remote,
        report: &args.report,
        wait: args.wait,
        who: args.who.clone().unwrap_or_else(who_am_i),
        // A saved plan was reviewed when it was made (as terraform's).
        auto_approve: args.auto_approve || saved.is_some(),
        shadow: args.shadow,
        remove_all_services: args.remove_all_services,
        json: args.output == Output::Json,
        expect_version: saved.map(|s| s.planned_against).unwrap_or_default(),
        rollback_to: String::new(),
        canary: args.canary.spec(),
    };
    apply_files(&files, &flow)
}

/// Plans `files` against govd, shows the plan, asks (unless approved),
/// applies and prints each agent's outcome.
pub(crate) fn apply_files(files: &[(String, String)], flow: &Flow<'_>) -> ExitCode {
    let reporter = Reporter::new(flow.report.error_format);
    let wait_ms = u32::try_from(flow.wait.as_millis()).unwrap_or(u32::MAX);
    let request = |dry_run: bool| pb::ApplyRequest {
        sources: files
            .iter()
            .map(|(name, text)| pb::SourceFile {
                name: name.clone(),
                text: text.clone(),
            })
            .collect(),
        dry_run,
        wait_ms: if dry_run { 0 } else { wait_ms },
        who: flow.who.clone(),
        shadow: flow.shadow,
        allow_remove_all: flow.remove_all_services,
        expect_version: flow.expect_version.clone(),
        rollback_to: flow.rollback_to.clone(),
        canary: if dry_run { None } else { flow.canary },
    };
    if flow.json && !flow.auto_approve {
        gov_common::errln!(
            "error: `-o json` prints only the result, so nobody could confirm the plan: add --auto-approve (or apply a saved plan)"
        );
        return ExitCode::from(crate::EXIT_USAGE);
    }
    let invalid = |diagnostics: &[pb::Diagnostic]| {
        print_diagnostics(&reporter, diagnostics, files).then(|| {
            gov_common::errln!("error: the policy is invalid; the control plane applied nothing");
            ExitCode::FAILURE
        })
    };

    // 1. The plan, as `govc plan` shows it.
    let planned = match call_apply(flow.remote, request(true)) {
        Ok(r) => r,
        Err(e) => return remote::fail(e),
    };
    if let Some(code) = invalid(&planned.diagnostics) {
        return code;
    }
    let plan = planned.plan.clone().unwrap_or_default();
    if flow.shadow && !flow.json {
        gov_common::outln!(
            "Shadow apply (--shadow): every rule below is in mode shadow; it rejects and delays nothing and counts what it would have rejected (`govc status`).\n"
        );
    }
    if !flow.json {
        print_plan(&plan);
    }
    if plan.services.is_empty() {
        if flow.json {
            return print_json(&planned);
        }
        gov_common::outln!(
            "\nNo changes: version {} is already applied.",
            short(&planned.version)
        );
        return ExitCode::SUCCESS;
    }

    if !flow.remove_all_services
        && planned
            .diagnostics
            .iter()
            .any(|d| d.code == "gov::govd::removes_every_service")
    {
        gov_common::errln!("error: not applying: the policy removes every service (warning above)");
        return ExitCode::FAILURE;
    }

    // 2. Confirmation.
    if !flow.auto_approve
        && let Err(code) = confirm()
    {
        return code;
    }

    // 3. The apply itself.
    let result = match call_apply(flow.remote, request(false)) {
        Ok(r) => r,
        Err(e) => return remote::fail(e),
    };
    if let Some(code) = invalid(&result.diagnostics) {
        return code;
    }
    if let Some(applied) = &result.plan
        && applied.rendered != plan.rendered
        && !flow.json
    {
        // Someone applied in between: say what this apply really changed.
        gov_common::outln!(
            "\nThe policy in force changed since the plan above; this apply changed:"
        );
        print_plan(applied);
    }
    if flow.json {
        let code = outcome(&result, flow.wait, false);
        print_json(&result);
        return code;
    }
    if !result.applied {
        gov_common::outln!(
            "\nNo changes: version {} is already applied.",
            short(&result.version)
        );
        return ExitCode::SUCCESS;
    }
    if let Some(canary) = &result.canary {
        crate::cmd::canary::print_started(canary);
    } else {
        gov_common::outln!("\nApplied version {}.", short(&result.version));
    }
    outcome(&result, flow.wait, true)
}

/// Asks on the terminal whether to apply the plan shown; only `yes` does.
fn confirm() -> Result<(), ExitCode> {
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        gov_common::errln!(
            "error: not applying: standard input is not a terminal, so nobody can confirm the plan above\n  help: review it (`govc plan` shows it too), then run the command again with --auto-approve"
        );
        return Err(ExitCode::from(crate::EXIT_USAGE));
    }
    gov_common::out!("\nDo you want to apply this plan? Only `yes` applies it.\n  Enter a value: ");
    // The question has no newline: flush it before waiting for the answer.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let mut answer = String::new();
    if std::io::stdin().read_line(&mut answer).is_err() || answer.trim() != "yes" {
        gov_common::errln!("Apply cancelled: nothing was sent.");
        return Err(ExitCode::FAILURE);
    }
    Ok(())
}

/// Prints a plan and calls out the services it removes: their agents lose
/// their config (a policy applied from a file that lacks a service someone
/// else applied removes it).
fn print_plan(plan: &pb::Plan) {
    gov_common::out!("{}", plan.rendered);
    if !plan.rendered.ends_with('\n') {
        gov_common::outln!();
    }
    let removed: Vec<&str> = plan
        .services
        .iter()
        .filter(|s| s.change() == pb::Change::Removed)
        .map(|s| s.service.as_str())
        .collect();
    if !removed.is_empty() {
        gov_common::outln!(
            "\nWARNING: this removes {} {}: every rule of {} goes, and {} agents enforce nothing.",
            if removed.len() == 1 {
                "service"
            } else {
                "services"
            },
            removed.join(", "),
            if removed.len() == 1 { "it" } else { "them" },
            if removed.len() == 1 { "its" } else { "their" },
        );
    }
}

/// Prints `result` as JSON on standard output.
fn print_json(result: &pb::ApplyResult) -> ExitCode {
    match serde_json::to_string_pretty(result) {
        Ok(json) => {
            gov_common::outln!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            gov_common::errln!("error: cannot encode the result as JSON: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the per-agent outcome (the table only when `table`) and chooses
/// the exit code.
fn outcome(result: &pb::ApplyResult, wait: Duration, table: bool) -> ExitCode {
    let changed: Vec<&pb::ServicePlan> = result
        .plan
        .as_ref()
        .map(|p| p.services.iter().collect())
        .unwrap_or_default();
    let mut rows = vec![vec![
        "SERVICE".into(),
        "INSTANCE".into(),
        "STATE".into(),
        "VERSION".into(),
        "DETAIL".into(),
    ]];
    let (mut synced, mut unsaved, mut nacked, mut stale, mut gone) = (0, 0, 0, 0, 0);
    for o in &result.outcomes {
        let state = o.state();
        let detail = match state {
            // The agent's reason usually names the rule already (`rule `x`: ...`).
            pb::SyncState::Nacked if !o.rule.is_empty() && !o.error.contains(&o.rule) => {
                format!("rule {}: {}", o.rule, o.error)
            }
            pb::SyncState::Nacked => o.error.clone(),
            pb::SyncState::Unsaved => unsaved_detail(&o.error),
            pb::SyncState::Stale => format!(
                "no answer within {}",
                remote::human_ms(wait.as_millis() as u64)
            ),
            pb::SyncState::Disconnected => "gets it when it reconnects".into(),
            _ => String::new(),
        };
        match state {
            pb::SyncState::Synced => synced += 1,
            pb::SyncState::Unsaved => unsaved += 1,
            pb::SyncState::Nacked => nacked += 1,
            pb::SyncState::Disconnected => gone += 1,
            _ => stale += 1,
        }
        rows.push(vec![
            o.service.clone(),
            o.instance.clone(),
            sync_name(state).into(),
            short(&o.version),
            detail,
        ]);
    }
    for s in &changed {
        if !result.outcomes.iter().any(|o| o.service == s.service)
            && s.change() != pb::Change::Removed
        {
            rows.push(vec![
                s.service.clone(),
                "-".into(),
                "NO AGENTS".into(),
                "-".into(),
                "no agent is connected".into(),
            ]);
        }
    }
    if rows.len() > 1 && table {
        gov_common::out!("{}", remote::table(&rows));
    }
    // `unsaved` only when there are some: the line scripts read stays as it was.
    let unsaved_count = if unsaved > 0 {
        format!(", {unsaved} unsaved")
    } else {
        String::new()
    };
    if table {
        gov_common::outln!(
            "{synced} synced{unsaved_count}, {nacked} nacked, {stale} stale, {gone} disconnected."
        );
    }
    if unsaved > 0 {
        gov_common::errln!(
            "warning: {unsaved} agent(s) enforce the config but could not save it in their --state-dir (see DETAIL): a restart while govd is unreachable takes them back to their last saved config\n  help: make room in their state directory; the next config govd sends them (a new apply, or their next connection to govd) is saved"
        );
    }
    if nacked > 0 {
        gov_common::errln!(
            "error: {nacked} agent(s) refused the config and keep enforcing their previous one; fix the rule(s) above and apply again"
        );
        return ExitCode::FAILURE;
    }
    if stale > 0 && wait.is_zero() {
        // `--wait 0s`: the caller chose not to wait; STALE is expected.
        gov_common::errln!(
            "note: not waiting (--wait 0s); `govc status` shows whether the agents took it"
        );
    } else if stale > 0 {
        gov_common::errln!(
            "error: {stale} agent(s) did not answer in time; `govc status` shows their state"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The DETAIL of an UNSAVED agent in `govc apply` and `govc status`.
pub fn unsaved_detail(reason: &str) -> String {
    format!("not saved, lost on restart: {reason}")
}

/// `govc plan FILE...` against the live control plane: the difference
/// between what `govd` has applied and these files. Exit codes like
/// `govc plan`: 0 no change (or changes without `detailed_exitcode`),
/// 1 error, 2 changes with `detailed_exitcode`.
pub fn plan_remote(
    files: &[PathBuf],
    remote: &RemoteArgs,
    report: &ReportArgs,
    detailed_exitcode: bool,
    out: Option<&std::path::Path>,
) -> ExitCode {
    let files = match read_files(files) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let reporter = Reporter::new(report.error_format);
    let request = pb::ApplyRequest {
        sources: files
            .iter()
            .map(|(name, text)| pb::SourceFile {
                name: name.clone(),
                text: text.clone(),
            })
            .collect(),
        dry_run: true,
        wait_ms: 0,
        who: who_am_i(),
        shadow: false,
        allow_remove_all: false,
        expect_version: String::new(),
        rollback_to: String::new(),
        canary: None,
    };
    let result = match call_apply(remote, request) {
        Ok(r) => r,
        Err(e) => return remote::fail(e),
    };
    if print_diagnostics(&reporter, &result.diagnostics, &files) {
        return ExitCode::FAILURE;
    }
    let plan = result.plan.unwrap_or_default();
    gov_common::out!("{}", plan.rendered);
    if !plan.rendered.ends_with('\n') {
        gov_common::outln!();
    }
    if let Some(out) = out {
        let saved = crate::cmd::saved::SavedPlan {
            gov_plan: crate::cmd::saved::FORMAT,
            planned_against: if result.version.is_empty() {
                NOTHING_APPLIED.to_owned()
            } else {
                result.version.clone()
            },
            plan: plan.rendered.clone(),
            sources: files
                .into_iter()
                .map(|(name, text)| crate::cmd::saved::Source { name, text })
                .collect(),
        };
        if let Err(e) = crate::cmd::saved::write(out, &saved) {
            gov_common::errln!("error: {e}");
            return ExitCode::FAILURE;
        }
        gov_common::outln!(
            "\nSaved this plan to {}: `govc apply {}` applies it as planned, and is refused if another version is applied first.",
            out.display(),
            out.display()
        );
    }
    if detailed_exitcode && !plan.services.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

fn call_apply(
    remote: &RemoteArgs,
    request: pb::ApplyRequest,
) -> Result<pb::ApplyResult, remote::RemoteError> {
    remote::block_on(async {
        let mut client = remote.connect().await?;
        let request = remote.request(request)?;
        client
            .apply(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| remote.status(s))
    })?
}

/// Prints every diagnostic; true when one is an error.
fn print_diagnostics(
    reporter: &Reporter,
    diagnostics: &[pb::Diagnostic],
    files: &[(String, String)],
) -> bool {
    let reports: Vec<miette::Report> = diagnostics
        .iter()
        .map(|d| miette::Report::new(WireDiagnostic::new(d, files)))
        .collect();
    reporter.emit(&reports).errors > 0
}

/// Policy files as (name, text).
type Files = Vec<(String, String)>;

/// The policy files of `paths`, or the sources of the one saved plan.
fn read_input(
    paths: &[PathBuf],
) -> Result<(Files, Option<crate::cmd::saved::SavedPlan>), ExitCode> {
    if let [path] = paths
        && path.is_file()
    {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        match crate::cmd::saved::parse(path, &text) {
            None => {}
            Some(Err(e)) => {
                gov_common::errln!("error: {e}");
                return Err(ExitCode::FAILURE);
            }
            Some(Ok(mut saved)) => {
                let sources = std::mem::take(&mut saved.sources)
                    .into_iter()
                    .map(|s| (s.name, s.text))
                    .collect();
                return Ok((sources, Some(saved)));
            }
        }
    }
    Ok((read_files(paths)?, None))
}

fn read_files(paths: &[PathBuf]) -> Result<Vec<(String, String)>, ExitCode> {
    let (paths, errors) = input::expand(paths);
    if let Some(e) = errors.into_iter().next() {
        return Err(remote::fail(e));
    }
    let mut files = Vec::new();
    for path in &paths {
        match input::read_policy(path) {
            Ok(text) => files.push((input::display_name(path), text)),
            Err(e) => return Err(remote::fail(e)),
        }
    }
    Ok(files)
}

pub(crate) fn who_am_i() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The first 12 characters of a version, as people quote them.
pub fn short(version: &str) -> String {
    if version.is_empty() {
        "-".into()
    } else {
        version.chars().take(12).collect()
    }
}
