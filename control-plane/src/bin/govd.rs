//! `govd`: the gov control plane. Flags have `GOV_...` environment variables
//! (flag > env > default); logs go to stderr (`GOV_LOG` or `RUST_LOG` filters
//! them, `--log-format json` writes JSON lines).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gov_common::flag::parse_duration;
use gov_common::log::LogFormat;
use gov_common::signal::Signals;
use gov_common::tls::read_pem;
use gov_control_plane::auth::{
    Role, Tokens, check_start, cleartext_warning, read_named_tokens, read_token_file,
};
use gov_control_plane::etcd::{EtcdConfig, EtcdStore, EtcdTlsFiles};
use gov_control_plane::tls_server::ServerTls;
use gov_control_plane::{
    AgentLimits, ConnectionLimits, ControlPlane, Error, HistoryLimit, Limits, Options, serve,
};
use tokio_util::sync::CancellationToken;

/// How to stop govd when its signal handlers cannot be installed.
const OTHERWISE: &str = "stop govd with SIGKILL";

/// Usage errors exit with 64 (EX_USAGE), as every gov binary does.
const EXIT_USAGE: u8 = 64;

/// The `Examples:` of `--help`; a test parses each line through [`Args`].
const EXAMPLES: &str = "\
Examples:
  govd --insecure
  govd --state-dir /var/lib/gov --token-file /etc/gov/tokens --agent-token-file /etc/gov/agent-token
  govd --listen 0.0.0.0:7070 --tls-cert cert.pem --tls-key key.pem --token-file tokens --metrics-listen 0.0.0.0:7071 --log-format json";

/// The gov control plane: compiles applied policies, pushes each service's
/// config to its agents, tracks their sync state, fuses and limits.
#[derive(Debug, Parser)]
#[command(name = "govd", version, about, after_help = EXAMPLES)]
struct Args {
    /// gRPC listener (`gov.v1.ControlPlane` and `grpc.health.v1`).
    #[arg(long, env = "GOV_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,

    /// Where the applied policy, its history, fuse/limit state and the audit
    /// log are kept.
    #[arg(long, env = "GOV_STATE_DIR", default_value = "./.gov-state")]
    state_dir: PathBuf,

    /// Keep the state in etcd instead, shared by several govd replicas:
    /// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (prefix `gov` by
    /// default), `etcds://` over TLS (with --etcd-ca). Each replica serves
    /// agents and operators; the elected leader runs the `release after` timer.
    #[arg(
        long,
        env = "GOV_STORE",
        value_name = "URL",
        conflicts_with = "state_dir"
    )]
    store: Option<String>,

    /// The CA (PEM) that signed the etcd members' certificates; needed by
    /// `--store etcds://`.
    #[arg(long, env = "GOV_ETCD_CA", value_name = "FILE")]
    etcd_ca: Option<PathBuf>,

    /// This replica's client certificate (PEM) for etcd members started
    /// with `--client-cert-auth`; with --etcd-key.
    #[arg(long, env = "GOV_ETCD_CERT", value_name = "FILE")]
    etcd_cert: Option<PathBuf>,

    /// The private key (PEM) of --etcd-cert.
    #[arg(long, env = "GOV_ETCD_KEY", value_name = "FILE")]
    etcd_key: Option<PathBuf>,

    /// This replica's name in etcd (its agents, audit records and
    /// leadership). Default: the address it listens on.
    #[arg(long, env = "GOV_REPLICA", value_name = "NAME")]
    replica: Option<String>,

    /// The leader's lease in etcd: a leader that stops renewing it (dead,
    /// paused, cut off) is replaced after at most this long (default 10s).
    /// Only with `--store` (the state directory has one writer and no leader).
    #[arg(
        long,
        env = "GOV_LEADER_LEASE",
        value_parser = parse_duration
    )]
    leader_lease: Option<Duration>,

    /// The tokens people and agents present: one `name token role` line
    /// each, role `admin` (everything), `operator` (read and release) or
    /// `viewer` (read); agents `name token agent SERVICE[,SERVICE...]` (an
    /// agent presenting it may claim only those services). The audit log
    /// names the token. A file holding one token on one line is one admin
    /// token named `admin`.
    #[arg(long, env = "GOV_TOKEN_FILE")]
    token_file: Option<PathBuf>,

    /// Run without tokens: every call is open and the audit records who the
    /// client says it is. Only on a loopback --listen address.
    #[arg(long, env = "GOV_INSECURE", value_parser = clap::builder::BoolishValueParser::new(), conflicts_with = "token_file")]
    insecure: bool,

    /// TLS on the gRPC listener: the server certificate (PEM, chain first).
    /// Clients then use `https://` and `--tls-ca`.
    #[arg(long, env = "GOV_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "GOV_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Mutual TLS for agents: the CA (PEM) that signs agent certificates.
    /// Every agent must then present one, whose identity
    /// (`spiffe://.../service/NAME` URI SAN, or CN=NAME) is its --service.
    /// People (govc, the TUI) still authenticate with tokens.
    #[arg(long, env = "GOV_TLS_CLIENT_CA", value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,

    /// Issue agents their identities: the CA certificate and its private key
    /// (PEM files, `CERT,KEY`). An agent with its service's agent token
    /// (`gov-agent --identity`) gets a short-lived certificate naming its
    /// service and instance; govd then takes only agents with a certificate
    /// (this CA's, or --tls-client-ca's). Needs --tls-cert.
    #[arg(long, env = "GOV_IDENTITY_CA", value_name = "CERT,KEY", requires = "tls_cert", value_parser = parse_pair)]
    identity_ca: Option<(PathBuf, PathBuf)>,

    /// How long an issued certificate lives; agents renew at two thirds of it.
    #[arg(long, env = "GOV_IDENTITY_LIFETIME", default_value = "24h", value_parser = parse_duration, requires = "identity_ca")]
    identity_lifetime: Duration,

    /// The SPIFFE trust domain of issued certificates
    /// (`spiffe://DOMAIN/instance/INSTANCE/service/SERVICE`).
    #[arg(long, env = "GOV_IDENTITY_TRUST_DOMAIN", default_value = gov_control_plane::identity::DEFAULT_TRUST_DOMAIN, requires = "identity_ca")]
    identity_trust_domain: String,

    /// Most connections open at once (agents, govc, TUIs); further ones wait
    /// in the listen backlog until one closes.
    #[arg(long, env = "GOV_MAX_CONNECTIONS", default_value_t = ConnectionLimits::default().max_connections,
          value_parser = at_least_one)]
    max_connections: usize,

    /// Most connections open at once from one client IP address; a further
    /// one from it is closed at once (so one host cannot hold them all).
    #[arg(long, env = "GOV_MAX_CONNECTIONS_PER_CLIENT", default_value_t = ConnectionLimits::default().max_connections_per_client,
          value_parser = at_least_one)]
    max_connections_per_client: usize,

    /// New agent streams admitted per second, so that a fleet reconnecting
    /// at once (after a govd restart) is taken in at a steady rate; a stream
    /// whose turn is more than 3 s away is refused (UNAVAILABLE) and its
    /// agent retries after its backoff. 0: no limit.
    #[arg(long, env = "GOV_AGENT_ADMISSIONS_PER_SECOND",
          default_value_t = ConnectionLimits::default().agent_admissions_per_second)]
    agent_admissions_per_second: u32,

    /// Most HTTP/2 streams (calls) at once on one connection.
    #[arg(long, env = "GOV_MAX_STREAMS_PER_CONNECTION",
          default_value_t = ConnectionLimits::default().max_streams_per_connection)]
    max_streams_per_connection: u32,

    /// A new connection that sends nothing (no TLS hello, no HTTP/2 preface)
    /// within this is closed; also the TLS handshake's deadline.
    #[arg(long, env = "GOV_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,

    /// A connection that makes no authenticated call (a call with a token
    /// govd accepts, or an agent's certificate) within this is closed, even
    /// if it answers HTTP/2 pings; health checks prove nothing.
    #[arg(long, env = "GOV_AUTH_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    auth_timeout: Duration,

    /// HTTP/2 pings to each peer this often...
    #[arg(long, env = "GOV_HTTP2_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    http2_keepalive_interval: Duration,

    /// ... and the connection is closed if one is not answered within this.
    #[arg(long, env = "GOV_HTTP2_KEEPALIVE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    http2_keepalive_timeout: Duration,

    /// Most `Watch` streams (TUIs) open at once with one token; a further
    /// one is refused (RESOURCE_EXHAUSTED) until one closes.
    #[arg(long, env = "GOV_MAX_WATCHES_PER_TOKEN", default_value_t = ConnectionLimits::default().max_watches_per_token,
          value_parser = at_least_one)]
    max_watches_per_token: usize,

    /// TCP keepalive probes on a connection idle this long.
    #[arg(long, env = "GOV_TCP_KEEPALIVE", default_value = "60s", value_parser = parse_duration)]
    tcp_keepalive: Duration,

    /// A file holding one bearer token any agent may present on `Connect`,
    /// for any service (the older way: prefer `agent` lines in
    /// --token-file, which bind a token to its services).
    #[arg(long, env = "GOV_AGENT_TOKEN_FILE")]
    agent_token_file: Option<PathBuf>,

    /// Most instances govd knows per service, connected or not; a new one
    /// beyond it is refused (RESOURCE_EXHAUSTED) until one is forgotten.
    #[arg(long, env = "GOV_MAX_AGENTS_PER_SERVICE", default_value_t = AgentLimits::default().max_agents_per_service,
          value_parser = at_least_one)]
    max_agents_per_service: usize,

    /// Most bytes of labels (keys and values) one agent may bring; an agent
    /// with more is refused.
    #[arg(long, env = "GOV_MAX_AGENT_LABEL_BYTES", default_value_t = AgentLimits::default().max_label_bytes)]
    max_agent_label_bytes: usize,

    /// Longest string an agent may send (service, instance, address, one
    /// label); an event's reason beyond it is cut.
    #[arg(long, env = "GOV_MAX_AGENT_STRING_BYTES", default_value_t = AgentLimits::default().max_string_bytes,
          value_parser = at_least_one)]
    max_agent_string_bytes: usize,

    /// A disconnected instance not heard from this long is forgotten (and
    /// audited as `agents-pruned`): its name is free again.
    #[arg(long, env = "GOV_AGENT_RETENTION", default_value = "24h", value_parser = parse_duration)]
    agent_retention: Duration,

    /// How long an audited intent (`apply-intended`, `release-intended`)
    /// without an outcome may still be in progress, here or on another
    /// replica, before the leader writes its outcome from the state.
    #[arg(long, env = "GOV_AUDIT_INTENT_GRACE", default_value = "2m", value_parser = parse_duration)]
    audit_intent_grace: Duration,

    /// How long in-flight calls may take to finish on SIGTERM/SIGINT.
    #[arg(long, env = "GOV_DRAIN_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    drain_timeout: Duration,

    /// Applied versions kept in the history.
    #[arg(long, env = "GOV_HISTORY", default_value_t = HistoryLimit::default().entries)]
    history: usize,

    /// Most bytes of policy text the history keeps in state.json; older
    /// versions are dropped first (the one in force always stays). A text
    /// shared by many versions counts once.
    #[arg(long, env = "GOV_HISTORY_BYTES", default_value_t = HistoryLimit::default().bytes)]
    history_bytes: usize,

    /// Largest policy accepted by `Apply` and dry runs, in bytes (all files
    /// together); larger ones are refused before any compile work.
    #[arg(long, env = "GOV_MAX_POLICY_BYTES", default_value_t = Limits::default().max_policy_bytes)]
    max_policy_bytes: usize,

    /// Most statements (`match`, `bulkhead`, `limit`, `fuse`, ... in service
    /// blocks) in one policy; larger ones are refused before the compiler's
    /// checks run.
    #[arg(long, env = "GOV_MAX_STATEMENTS", default_value_t = Limits::default().max_statements)]
    max_statements: usize,

    /// Most diagnostics sent back for one policy; the rest are counted in
    /// one note (`govc check` shows them all).
    #[arg(long, env = "GOV_MAX_DIAGNOSTICS", default_value_t = Limits::default().max_diagnostics)]
    max_diagnostics: usize,

    /// Most policy compiles running at once (applies and dry runs); further
    /// requests wait for a slot.
    #[arg(long, env = "GOV_MAX_CONCURRENT_COMPILES", default_value_t = Limits::default().concurrent_compiles,
          value_parser = at_least_one)]
    max_concurrent_compiles: usize,

    // Operability: logs and metrics.
    /// `GET /metrics` (Prometheus text) on this address, e.g. `127.0.0.1:7071`.
    /// Unset: no metrics listener.
    #[arg(long, env = "GOV_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,

    /// Log lines on stderr: `text` (the default) or `json` (one object per line).
    /// `GOV_LOG` or `RUST_LOG` filters them (`info` by default).
    #[arg(long, env = "GOV_LOG_FORMAT", default_value = "text", value_parser = str::parse::<LogFormat>)]
    log_format: LogFormat,
}

/// `--leader-lease` when not given.
const DEFAULT_LEADER_LEASE: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    // Not clap's `requires = "store"`: clap drops it when `--state-dir`
    // (which conflicts with `--store`) is given.
    if args.store.is_none()
        && (args.leader_lease.is_some()
            || args.replica.is_some()
            || args.etcd_ca.is_some()
            || args.etcd_cert.is_some()
            || args.etcd_key.is_some())
    {
        gov_common::errln!(
            "error: --leader-lease, --replica and --etcd-ca/--etcd-cert/--etcd-key need --store etcd://HOST:PORT,... (or etcds://): the state directory has one writer and no leader"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    if let Err(error) = gov_common::log::init(args.log_format) {
        gov_common::report::plain(&error);
        return ExitCode::from(EXIT_USAGE);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            gov_common::errln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            gov_common::report::plain(&error);
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Error> {
    let options = options_of(&args)?;
    check_start(
        &Tokens {
            named: options.tokens.clone(),
            agent: options.agent_token.clone(),
        },
        args.insecure,
        args.listen,
    )?;
    warn_about_access(&args, &options);
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: args.listen.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: args.listen.to_string(),
        source,
    })?;
    let control_plane = match &args.store {
        None => ControlPlane::open(options, shutdown.clone())?,
        Some(url) => {
            let replica = args.replica.clone().unwrap_or_else(|| addr.to_string());
            let config = EtcdConfig::parse(
                url,
                &replica,
                args.leader_lease.unwrap_or(DEFAULT_LEADER_LEASE),
            )?
            .with_tls(EtcdTlsFiles {
                ca: args.etcd_ca.clone(),
                cert: args.etcd_cert.clone(),
                key: args.etcd_key.clone(),
            })?;
            let store = EtcdStore::connect(config, shutdown.clone()).await?;
            let loaded = store.load_converted().await?;
            ControlPlane::with_store(options, store, loaded, shutdown.clone())
        }
    };
    let store = control_plane.store().describe();
    let metrics = match args.metrics_listen {
        None => None,
        Some(at) => {
            let bind_error = |source| Error::Bind {
                addr: at.to_string(),
                source,
            };
            let listener = tokio::net::TcpListener::bind(at)
                .await
                .map_err(bind_error)?;
            let bound = listener.local_addr().map_err(bind_error)?;
            let cp = control_plane.clone();
            tokio::spawn(gov_control_plane::metrics::serve_metrics(
                listener,
                move || cp.metrics_text(),
                shutdown.clone(),
            ));
            Some(bound)
        }
    };
    let metrics = metrics.map_or_else(|| "off".to_owned(), |a| a.to_string());
    let mut signals = Signals::install(OTHERWISE);
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hup) => {
            tokio::spawn(reload_tokens_on_sighup(
                control_plane.clone(),
                args.token_file.clone(),
                args.agent_token_file.clone(),
                hup,
                shutdown.clone(),
            ));
        }
        Err(error) => {
            tracing::warn!(%error, "cannot catch SIGHUP: the token files are read once, at start");
        }
    }
    // Tests and scripts read the bound ports from this line.
    tracing::info!(listen = %addr, %metrics, %store, "govd started");
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let signal = signals.next().await;
            // Cancel first: whatever happens to the log line, the signal is obeyed.
            shutdown.cancel();
            tracing::info!(signal, "received signal");
            let signal = signals.next().await;
            tracing::warn!(signal, "second signal while stopping: exiting now");
            std::process::exit(130);
        });
    }
    serve(listener, control_plane, shutdown, args.drain_timeout).await
}

/// govd's options from its flags, with the token files, the identity CA
/// and the TLS files read.
fn options_of(args: &Args) -> Result<Options, Error> {
    let mut options = Options::new(&args.state_dir);
    options.tokens = match &args.token_file {
        Some(path) => read_named_tokens(path)?,
        None => Vec::new(),
    };
    options.agent_token = args
        .agent_token_file
        .as_deref()
        .map(read_token_file)
        .transpose()?;
    options.history = HistoryLimit {
        entries: args.history,
        bytes: args.history_bytes,
    };
    options.limits = Limits {
        max_policy_bytes: args.max_policy_bytes,
        max_statements: args.max_statements,
        max_diagnostics: args.max_diagnostics,
        concurrent_compiles: args.max_concurrent_compiles,
    };
    options.connections = ConnectionLimits {
        max_connections: args.max_connections,
        max_connections_per_client: args.max_connections_per_client,
        max_streams_per_connection: args.max_streams_per_connection,
        handshake_timeout: args.handshake_timeout,
        auth_timeout: args.auth_timeout,
        http2_keepalive_interval: args.http2_keepalive_interval,
        http2_keepalive_timeout: args.http2_keepalive_timeout,
        tcp_keepalive: args.tcp_keepalive,
        max_watches_per_token: args.max_watches_per_token,
        agent_admissions_per_second: args.agent_admissions_per_second,
    };
    options.intent_grace = args.audit_intent_grace;
    options.agent_limits = AgentLimits {
        max_agents_per_service: args.max_agents_per_service,
        max_label_bytes: args.max_agent_label_bytes,
        max_string_bytes: args.max_agent_string_bytes,
        retention: args.agent_retention,
    };
    options.identity = match &args.identity_ca {
        Some((cert, key)) => Some(std::sync::Arc::new(
            gov_control_plane::identity::Issuer::read(
                cert,
                key,
                &args.identity_trust_domain,
                args.identity_lifetime,
            )?,
        )),
        None => None,
    };
    options.tls = server_tls(args, options.identity.as_deref())?;
    options.agent_certificates = args.tls_client_ca.is_some() || options.identity.is_some();
    Ok(options)
}

/// Warns of what the flags leave open: cleartext, `--insecure`, the one
/// agent token, no agent credentials at all.
fn warn_about_access(args: &Args, options: &Options) {
    if let Some(warning) = cleartext_warning(
        args.listen,
        options.tls.is_some(),
        !options.tokens.is_empty() || options.agent_token.is_some(),
    ) {
        tracing::warn!("{warning}");
    }
    if args.insecure {
        tracing::warn!(
            "--insecure: any local user who reaches {} can apply and release",
            args.listen
        );
    }
    let agent_lines = options.tokens.iter().any(|t| t.role == Role::Agent);
    if options.agent_token.is_some() {
        tracing::warn!(
            "--agent-token-file: its one token may claim any service; give each service its own token (`NAME TOKEN agent SERVICE` lines in --token-file) and drop --agent-token-file"
        );
    } else if !args.insecure && !agent_lines && !options.agent_certificates {
        tracing::warn!(
            "no agent credentials (no `NAME TOKEN agent SERVICE` line in --token-file, no --tls-client-ca): every agent will be refused"
        );
    }
}

/// Re-reads `--token-file` and `--agent-token-file` on each SIGHUP: a
/// token removed from the file stops working at once, without a restart.
/// A file that cannot be read or parsed changes nothing (the tokens in
/// force stay) and the log says why.
async fn reload_tokens_on_sighup(
    control_plane: ControlPlane,
    token_file: Option<PathBuf>,
    agent_token_file: Option<PathBuf>,
    mut hup: tokio::signal::unix::Signal,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            got = hup.recv() => if got.is_none() { return },
        }
        let Some(path) = &token_file else {
            tracing::warn!(
                "SIGHUP: govd runs without --token-file (--insecure); there are no tokens to reload"
            );
            continue;
        };
        let named = match read_named_tokens(path) {
            Ok(named) => named,
            Err(error) => {
                tracing::error!(error = %gov_control_plane::one_line(&error), "SIGHUP: the token file cannot be used; keeping the tokens in force");
                continue;
            }
        };
        let agent = match agent_token_file.as_deref().map(read_token_file).transpose() {
            Ok(agent) => agent,
            Err(error) => {
                tracing::error!(error = %gov_control_plane::one_line(&error), "SIGHUP: the agent token file cannot be used; keeping the tokens in force");
                continue;
            }
        };
        let count = named.len();
        control_plane
            .set_tokens(Tokens { named, agent }, "SIGHUP")
            .await;
        tracing::info!(tokens = count, "SIGHUP: token files reloaded");
    }
}

/// The TLS configuration the flags ask for, if any: read and checked here
/// (a key that does not go with its certificate stops govd before it
/// listens).
fn server_tls(
    args: &Args,
    identity: Option<&gov_control_plane::identity::Issuer>,
) -> Result<Option<ServerTls>, Error> {
    let (cert, key) = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => (
            read_pem("certificate", cert)?,
            read_pem("private key", key)?,
        ),
        _ => {
            if args.tls_client_ca.is_some() {
                return Err(Error::ClientCaWithoutTls);
            }
            return Ok(None);
        }
    };
    // Agents' roots: --tls-client-ca's, and the identity CA (the
    // certificates govd issues). Optional at the handshake: people
    // authenticate with tokens; the agents' `Connect` refuses a stream
    // without a certificate.
    let mut roots = match &args.tls_client_ca {
        Some(ca) => read_pem("client CA", ca)?,
        None => Vec::new(),
    };
    if let Some(issuer) = identity {
        roots.push(b'\n');
        roots.extend_from_slice(issuer.ca_pem().as_bytes());
    }
    Ok(Some(ServerTls::from_pem(&cert, &key, &roots)?))
}

/// `A,B`: two paths (`--identity-ca CERT,KEY`).
fn parse_pair(s: &str) -> Result<(PathBuf, PathBuf), String> {
    match s.split_once(',') {
        Some((a, b)) if !a.trim().is_empty() && !b.trim().is_empty() => {
            Ok((PathBuf::from(a.trim()), PathBuf::from(b.trim())))
        }
        _ => Err(format!("`{s}` is not `CERT,KEY` (two PEM files)")),
    }
}

/// A count that must be at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
use gov_common::testing::deploy_args;

#[cfg(test)]
use gov_common::testing::help_examples;

#[cfg(test)]
mod tests {
    use super::*;

    /// `--help` shows examples, and each one parses.
    #[test]
    fn help_examples_parse() {
        use clap::CommandFactory as _;
        crate::help_examples::check(Args::command(), |words| {
            Args::try_parse_from(std::iter::once("govd".to_owned()).chain(words)).map(drop)
        });
    }

    /// Every command line `deploy/` gives govd (Kubernetes, systemd) parses.
    #[test]
    fn deploy_invocations_parse() {
        for (place, args) in crate::deploy_args::invocations("govd") {
            let argv = std::iter::once("govd".to_owned()).chain(args);
            if let Err(e) = Args::try_parse_from(argv) {
                panic!("{place}: {e}");
            }
        }
    }
}
