//! `govc check FILE...`: parse every file and print every diagnostic.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::input;
use crate::report::{ReportArgs, Reporter};

/// Check policy files for errors.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy files.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    #[command(flatten)]
    pub report: ReportArgs,

    /// Exit 1 on warnings as well as errors.
    #[arg(long, env = "GOV_DENY_WARNINGS")]
    pub deny_warnings: bool,
}

pub fn run(args: Args) -> ExitCode {
    let reporter = Reporter::new(args.report.error_format);
    let mut diagnostics = Vec::new();
    for path in &args.files {
        let name = input::display_name(path);
        match input::read_policy(path) {
            Ok(src) => {
                if let Err(e) = gov_lang::parse(&name, &src) {
                    diagnostics.push(miette::Report::new(e));
                }
            }
            Err(e) => diagnostics.push(miette::Report::new(e)),
        }
    }
    reporter.emit(&diagnostics).exit_code(args.deny_warnings)
}
