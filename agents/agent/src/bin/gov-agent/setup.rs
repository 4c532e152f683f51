//! What `run` reads and checks from the flags before the sidecar starts,
//! and the control-plane client it connects once it runs.

use std::path::PathBuf;
use std::process::ExitCode;

use gov_agent::sidecar::{InboundMtls, Sidecar};

use super::{Args, EXIT_USAGE};

/// The Redis of `scope cluster` limits, if any (connected lazily: a Redis
/// that is down at start is an outage like any other).
pub(super) fn cluster_store(
    args: &Args,
) -> Result<Option<gov_agent::cluster::ClusterStore>, ExitCode> {
    let redis_tls = gov_agent::cluster::RedisTlsFiles {
        ca: args.redis_ca.clone(),
        cert: args.redis_cert.clone(),
        key: args.redis_key.clone(),
    };
    match args.redis.as_deref().map(|url| {
        gov_agent::cluster::redis_with(url, gov_agent::cluster::DEFAULT_TIMEOUT, &redis_tls)
    }) {
        None => Ok(None),
        Some(Ok(store)) => Ok(Some(store)),
        Some(Err(error)) => {
            gov_common::report::plain(&error);
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// TLS towards govd: the files read, and every `--control-plane` URL
/// checked against it once, here: a mistake is a usage error, not a reason
/// to retry forever.
pub(super) fn control_tls(
    args: &Args,
    control: Option<&gov_agent::control::ControlOptions>,
) -> Result<gov_common::tls::ClientTls, ExitCode> {
    let tls = gov_common::tls::ClientTls::read(&gov_common::tls::ClientTlsFiles {
        ca: args.tls_ca.clone(),
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
    })
    .and_then(|tls| {
        if let Some(c) = control {
            for url in gov_agent::control::urls(&c.url) {
                tls.endpoint(url)?;
            }
        }
        Ok(tls)
    });
    tls.map_err(|error| {
        gov_common::report::plain(&error);
        ExitCode::from(EXIT_USAGE)
    })
}

/// The decision log's options, checked.
pub(super) fn decision_log(
    args: &Args,
) -> Result<Option<gov_agent::decision_log::LogOptions>, ExitCode> {
    let decision_log = args.decision_log.clone().map(|path| {
        let instance = args
            .instance
            .clone()
            .unwrap_or_else(|| format!("{}@{}", args.service, args.listen));
        let mut log = gov_agent::decision_log::LogOptions::new(path, instance);
        log.sample = args.decision_log_sample;
        log.max_bytes = args.decision_log_max_bytes;
        log.keep = args.decision_log_keep;
        log
    });
    if let Some(Err(error)) = decision_log.as_ref().map(|o| o.check()) {
        gov_common::report::plain(&error);
        return Err(ExitCode::from(EXIT_USAGE));
    }
    Ok(decision_log)
}

/// The token for govd, read once from its file; refused when it would go in
/// clear to a host that is not loopback.
pub(super) fn read_token(
    args: &Args,
    control: Option<&gov_agent::control::ControlOptions>,
) -> Result<Option<String>, ExitCode> {
    let token = match args
        .control_plane_token_file
        .as_deref()
        .map(std::fs::read_to_string)
        .transpose()
    {
        Ok(token) => token.map(|t| t.trim().to_owned()),
        Err(error) => {
            gov_common::errln!("error: cannot read --control-plane-token-file: {error}");
            return Err(ExitCode::FAILURE);
        }
    };
    if let (Some(_), Some(c)) = (&token, control)
        && !args.allow_cleartext_token
        && let Some(url) = gov_agent::control::urls(&c.url)
            .into_iter()
            .find(|url| gov_common::tls::cleartext_to_remote(url))
    {
        gov_common::errln!(
            "error: will not send the agent token in clear to `{url}`: it is `http://` to a host that is not loopback, where anyone on the path can read it and claim this service's instances\n  help: use `https://` with --tls-ca CA.pem (govd with --tls-cert/--tls-key), or a loopback address; --allow-cleartext-token (GOV_ALLOW_CLEARTEXT_TOKEN) sends it anyway, for a lab"
        );
        return Err(ExitCode::from(EXIT_USAGE));
    }
    Ok(token)
}

/// Mutual TLS between agents, checked against the flags that need a
/// certificate.
pub(super) fn peer_tls(
    args: &Args,
) -> Result<std::sync::Arc<gov_agent::sidecar::PeerTls>, ExitCode> {
    let inbound_mtls = args.inbound_mtls;
    if inbound_mtls != InboundMtls::Off && !args.identity && args.tls_cert.is_none() {
        gov_common::errln!(
            "error: --inbound-mtls {} needs this agent's certificate\n  help: add --identity (a certificate from govd) or --tls-cert/--tls-key (the platform's files)",
            inbound_mtls.as_str()
        );
        return Err(ExitCode::from(EXIT_USAGE));
    }
    if args.inbound_tls_cert.is_some() && inbound_mtls == InboundMtls::Off {
        gov_common::errln!(
            "error: --inbound-tls-cert needs --inbound-mtls permit (or require): with `off` the inbound listener takes no TLS\n  help: add --inbound-mtls permit"
        );
        return Err(ExitCode::from(EXIT_USAGE));
    }
    match gov_agent::sidecar::PeerTls::new(
        inbound_mtls,
        args.outbound_mtls,
        args.peer_ca.as_deref(),
    ) {
        Ok(mtls) => Ok(std::sync::Arc::new(mtls)),
        Err(error) => {
            gov_common::report::plain(&error);
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// What the agent shows govd: whether govd issues its certificate
/// (`--identity`) or the files that hold it, its token, and TLS towards govd.
pub(super) struct Credentials {
    pub(super) identity: bool,
    pub(super) files: Option<(PathBuf, PathBuf)>,
    pub(super) token: Option<String>,
    pub(super) tls: gov_common::tls::ClientTls,
}

/// Connects the control-plane client (gov_agent::control) to the running
/// sidecar: pushed configs, ACK/NACK, stats, events, release and drain
/// commands, endpoints, and the agent's certificate.
pub(super) fn start_control(
    sidecar: &Sidecar,
    mut control: gov_agent::control::ControlOptions,
    credentials: Credentials,
    inbound_mtls: InboundMtls,
    stopping: &tokio_util::sync::CancellationToken,
) -> Result<(), ExitCode> {
    if control.instance.is_empty() {
        control.instance = format!("{}@{}", control.service, sidecar.inbound_addr());
    }
    control.address = sidecar.inbound_addr().to_string();
    control.inbound_mtls = inbound_mtls != InboundMtls::Off;
    // The agent's certificate: issued by govd, or the files, reloaded.
    let Credentials {
        identity,
        files,
        token,
        tls,
    } = credentials;
    if identity {
        let identity = gov_agent::identity::IdentityOptions {
            url: control.url.clone(),
            service: control.service.clone(),
            instance: control.instance.clone(),
            token: token.clone().unwrap_or_default(),
            tls: tls.clone(),
            backoff: gov_agent::control::Backoff::default(),
            on_certificate: Some(sidecar.on_certificate()),
        };
        match gov_agent::identity::start(identity, stopping.clone()) {
            Ok(credentials) => control.credentials = Some(credentials),
            Err(error) => {
                gov_common::report::plain(&error);
                return Err(ExitCode::FAILURE);
            }
        }
    } else if let Some((cert, key)) = files {
        control.credentials = Some(gov_agent::identity::watch_files(
            cert,
            key,
            gov_agent::identity::FILE_POLL,
            Some(sidecar.on_certificate()),
            stopping.clone(),
        ));
    }
    if let Some(credentials) = &control.credentials {
        sidecar.use_credentials(credentials.clone());
    }
    control.token = token;
    control.tls = tls;
    control.on_applied = Some(sidecar.on_config_applied());
    control.on_saved = Some(sidecar.on_config_saved());
    control.on_connection = Some(sidecar.on_control_plane_connection());
    control.on_refused = Some(sidecar.on_control_plane_refused());
    // The control plane's drain runs the config's shutdown steps, like SIGTERM.
    let lifecycle = sidecar.lifecycle().clone();
    control.on_drain = Some(std::sync::Arc::new(move |_| lifecycle.begin_shutdown()));
    control.lifecycle = Some(sidecar.lifecycle().subscribe());
    // govd is the registry: its endpoints replace `--instances` for the
    // services it knows.
    if let Some(dir) = &control.state_dir {
        gov_agent::sidecar::restore_endpoints(sidecar.directory(), dir);
    }
    control.on_endpoints = Some(gov_agent::sidecar::endpoints_to(
        sidecar.directory().clone(),
        sidecar.engine().clone(),
        control.state_dir.clone(),
    ));
    let lifecycle = sidecar.lifecycle().clone();
    lifecycle.use_control_plane();
    control.on_deregistered = Some(std::sync::Arc::new(move || {
        lifecycle.confirm_deregistered();
    }));
    tokio::spawn(gov_agent::control::run(
        sidecar.engine().clone(),
        control,
        stopping.clone(),
    ));
    Ok(())
}
