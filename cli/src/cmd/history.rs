//! The applied versions govd keeps: `govc history` lists them, `govc show
//! VERSION` prints one's sources, `govc rollback VERSION` applies one again
//! (planned, confirmed and audited as a rollback), and `govc version` prints
//! govc's release and govd's.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use gov_common::flag::parse_duration;
use gov_proto::v1 as pb;

use crate::cmd::apply::{Flow, apply_files, short};
use crate::cmd::audit::rfc3339;
use crate::remote::{self, RemoteArgs};
use crate::report::ReportArgs;

/// `text` for people, `json` for tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// List the versions govd keeps, newest first.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,

    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Print the sources of one applied version.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The version (at least 6 hex digits of it, as `govc history` shows).
    pub version: String,

    /// Write each source file into this directory instead of printing them.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,

    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// Apply an earlier version again: planned against the policy in force,
/// confirmed like `govc apply`, audited as a rollback.
#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    /// The version to go back to (at least 6 hex digits of it).
    pub version: String,

    #[command(flatten)]
    pub remote: RemoteArgs,

    /// As `govc apply --wait`.
    #[arg(long, env = "GOV_WAIT", default_value = "10s", value_parser = parse_duration)]
    pub wait: Duration,

    /// Roll back without asking. Required when standard input is not a terminal.
    #[arg(long)]
    pub auto_approve: bool,

    /// As `govc apply --who`.
    #[arg(long, env = "GOV_WHO")]
    pub who: Option<String>,

    #[command(flatten)]
    pub report: ReportArgs,
}

/// Print govc's release and, when it answers, govd's.
#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// One `History` call.
fn history(remote: &RemoteArgs, version: &str) -> Result<pb::HistoryResult, remote::RemoteError> {
    remote::block_on(async {
        let mut client = remote.connect().await?;
        let request = remote.request(pb::HistoryRequest {
            version: version.to_owned(),
        })?;
        client
            .history(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| remote.status(s))
    })?
}

pub fn run_history(args: HistoryArgs) -> ExitCode {
    let result = match history(&args.remote, "") {
        Ok(r) => r,
        Err(e) => return remote::fail(e),
    };
    if args.output == Output::Json {
        return print_json(&result);
    }
    if result.versions.is_empty() {
        gov_common::outln!("Nothing applied yet.");
        return ExitCode::SUCCESS;
    }
    let mut rows = vec![vec![
        " ".to_owned(),
        "VERSION".into(),
        "APPLIED AT".into(),
        "BY".into(),
        "SERVICES CHANGED".into(),
    ]];
    let mut marked = false;
    for v in &result.versions {
        // The newest entry of the version in force is the one in force.
        let current = !marked && v.version == result.applied;
        marked |= current;
        rows.push(vec![
            if current { "*" } else { " " }.into(),
            short(&v.version),
            rfc3339(v.at_unix_ms),
            gov_proto::printable::printable(&v.who).into_owned(),
            if v.services.is_empty() {
                "-".into()
            } else {
                v.services.join(", ")
            },
        ]);
    }
    gov_common::out!("{}", remote::table(&rows));
    gov_common::outln!(
        "\n* in force. `govc show VERSION` prints a version's sources; `govc rollback VERSION` applies it again."
    );
    ExitCode::SUCCESS
}

/// The one version `asked` names, with its sources.
fn one_version(remote: &RemoteArgs, asked: &str) -> Result<pb::VersionRecord, ExitCode> {
    match history(remote, asked) {
        Ok(mut r) if r.versions.len() == 1 => Ok(r.versions.remove(0)),
        Ok(_) => {
            gov_common::errln!("error: govd did not send version `{asked}`");
            Err(ExitCode::FAILURE)
        }
        Err(e) => Err(remote::fail(e)),
    }
}

pub fn run_show(args: ShowArgs) -> ExitCode {
    let version = match one_version(&args.remote, &args.version) {
        Ok(v) => v,
        Err(code) => return code,
    };
    if let Some(dir) = &args.out_dir {
        for s in &version.sources {
            // A source's name came from whoever applied it: keep only its
            // file name, never a path out of DIR.
            let name = std::path::Path::new(&s.name)
                .file_name()
                .map_or_else(|| "policy.gov".into(), |n| n.to_os_string());
            let path = dir.join(name);
            if let Err(e) =
                std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &s.text))
            {
                gov_common::errln!("error: cannot write `{}`: {e}", path.display());
                return ExitCode::FAILURE;
            }
            gov_common::outln!("wrote {}", path.display());
        }
        return ExitCode::SUCCESS;
    }
    let many = version.sources.len() > 1;
    for s in &version.sources {
        if many {
            gov_common::outln!("==> {} <==", gov_proto::printable::printable(&s.name));
        }
        gov_common::out!("{}", s.text);
        if many && !s.text.ends_with('\n') {
            gov_common::outln!();
        }
    }
    ExitCode::SUCCESS
}

pub fn run_rollback(args: RollbackArgs) -> ExitCode {
    let version = match one_version(&args.remote, &args.version) {
        Ok(v) => v,
        Err(code) => return code,
    };
    gov_common::outln!(
        "Rolling back to version {} (applied {} by {}):\n",
        short(&version.version),
        rfc3339(version.at_unix_ms),
        gov_proto::printable::printable(&version.who)
    );
    let files: Vec<(String, String)> = version
        .sources
        .into_iter()
        .map(|s| (s.name, s.text))
        .collect();
    let flow = Flow {
        remote: &args.remote,
        report: &args.report,
        wait: args.wait,
        who: args.who.clone().unwrap_or_else(crate::cmd::apply::who_am_i),
        auto_approve: args.auto_approve,
        shadow: false,
        // The version rolled back to may itself have had no service.
        remove_all_services: false,
        json: false,
        expect_version: String::new(),
        rollback_to: version.version,
        canary: None,
    };
    apply_files(&files, &flow)
}

pub fn run_version(args: VersionArgs) -> ExitCode {
    gov_common::outln!("govc {}", env!("CARGO_PKG_VERSION"));
    match history(&args.remote, "") {
        Ok(r) => gov_common::outln!("govd {} at {}", r.govd_version, args.remote.control_plane),
        Err(e) => gov_common::errln!("govd: unknown ({e})"),
    }
    ExitCode::SUCCESS
}

fn print_json(result: &pb::HistoryResult) -> ExitCode {
    match serde_json::to_string_pretty(result) {
        Ok(json) => {
            gov_common::outln!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            gov_common::errln!("error: cannot encode the history as JSON: {e}");
            ExitCode::FAILURE
        }
    }
}
