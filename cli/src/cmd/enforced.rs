//! `govc config --agent INSTANCE` (or `--service NAME`): the config an agent
//! enforces now, as YAML, with the applied version it came from and, when it
//! is not the applied one (a NACK, an agent that has not caught up), how it
//! differs. govd knows which config version each agent enforces; govc finds
//! the kept version that compiles to it and compiles it again, as govd did.

use std::process::ExitCode;

use gov_compiler::SourceFile;
use gov_proto::v1 as pb;

use crate::cmd::apply::short;
use crate::cmd::audit::rfc3339;
use crate::remote::{self, RemoteArgs, RemoteError};

/// Print the config an agent enforces now.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent's instance name (as `govc status` shows it).
    #[arg(
        long,
        value_name = "INSTANCE",
        required_unless_present = "service",
        conflicts_with = "service"
    )]
    pub agent: Option<String>,

    /// Every agent of this service (one config each, or one if they agree).
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,

    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// govd's view and a client for the history, on one connection.
async fn fetch(
    remote: &RemoteArgs,
    service: String,
) -> Result<(pb::ClusterView, Vec<pb::VersionRecord>, String), RemoteError> {
    let mut client = remote.connect().await?;
    let view = client
        .status(remote.request(pb::StatusRequest { service })?)
        .await
        .map_err(|s| remote.status(s))?
        .into_inner();
    let history = client
        .history(remote.request(pb::HistoryRequest::default())?)
        .await
        .map_err(|s| remote.status(s))?
        .into_inner();
    let mut versions = Vec::new();
    // Each kept version with its sources, newest first (the usual match).
    for v in history.versions {
        let one = client
            .history(remote.request(pb::HistoryRequest {
                version: v.version.clone(),
            })?)
            .await
            .map_err(|s| remote.status(s))?
            .into_inner();
        versions.extend(one.versions);
    }
    Ok((view, versions, history.applied))
}

pub fn run(args: Args) -> ExitCode {
    let service = match (&args.agent, &args.service) {
        (_, Some(s)) => s.clone(),
        _ => String::new(),
    };
    let (view, versions, applied) = match remote::block_on(fetch(&args.remote, service)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) | Err(e) => return remote::fail(e),
    };
    let agents: Vec<&pb::AgentView> = view
        .agents
        .iter()
        .filter(|a| match (&args.agent, &args.service) {
            (Some(instance), _) => &a.instance == instance,
            (_, Some(service)) => &a.service == service,
            _ => false,
        })
        .collect();
    if agents.is_empty() {
        gov_proto::errln!(
            "error: govd knows no such agent\n  help: `govc status` lists the agents and their instance names"
        );
        return ExitCode::FAILURE;
    }
    // One compile per kept version, at most.
    let mut compiled: Vec<(&pb::VersionRecord, Option<pb::Bundle>)> =
        versions.iter().map(|v| (v, None)).collect();
    let mut printed: Vec<String> = Vec::new();
    let mut code = ExitCode::SUCCESS;
    for agent in agents {
        // NACKED: `version` is the refused one; `last_good_version` is enforced.
        let enforced = if agent.last_good_version.is_empty() {
            &agent.version
        } else {
            &agent.last_good_version
        };
        let found = compiled.iter_mut().find_map(|(record, bundle)| {
            let bundle = bundle.get_or_insert_with(|| compile(record));
            let target = bundle
                .targets
                .iter()
                .find(|t| t.service == agent.service && &t.version == enforced)?;
            Some((*record, target.clone()))
        });
        let name = gov_proto::printable::printable(&agent.instance);
        let Some((record, target)) = found else {
            gov_proto::errln!(
                "error: {name} enforces config {} of `{}`, which no version govd keeps compiles to (applied before its history began, or by an older release); the agent's admin port shows it: GET /config",
                short(enforced),
                agent.service
            );
            code = ExitCode::FAILURE;
            continue;
        };
        if printed.contains(&target.version) {
            gov_proto::outln!("# {name}: the same config {}", short(&target.version));
            continue;
        }
        printed.push(target.version.clone());
        gov_proto::outln!(
            "# {name} ({}): enforces config {} of `{}`, from version {} (applied {} by {}){}",
            remote::sync_name(agent.state()),
            short(&target.version),
            agent.service,
            short(&record.version),
            rfc3339(record.at_unix_ms),
            gov_proto::printable::printable(&record.who),
            if record.version == applied {
                ", the version in force"
            } else {
                ""
            }
        );
        if agent.state() == pb::SyncState::Nacked {
            gov_proto::outln!(
                "# it refused config {}: {}",
                short(&agent.version),
                gov_proto::printable::printable(&agent.reason)
            );
        }
        match serde_yaml::to_string(&target) {
            Ok(yaml) => gov_proto::out!("{yaml}"),
            Err(e) => {
                gov_proto::errln!("error: cannot encode the config: {e}");
                return ExitCode::FAILURE;
            }
        }
        if record.version != applied
            && let Some(diff) = differs_from_applied(&compiled, &applied, &agent.service, &target)
        {
            gov_proto::errln!(
                "note: {name} does not enforce the applied policy; going from what it enforces to what is applied:\n{diff}"
            );
        }
    }
    code
}

/// The kept version's sources, compiled as govd compiled them (an empty
/// bundle if they no longer compile with this govc).
fn compile(record: &pb::VersionRecord) -> pb::Bundle {
    let files: Vec<SourceFile> = record
        .sources
        .iter()
        .map(|s| SourceFile::new(&s.name, &s.text))
        .collect();
    gov_compiler::compile(&files).map_or_else(|_| pb::Bundle::default(), |c| c.bundle)
}

/// The plan from `enforced` to the applied version's config of `service`.
fn differs_from_applied(
    compiled: &[(&pb::VersionRecord, Option<pb::Bundle>)],
    applied: &str,
    service: &str,
    enforced: &pb::TargetConfig,
) -> Option<String> {
    let (record, bundle) = compiled.iter().find(|(r, _)| r.version == applied)?;
    let bundle = bundle.clone().unwrap_or_else(|| compile(record));
    let only = |targets: Vec<pb::TargetConfig>| pb::Bundle {
        targets: targets
            .into_iter()
            .filter(|t| t.service == service)
            .collect(),
        ..Default::default()
    };
    let plan = gov_compiler::plan(&only(vec![enforced.clone()]), &only(bundle.targets));
    Some(plan.to_string())
}
