//! `govc tui`: the live governance view (the `gov-tui` library) in this terminal.

use std::process::ExitCode;

use crate::remote::{RemoteArgs, RemoteError};

/// Watch agents, rules, rejections and tripped fuses live; release a fuse or limit.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub remote: RemoteArgs,

    /// Show only this service.
    #[arg(long, value_name = "SERVICE")]
    pub service: Option<String>,

    /// Hide and refuse releasing fuses and limits.
    #[arg(long, env = "GOV_READONLY", value_parser = clap::builder::BoolishValueParser::new())]
    pub readonly: bool,
}

fn fail(report: miette::Report) -> ExitCode {
    gov_common::errln!("{report:?}");
    ExitCode::FAILURE
}

pub fn run(args: Args) -> ExitCode {
    let (token, tls) = match args.remote.token().and_then(|t| {
        args.remote.check_cleartext(t.as_deref())?;
        Ok((t, args.remote.tls()?))
    }) {
        Ok(t) => t,
        Err(e) => return fail(e.into()),
    };
    let opts = gov_tui::TuiOptions {
        control_plane: args.remote.control_plane,
        token,
        tls,
        readonly: args.readonly,
        who: std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "unknown".into()),
        service: args.service.unwrap_or_default(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(RemoteError::Runtime(e).into()),
    };
    // The TUI restores the terminal before returning, so the error prints
    // on the normal screen.
    match runtime.block_on(gov_tui::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e.into()),
    }
}
