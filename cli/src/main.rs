//! `govc`: check, format, compile, plan and apply gov policies.
//!
//! Each subcommand lives in `cmd/<name>.rs` with an `Args` struct and a
//! `run(Args) -> ExitCode`; this file only parses the command line and
//! dispatches. Exit codes: 0 success, 1 errors, 64 usage errors (so that 2
//! can mean "changes present" for `plan --detailed-exitcode`).

// A closed stdout or stderr (`govc status | head -1`) must not panic:
// print through `gov_proto::out!`/`errln!` and friends instead.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod cmd {
    pub mod apply;
    pub mod audit;
    pub mod check;
    pub mod compile;
    pub mod demo;
    pub mod fmt;
    pub mod lsp;
    pub mod plan;
    pub mod release;
    pub mod status;
    pub mod tui;
}
mod input;
mod remote;
mod report;

/// Exit code for a command line that cannot be understood (sysexits EX_USAGE).
const EXIT_USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "govc",
    version,
    about = "Check, format, compile and apply gov service-governance policies"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Check(cmd::check::Args),
    Fmt(cmd::fmt::Args),
    /// Compile policy files to the per-service configs the agents enforce.
    Compile(cmd::compile::Args),
    /// Show what changes between two policies (or against the control plane).
    Plan(cmd::plan::Args),
    /// Apply policy files through the control plane and wait for the agents.
    Apply(cmd::apply::Args),
    /// Show agents, sync state, tripped fuses and engaged limits.
    Status(cmd::status::Args),
    /// Release a tripped fuse or an engaged limit on every agent of its service.
    Release(cmd::release::Args),
    /// Show govd's audit log: applies, releases and trips, with who did them.
    Audit(cmd::audit::Args),
    /// Run a control plane, demo services behind agents and a load in one process, and watch it.
    Demo(cmd::demo::Args),
    /// Watch agents, rules and rejections live; release tripped fuses and engaged limits.
    Tui(cmd::tui::Args),
    /// Run a language server for `.gov` files on stdin and stdout (for editors).
    Lsp(cmd::lsp::Args),
    /// Print a shell completion script (`govc completions bash > /etc/bash_completion.d/govc`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` print to stdout and succeed; every
            // other parse failure is a usage error.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Check(args) => cmd::check::run(args),
        Command::Fmt(args) => cmd::fmt::run(args),
        Command::Compile(args) => cmd::compile::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Apply(args) => cmd::apply::run(args),
        Command::Status(args) => cmd::status::run(args),
        Command::Release(args) => cmd::release::run(args),
        Command::Audit(args) => cmd::audit::run(args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::Tui(args) => cmd::tui::run(args),
        Command::Lsp(args) => cmd::lsp::run(args),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "govc", &mut script);
            gov_proto::out!("{}", String::from_utf8_lossy(&script));
            ExitCode::SUCCESS
        }
    }
}
