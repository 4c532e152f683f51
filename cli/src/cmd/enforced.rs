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

/// Kept versions with their compiled bundles, newest first: as many as it takes to find
/// every config in `wanted` (service, config version) and the applied one.
/// Each version's sources are a call of their own, so an agent that
/// enforces the applied policy costs two calls, not one per kept version.
type Compiled = Vec<(pb::VersionRecord, pb::Bundle)>;

/// govd's view of the agents `which` selects, and the kept versions that
/// hold their configs, on one connection.
async fn fetch(
    remote: &RemoteArgs,
    service: String,
    which: impl Fn(&pb::AgentView) -> bool,
) -> Result<(pb::ClusterView, Compiled, String), RemoteError> {
    let mut client = remote.connect().await?;
    let view = client
        .status(remote.request(pb::StatusRequest {
            service,
            ..Default::default()
        })?)
        .await
        .map_err(|s| remote.status(s))?
        .into_inner();
    let history = client
        .history(remote.request(pb::HistoryRequest::default())?)
        .await
        .map_err(|s| remote.status(s))?
        .into_inner();
    let mut wanted: Vec<(&str, &str)> = view
        .agents
        .iter()
        .filter(|a| which(a))
        .map(|a| (a.service.as_str(), enforced(a)))
        .collect();
    let mut compiled = Vec::new();
    let mut applied_seen = false;
    for v in &history.versions {
        if wanted.is_empty() && applied_seen {
            break;
        }
        let one = client
            .history(remote.request(pb::HistoryRequest {
                version: v.version.clone(),
            })?)
            .await
            .map_err(|s| remote.status(s))?
            .into_inner();
        for record in one.versions {
            let bundle = compile(&record);
            wanted.retain(|(service, version)| {
                !bundle
                    .targets
                    .iter()
                    .any(|t| t.service == *service && t.version == *version)
            });
            applied_seen |= record.version == history.applied;
            compiled.push((record, bundle));
        }
    }
    Ok((view, compiled, history.applied))
}

/// The config version an agent enforces: after a NACK, `version` is the
/// refused one and `last_good_version` the one in force.
fn enforced(agent: &pb::AgentView) -> &str {
    if agent.last_good_version.is_empty() {
        &agent.version
    } else {
        &agent.last_good_version
    }
}

pub fn run(args: Args) -> ExitCode {
    let service = args.service.clone().unwrap_or_default();
    let which = |a: &pb::AgentView| match (&args.agent, &args.service) {
        (Some(instance), _) => &a.instance == instance,
        (_, Some(service)) => &a.service == service,
        _ => false,
    };
    let (view, compiled, applied) = match remote::block_on(fetch(&args.remote, service, which)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) | Err(e) => return remote::fail(e),
    };
    let agents: Vec<&pb::AgentView> = view.agents.iter().filter(|a| which(a)).collect();
    if agents.is_empty() {
        gov_common::errln!(
            "error: govd knows no such agent\n  help: `govc status` lists the agents and their instance names"
        );
        return ExitCode::FAILURE;
    }
    let mut printed: Vec<String> = Vec::new();
    let mut code = ExitCode::SUCCESS;
    for agent in agents {
        let enforced = enforced(agent);
        let found = compiled.iter().find_map(|(record, bundle)| {
            let target = bundle
                .targets
                .iter()
                .find(|t| t.service == agent.service && t.version == enforced)?;
            Some((record, target))
        });
        let name = gov_proto::printable::printable(&agent.instance);
        let Some((record, target)) = found else {
            gov_common::errln!(
                "error: {name} enforces config {} of `{}`, which no version govd keeps compiles to (applied before its history began, or by an older release); the agent's admin port shows it: GET /config",
                short(enforced),
                agent.service
            );
            code = ExitCode::FAILURE;
            continue;
        };
        if printed.contains(&target.version) {
            gov_common::outln!("# {name}: the same config {}", short(&target.version));
            continue;
        }
        printed.push(target.version.clone());
        gov_common::outln!(
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
            gov_common::outln!(
                "# it refused config {}: {}",
                short(&agent.version),
                gov_proto::printable::printable(&agent.reason)
            );
        }
        match serde_yaml::to_string(target) {
            Ok(yaml) => gov_common::out!("{yaml}"),
            Err(e) => {
                gov_common::errln!("error: cannot encode the config: {e}");
                return ExitCode::FAILURE;
            }
        }
        if record.version != applied
            && let Some(diff) = differs_from_applied(&compiled, &applied, &agent.service, target)
        {
            gov_common::errln!(
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
    compiled: &Compiled,
    applied: &str,
    service: &str,
    enforced: &pb::TargetConfig,
) -> Option<String> {
    let (_, bundle) = compiled.iter().find(|(r, _)| r.version == applied)?;
    let only = |targets: &[pb::TargetConfig]| pb::Bundle {
        targets: targets
            .iter()
            .filter(|t| t.service == service)
            .cloned()
            .collect(),
        ..Default::default()
    };
    let plan = gov_compiler::plan(
        &only(std::slice::from_ref(enforced)),
        &only(&bundle.targets),
    );
    Some(plan.to_string())
}
