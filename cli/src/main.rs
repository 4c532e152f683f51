//! `govc`: check, format, compile, plan and apply gov policies.
//!
//! Each subcommand lives in `cmd/<name>.rs` with an `Args` struct and a
//! `run(Args) -> ExitCode`; this file only parses the command line and
//! dispatches. Exit codes: 0 success, 1 errors, 64 usage errors (so that 2
//! can mean "changes present" for `plan --detailed-exitcode`).

// A closed stdout or stderr (`govc status | head -1`) must not panic:
// print through `gov_common::out!`/`errln!` and friends instead.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod cmd {
    pub mod apply;
    pub mod audit;
    pub mod canary;
    pub mod check;
    pub mod compile;
    pub mod demo;
    pub mod enforced;
    pub mod fmt;
    pub mod history;
    pub mod lsp;
    pub mod plan;
    pub mod release;
    pub mod replay;
    pub mod saved;
    pub mod status;
    pub mod suggest;
    pub mod tui;
}
#[cfg(test)]
use gov_common::testing::help_examples;
mod input;
mod remote;
mod report;

/// Exit code for a command line that cannot be understood (sysexits EX_USAGE).
const EXIT_USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "govc",
    version,
    about = "Check, format, compile and apply gov service-governance policies",
    after_help = examples::GOVC
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(after_help = examples::CHECK)]
    Check(cmd::check::Args),
    #[command(after_help = examples::FMT)]
    Fmt(cmd::fmt::Args),
    /// Compile policy files to the per-service configs the agents enforce.
    #[command(after_help = examples::COMPILE)]
    Compile(cmd::compile::Args),
    /// Show what changes between two policies (or against the control plane).
    #[command(after_help = examples::PLAN)]
    Plan(cmd::plan::Args),
    /// Apply policy files through the control plane and wait for the agents.
    #[command(after_help = examples::APPLY)]
    Apply(cmd::apply::Args),
    /// End a canary apply now: roll it back (`abort`) or apply it everywhere (`promote`).
    #[command(after_help = examples::CANARY)]
    Canary(cmd::canary::Args),
    /// Show agents, sync state, tripped fuses and engaged limits.
    #[command(after_help = examples::STATUS)]
    Status(cmd::status::Args),
    /// Release a tripped fuse or an engaged limit on every agent of its service.
    #[command(after_help = examples::RELEASE)]
    Release(cmd::release::Args),
    /// Run a policy over calls recorded by `gov-agent --decision-log` and show what it would decide.
    #[command(after_help = examples::REPLAY)]
    Replay(cmd::replay::Args),
    /// Propose a policy from recorded traffic, and replay it over that traffic.
    #[command(after_help = examples::SUGGEST)]
    Suggest(cmd::suggest::Args),
    /// Show govd's audit log: applies, releases and trips, with who did them.
    #[command(after_help = examples::AUDIT)]
    Audit(cmd::audit::Args),
    /// Print the config an agent enforces now, and how it differs from the applied one.
    #[command(after_help = examples::CONFIG)]
    Config(cmd::enforced::Args),
    /// List the applied versions govd keeps, newest first.
    #[command(after_help = examples::HISTORY)]
    History(cmd::history::HistoryArgs),
    /// Print the sources of one applied version.
    #[command(after_help = examples::SHOW)]
    Show(cmd::history::ShowArgs),
    /// Apply an earlier version again (planned, confirmed, audited as a rollback).
    #[command(after_help = examples::ROLLBACK)]
    Rollback(cmd::history::RollbackArgs),
    /// Print govc's version and govd's.
    #[command(after_help = examples::VERSION)]
    Version(cmd::history::VersionArgs),
    /// Run a control plane, demo services behind agents and a load in one process, and watch it.
    #[command(after_help = examples::DEMO)]
    Demo(cmd::demo::Args),
    /// Watch agents, rules and rejections live; release tripped fuses and engaged limits.
    #[command(after_help = examples::TUI)]
    Tui(cmd::tui::Args),
    /// Run a language server for `.gov` files on stdin and stdout (for editors).
    #[command(after_help = examples::LSP)]
    Lsp(cmd::lsp::Args),
    /// Print a shell completion script (`govc completions bash > /etc/bash_completion.d/govc`).
    #[command(after_help = examples::COMPLETIONS)]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// The `Examples:` of each command's help. Tests parse every line that
/// starts with `govc` through [`Cli`], so they cannot drift from the flags.
mod examples {
    pub const GOVC: &str = "\
Examples:
  govc check policies/
  govc apply policies/*.gov
  govc status -s order";
    pub const CHECK: &str = "\
Examples:
  govc check examples/shop.gov
  govc check policies/ --deny-warnings
  govc check policies/*.gov --each --error-format json";
    pub const FMT: &str = "\
Examples:
  govc fmt shop.gov
  govc fmt --write policies/*.gov
  govc fmt --check --diff policies/*.gov";
    pub const COMPILE: &str = "\
Examples:
  govc compile shop.gov
  govc compile shop.gov --service order -o json > order.json";
    pub const PLAN: &str = "\
Examples:
  govc plan shop.gov
  govc plan old.gov --against new.gov
  govc plan policies/*.gov --detailed-exitcode -o json
  govc plan policies/*.gov --out reviewed.plan";
    pub const APPLY: &str = "\
Examples:
  govc apply shop.gov
  govc apply policies/*.gov --auto-approve --wait 30s -o json
  govc apply reviewed.plan
  govc apply shop.gov --canary 10% --for 5m --max-reject-ratio 2%";
    pub const CANARY: &str = "\
Examples:
  govc canary abort --reason 'p99 up on order'
  govc canary promote";
    pub const STATUS: &str = "\
Examples:
  govc status
  govc status -s order
  govc status -o json";
    pub const RELEASE: &str = "\
Examples:
  govc release fuse order/mdm
  govc release limit order/per-consumer --token-file token
  govc release limit order/per-consumer --key crm --token-file token";
    pub const REPLAY: &str = "\
Examples:
  govc replay shop.gov --log order.jsonl order.jsonl.1
  govc replay strict.gov --log order.jsonl --service order --against shop.gov
  govc replay shop.gov --log logs/*.jsonl -o json";
    pub const AUDIT: &str = "\
Examples:
  govc audit --since 2h
  govc audit --since 2026-12-01 -o json
  govc audit --limit 20";
    pub const CONFIG: &str = "\
Examples:
  govc config --agent order-7d9f
  govc config --service order";
    pub const SUGGEST: &str = "\
Examples:
  govc suggest --log order.jsonl
  govc suggest --log logs/*.jsonl --service order --out proposed.gov";
    pub const HISTORY: &str = "\
Examples:
  govc history
  govc history -o json";
    pub const SHOW: &str = "\
Examples:
  govc show 3f1c0a9e2b4d
  govc show 3f1c0a --out-dir restored/";
    pub const ROLLBACK: &str = "\
Examples:
  govc rollback 3f1c0a9e2b4d
  govc rollback 3f1c0a --auto-approve --wait 30s";
    pub const VERSION: &str = "\
Examples:
  govc version
  govc version --control-plane https://govd.internal:7070 --tls-ca ca.pem";
    pub const DEMO: &str = "\
Examples:
  govc demo
  govc demo --no-tui --duration 2m --every 10s
  govc demo --policy my-shop.gov";
    pub const TUI: &str = "\
Examples:
  govc tui
  govc tui --service order --readonly
  govc tui --control-plane https://govd.internal:7070 --tls-ca ca.pem --token-file token";
    pub const LSP: &str = "\
Examples:
  govc lsp
  govc lsp --stdio";
    pub const COMPLETIONS: &str = "\
Examples:
  govc completions bash > /etc/bash_completion.d/govc
  govc completions zsh > ~/.zfunc/_govc
  govc completions fish > ~/.config/fish/completions/govc.fish";
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
        Command::Canary(args) => cmd::canary::run(args),
        Command::Release(args) => cmd::release::run(args),
        Command::Replay(args) => cmd::replay::run(args),
        Command::Audit(args) => cmd::audit::run(args),
        Command::Suggest(args) => cmd::suggest::run(args),
        Command::Config(args) => cmd::enforced::run(args),
        Command::History(args) => cmd::history::run_history(args),
        Command::Show(args) => cmd::history::run_show(args),
        Command::Rollback(args) => cmd::history::run_rollback(args),
        Command::Version(args) => cmd::history::run_version(args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::Tui(args) => cmd::tui::run(args),
        Command::Lsp(args) => cmd::lsp::run(args),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "govc", &mut script);
            gov_common::out!("{}", String::from_utf8_lossy(&script));
            ExitCode::SUCCESS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command's help shows examples, and each one parses.
    #[test]
    fn every_help_shows_examples_that_parse() {
        let checked = help_examples::check(Cli::command(), |words| {
            Cli::try_parse_from(std::iter::once("govc".to_owned()).chain(words)).map(drop)
        });
        assert!(checked >= 2 * 14, "only {checked} examples");
    }
}
