//! `govc plan OLD... --against NEW...`: what would change, per service and
//! per rule, going from the policy in the OLD files to the one in the NEW
//! files. Without `--against`, the files are planned against the policy the
//! control plane has applied (a dry-run `apply`).
//!
//! ```text
//! ~ service order
//!   ~ bulkhead order/slow_calls: max_concurrent 10 -> 20
//! ```
//!
//! Exit codes (Terraform's `-detailed-exitcode`): 0 success (with
//! `--detailed-exitcode`: no change), 1 error, 2 changes (only with
//! `--detailed-exitcode`), 64 usage.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cmd::compile::{emit, read_sources};
use crate::remote::RemoteArgs;
use crate::report::{ReportArgs, Reporter};

/// Show what changes between two policies, per service and per rule.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The current policy files (with `--against`), or the proposed ones
    /// (planned against the control plane).
    #[arg(required = true, value_name = "OLD")]
    pub files: Vec<PathBuf>,

    /// The proposed policy files, compared with OLD.
    #[arg(long, num_args = 1.., value_name = "NEW")]
    pub against: Vec<PathBuf>,

    /// Exit 0 when nothing changes, 2 when something does, 1 on errors.
    #[arg(long, env = "GOV_DETAILED_EXITCODE", value_parser = clap::builder::BoolishValueParser::new())]
    pub detailed_exitcode: bool,

    /// Save the plan (against the control plane) to this file:
    /// `govc apply PLAN` then applies exactly it, and is refused if another
    /// version was applied since.
    #[arg(long, value_name = "PLAN", conflicts_with = "against")]
    pub out: Option<PathBuf>,

    /// Output format of the plan.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
    pub output: Output,

    #[command(flatten)]
    pub remote: RemoteArgs,

    #[command(flatten)]
    pub report: ReportArgs,
}

/// How the plan is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// `+`/`-`/`~` lines for people.
    Text,
    /// The plan as JSON (every service, with rule and field changes).
    Json,
}

pub fn run(args: Args) -> ExitCode {
    if args.against.is_empty() {
        return crate::cmd::apply::plan_remote(
            &args.files,
            &args.remote,
            &args.report,
            args.detailed_exitcode,
            args.out.as_deref(),
        );
    }
    let reporter = Reporter::new(args.report.error_format);
    let (Some(old), Some(new)) = (
        read_sources(&args.files, &reporter),
        read_sources(&args.against, &reporter),
    ) else {
        return ExitCode::FAILURE;
    };
    let old = match gov_compiler::compile(&old) {
        // The current policy's warnings are not news; only its errors stop.
        Ok(c) => c.bundle,
        Err(diagnostics) => {
            emit(&reporter, diagnostics);
            gov_common::errln!("error: the OLD policy does not compile");
            return ExitCode::FAILURE;
        }
    };
    let new = match gov_compiler::compile(&new) {
        Ok(c) => {
            emit(&reporter, c.warnings);
            c.bundle
        }
        Err(diagnostics) => {
            emit(&reporter, diagnostics);
            return ExitCode::FAILURE;
        }
    };
    let plan = gov_compiler::plan(&old, &new);
    match args.output {
        Output::Text => gov_common::out!("{plan}"),
        Output::Json => match serde_json::to_string_pretty(&plan) {
            Ok(json) => gov_common::outln!("{json}"),
            Err(e) => {
                gov_common::errln!("error: cannot encode the plan as json: {e}");
                return ExitCode::FAILURE;
            }
        },
    }
    if args.detailed_exitcode && plan.has_changes() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}
