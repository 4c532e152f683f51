//! `govc release fuse|limit SERVICE/RULE [--key K]`: release a tripped
//! fuse or an engaged limit (one key of a limit keyed by consumer or called
//! service, or every key) on every agent of the service. It asks nothing (the TUI
//! asks); the control plane records who released what in its audit log.

use std::process::ExitCode;

use gov_proto::v1 as pb;

use crate::remote::{self, RemoteArgs};

/// Release a tripped fuse or an engaged limit on every agent of its service.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to release.
    #[arg(value_enum)]
    pub kind: Kind,

    /// The rule, as `service/rule`.
    #[arg(value_name = "SERVICE/RULE", value_parser = parse_rule)]
    pub rule: String,

    /// Keyed limits (consumer, called service, request attributes such as
    /// `acme|web`, as `govc status` shows them): release only this key
    /// (`govc status` lists the latched keys). Default: every latched key;
    /// the answer names them.
    #[arg(long, value_name = "KEY", value_parser = parse_key)]
    pub key: Option<String>,

    #[command(flatten)]
    pub remote: RemoteArgs,

    /// Who releases, for the audit log of a govd without tokens (`--insecure`),
    /// where it is recorded as unverified. Default: `$USER`. With tokens,
    /// govd records the token's name instead.
    #[arg(long, env = "GOV_WHO")]
    pub who: Option<String>,

    /// `text` for people, `json` for tools (govd's answer: what was
    /// released, on which agents).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Fuse,
    Limit,
}

pub fn run(args: Args) -> ExitCode {
    if args.kind == Kind::Fuse && args.key.is_some() {
        gov_common::errln!(
            "error: a fuse has no keys: drop --key to release `{}`",
            args.rule
        );
        return ExitCode::from(crate::EXIT_USAGE);
    }
    let request = pb::ReleaseRequest {
        kind: match args.kind {
            Kind::Fuse => pb::ReleaseKind::Fuse,
            Kind::Limit => pb::ReleaseKind::Limit,
        } as i32,
        rule: args.rule.clone(),
        who: args
            .who
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| "unknown".into()),
        key: args.key.clone().unwrap_or_default(),
    };
    let result = remote::block_on(async {
        let mut client = args.remote.connect().await?;
        let request = args.remote.request(request)?;
        client
            .release(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| args.remote.status(s))
    });
    match result {
        Ok(Ok(r)) if args.output == Output::Json => match serde_json::to_string_pretty(&r) {
            Ok(json) => {
                gov_common::outln!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                gov_common::errln!("error: cannot encode the answer as JSON: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(Ok(r)) => {
            gov_common::outln!("{}", r.message);
            ExitCode::SUCCESS
        }
        Ok(Err(e)) | Err(e) => remote::fail(e),
    }
}

fn parse_key(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the key is empty: leave --key out to release every key".into());
    }
    Ok(s.to_owned())
}

fn parse_rule(s: &str) -> Result<String, String> {
    match s.split_once('/') {
        Some((service, rule)) if !service.is_empty() && !rule.is_empty() && !rule.contains('/') => {
            Ok(s.to_owned())
        }
        _ => Err(format!("`{s}` is not `SERVICE/RULE` (e.g. `order/mdm`)")),
    }
}
