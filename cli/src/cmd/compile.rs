//! `govc compile FILE... [--service NAME] [-o yaml|json]`: the compiled
//! per-service configs, as the agents receive them.
//!
//! Output is deterministic: the same policy gives the same bytes whatever
//! the file order or formatting (services sorted by name, rules in written
//! order, `version` a content hash). Diagnostics go to stderr like
//! `govc check`; warnings are printed and do not fail unless
//! `--deny-warnings`.
//!
//! Exit codes: 0 compiled, 1 errors (or warnings with `--deny-warnings`,
//! or an unknown `--service`), 64 usage.

use std::path::PathBuf;
use std::process::ExitCode;

use gov_compiler::{Diagnostics, SourceFile};

use crate::input;
use crate::report::{ReportArgs, Reporter};

/// Compile policy files to the per-service configs the agents enforce.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy files (together: the whole policy).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Print only the config of this service.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Yaml)]
    pub output: Output,

    /// Exit 1 on warnings as well as errors.
    #[arg(long, env = "GOV_DENY_WARNINGS", value_parser = clap::builder::BoolishValueParser::new())]
    pub deny_warnings: bool,

    #[command(flatten)]
    pub report: ReportArgs,
}

/// How compiled configs are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Yaml,
    Json,
}

/// `--service NAME` names no service of the policy.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("no service `{name}` in the policy")]
#[diagnostic(code("gov::unknown-service"), help("{help}"))]
struct NoSuchService {
    name: String,
    help: String,
}

/// Output that could not be encoded (a bug, reported rather than panicking).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("cannot encode the compiled config as {format}: {message}")]
#[diagnostic(code("gov::encode"))]
struct EncodeError {
    format: &'static str,
    message: String,
}

pub fn run(args: Args) -> ExitCode {
    let reporter = Reporter::new(args.report.error_format);
    let Some(files) = read_sources(&args.files, &reporter) else {
        return ExitCode::FAILURE;
    };
    let compiled = match gov_compiler::compile(&files) {
        Ok(c) => c,
        Err(diagnostics) => {
            emit(&reporter, diagnostics);
            return ExitCode::FAILURE;
        }
    };
    let summary = emit(&reporter, compiled.warnings);
    if args.deny_warnings && summary.warnings > 0 {
        return ExitCode::FAILURE;
    }
    let text = match &args.service {
        None => encode(&compiled.bundle, args.output),
        Some(name) => match compiled.bundle.targets.iter().find(|t| &t.service == name) {
            Some(target) => encode(target, args.output),
            None => {
                let known: Vec<String> = compiled
                    .bundle
                    .targets
                    .iter()
                    .map(|t| format!("`{}`", t.service))
                    .collect();
                let help = if known.is_empty() {
                    "the policy defines no service".to_string()
                } else {
                    format!("services in the policy: {}", known.join(", "))
                };
                let e = NoSuchService {
                    name: name.clone(),
                    help,
                };
                gov_common::err!("{}", reporter.render(&e));
                return ExitCode::FAILURE;
            }
        },
    };
    match text {
        Ok(text) => {
            gov_common::out!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            gov_common::err!("{}", reporter.render(&e));
            ExitCode::FAILURE
        }
    }
}

fn encode<T: serde::Serialize>(value: &T, output: Output) -> Result<String, EncodeError> {
    match output {
        Output::Yaml => serde_yaml::to_string(value).map_err(|e| EncodeError {
            format: "yaml",
            message: e.to_string(),
        }),
        Output::Json => serde_json::to_string_pretty(value)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| EncodeError {
                format: "json",
                message: e.to_string(),
            }),
    }
}

/// Reads every file; prints every read error and returns `None` if any.
pub fn read_sources(paths: &[PathBuf], reporter: &Reporter) -> Option<Vec<SourceFile>> {
    let (paths, errors) = input::expand(paths);
    let mut files = Vec::with_capacity(paths.len());
    let mut errors: Vec<miette::Report> = errors.into_iter().map(miette::Report::new).collect();
    for path in &paths {
        match input::read_policy(path) {
            Ok(text) => files.push(SourceFile::new(input::display_name(path), text)),
            Err(e) => errors.push(miette::Report::new(e)),
        }
    }
    if errors.is_empty() {
        Some(files)
    } else {
        reporter.emit(&errors);
        None
    }
}

/// Prints compiler diagnostics (errors and warnings) to stderr.
pub fn emit(reporter: &Reporter, diagnostics: Diagnostics) -> crate::report::Summary {
    let reports: Vec<miette::Report> = diagnostics.into_iter().map(miette::Report::new).collect();
    reporter.emit(&reports)
}
