//! `govc check FILE...`: parse and check every file (syntax, names, semantic
//! checks and lints of gov-compiler) and print every diagnostic.

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
    #[arg(long, env = "GOV_DENY_WARNINGS", value_parser = clap::builder::BoolishValueParser::new())]
    pub deny_warnings: bool,

    /// Check each file as a policy of its own. By default the files together
    /// are one policy, as `compile`, `plan` and `apply` see them.
    #[arg(long)]
    pub each: bool,
}

pub fn run(args: Args) -> ExitCode {
    let reporter = Reporter::new(args.report.error_format);
    let (files, errors) = input::expand(&args.files);
    let mut diagnostics: Vec<miette::Report> =
        errors.into_iter().map(miette::Report::new).collect();
    let mut sources = Vec::new();
    for path in &files {
        let name = input::display_name(path);
        match input::read_policy(path) {
            Ok(src) => sources.push(gov_compiler::SourceFile::new(name, src)),
            Err(e) => diagnostics.push(miette::Report::new(e)),
        }
    }
    // The compiler parses every file (syntax errors first), then resolves
    // names and runs every semantic check and lint.
    let policies: Vec<&[gov_compiler::SourceFile]> = if args.each {
        sources.chunks(1).collect()
    } else {
        vec![&sources]
    };
    for policy in policies {
        let checked = gov_compiler::check(policy);
        diagnostics.extend(checked.diagnostics.into_iter().map(miette::Report::new));
    }
    reporter.emit(&diagnostics).exit_code(args.deny_warnings)
}
