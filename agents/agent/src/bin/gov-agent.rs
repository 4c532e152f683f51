//! `gov-agent`: the enforcement sidecar. Flags have `GOV_...` environment variables
//! (flag > env > default); logs go to stderr (`GOV_LOG` or `RUST_LOG` filters
//! them, default `info`; `--log-format json` writes JSON lines).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gov_agent::sidecar::{Balance, Options, Sidecar, UpstreamProtocol};
use gov_common::flag::parse_duration;
use gov_common::log::LogFormat;
use gov_common::signal::Signals;
use http::uri::Authority;

#[path = "gov-agent/setup.rs"]
mod setup;

use setup::{
    Credentials, cluster_store, control_tls, decision_log, peer_tls, read_token, start_control,
};

/// The agent's allocator is jemalloc, with its background thread purging freed
/// pages, not the system's. After a flood (many h2c connections and streams,
/// rapid resets, large heads) the memory the flood took is freed when its
/// connections end, but glibc's malloc keeps freed chunks that are not at the
/// top of its heap: the agent stayed at 118 MB after a flood from 8.6 MB at
/// rest, for as long as it ran (a `malloc_trim(0)` brought it to 13 MB, so the
/// memory was free, not held; the workspace forbids the `unsafe` that calling
/// it takes). jemalloc returns freed pages to the system within its decay time
/// (10 s), and its background thread does so while the agent is idle, when
/// nothing else would (mimalloc, tried first, purges only on allocator calls:
/// an idle agent kept 78 of the 113 MB). BENCHMARKS.md, "Memory after floods";
/// tests/sidecar/memory.rs checks the binary. Embedders of the engine or of the
/// sidecar library keep their own allocator.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How to stop the agent when its signal handlers cannot be installed.
const OTHERWISE: &str = "stop the agent with POST /shutdown";

/// Usage errors exit with 64 (EX_USAGE), as every gov binary does.
const EXIT_USAGE: u8 = 64;

/// The `Examples:` of `--help`; a test parses each line through [`Args`].
const EXAMPLES: &str = "\
Examples:
  gov-agent --service order --upstream 127.0.0.1:8080 --config order.yaml
  gov-agent --service order --upstream 127.0.0.1:8080 --control-plane http://127.0.0.1:7070 --state-dir /var/lib/gov-agent
  gov-agent --service order --upstream 127.0.0.1:8080 --control-plane https://govd.internal:7070 --tls-ca ca.pem --control-plane-token-file agent-token";

/// The gov enforcement agent: a reverse proxy beside one service instance that
/// enforces the service's bulkheads, limits and fuses.
#[derive(Debug, Parser)]
#[command(name = "gov-agent", version, about, after_help = EXAMPLES)]
struct Args {
    /// The service this agent runs beside.
    #[arg(long, env = "GOV_SERVICE")]
    service: String,

    /// Inbound listener: clients of the service connect here.
    #[arg(long, env = "GOV_LISTEN", default_value = "127.0.0.1:7061")]
    listen: SocketAddr,

    /// The local service (`host:port`).
    #[arg(long, env = "GOV_UPSTREAM", value_parser = parse_authority)]
    upstream: Authority,

    /// Outbound listener: the service calls other services through here, naming the
    /// callee with a `gov-service` or `host` header. Unset: no outbound listener.
    #[arg(long, env = "GOV_OUTBOUND_LISTEN")]
    outbound_listen: Option<SocketAddr>,

    /// Admin listener: `/metrics`, `/config`, `/ready`, `/live`, `POST /terminate`,
    /// `POST /shutdown` (each POST with the header `gov-admin`, which no web page
    /// can send).
    #[arg(long, env = "GOV_ADMIN_LISTEN", default_value = "127.0.0.1:7069")]
    admin_listen: SocketAddr,

    /// Allow `--admin-listen` on an address other than loopback (`/shutdown`
    /// stops the agent, `/metrics` shows the traffic): only behind a network
    /// that only the platform reaches.
    #[arg(long, env = "GOV_ADMIN_ALLOW_REMOTE", value_parser = clap::builder::BoolishValueParser::new())]
    admin_allow_remote: bool,

    /// The target config (YAML or JSON, as `govc compile` prints it), reloaded when
    /// the file changes.
    #[arg(long, env = "GOV_CONFIG")]
    config: Option<PathBuf>,

    /// How long in-flight requests may take to finish after SIGTERM (`5s`, `500ms`).
    #[arg(long, env = "GOV_DRAIN_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    drain_timeout: Duration,

    /// Instances of a called service: `NAME=HOST:PORT,HOST:PORT`. Repeat the flag, or
    /// separate services with `;`.
    #[arg(long, env = "GOV_INSTANCES", value_delimiter = ';', value_parser = parse_instances)]
    instances: Vec<(String, Vec<Authority>)>,

    /// How the outbound listener chooses an instance: `peak-ewma` (power of two
    /// choices over latency x outstanding requests, an instance's slow-start
    /// weight capping its share) or `round-robin`.
    #[arg(long, env = "GOV_BALANCE", default_value = "peak-ewma")]
    balance: Balance,

    /// The control plane (`http://127.0.0.1:7070`), or its replicas
    /// comma-separated (`URL,URL`): each reconnect tries the next. Unset:
    /// standalone, enforcing the `--config` file only.
    #[arg(long, env = "GOV_CONTROL_PLANE")]
    control_plane: Option<String>,

    /// This agent's name at the control plane (`govc status`). Default: `SERVICE@LISTEN`.
    #[arg(long, env = "GOV_INSTANCE")]
    instance: Option<String>,

    /// Where the agent keeps its latches (tripped fuses, engaged limits, written on every
    /// change) and the last good config the control plane sent: a restarted agent
    /// enforces both before it accepts a connection, whether the control plane is up
    /// or down. Unset: neither survives a restart.
    #[arg(long, env = "GOV_STATE_DIR")]
    state_dir: Option<PathBuf>,

    /// A file holding this agent's token: the token of an `agent` line of
    /// govd's --token-file that names this --service (or the older
    /// `govd --agent-token-file` token).
    #[arg(long, env = "GOV_CONTROL_PLANE_TOKEN_FILE")]
    control_plane_token_file: Option<PathBuf>,

    /// Send the agent token over `http://` to a --control-plane host that
    /// is not loopback anyway (a lab): anyone on the path can read it and
    /// claim this service's instances. Without it the agent refuses to start.
    #[arg(long, env = "GOV_ALLOW_CLEARTEXT_TOKEN", value_parser = clap::builder::BoolishValueParser::new())]
    allow_cleartext_token: bool,

    /// The CA (PEM) that signed govd's certificate; needs an `https://`
    /// --control-plane.
    #[arg(long, env = "GOV_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,

    /// This agent's certificate (PEM) for mutual TLS: govd binds its identity
    /// (`spiffe://.../service/NAME` URI SAN, or CN=NAME) to --service.
    #[arg(long, env = "GOV_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert. Both files are read again every
    /// 2s: a renewed certificate (cert-manager, SPIRE) is used from the next
    /// connection to govd on.
    #[arg(long, env = "GOV_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Get this agent's certificate from govd (`govd --identity-ca`): the
    /// agent makes its key in memory, asks with its
    /// --control-plane-token-file, connects with the certificate, and renews
    /// it at two thirds of its life.
    #[arg(long, env = "GOV_IDENTITY", value_parser = clap::builder::BoolishValueParser::new(), requires_all = ["control_plane", "tls_ca", "control_plane_token_file"], conflicts_with = "tls_cert")]
    identity: bool,

    /// Mutual TLS between agents on the inbound listener: `off` (plain),
    /// `permit` (TLS and plain both, for a migration) or `require` (only
    /// agents with a valid certificate). Needs this agent's certificate
    /// (--identity, or --tls-cert/--tls-key); govd tells callers to use TLS.
    #[arg(
        long,
        env = "GOV_INBOUND_MTLS",
        default_value = "off",
        value_name = "MODE"
    )]
    inbound_mtls: gov_agent::sidecar::InboundMtls,

    /// The certificate (PEM) the inbound listener presents to TLS clients
    /// that name a server (SNI): an ingress that is not an agent. Agents
    /// name none and get the agent's certificate. Needs --inbound-mtls
    /// permit (or require, for an ingress with an agent certificate);
    /// read again every 2s.
    #[arg(
        long,
        env = "GOV_INBOUND_TLS_CERT",
        value_name = "FILE",
        requires = "inbound_tls_key"
    )]
    inbound_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --inbound-tls-cert.
    #[arg(
        long,
        env = "GOV_INBOUND_TLS_KEY",
        value_name = "FILE",
        requires = "inbound_tls_cert"
    )]
    inbound_tls_key: Option<PathBuf>,

    /// Which endpoints of other agents this agent, once it has a
    /// certificate, calls over mutual TLS: `auto` (those govd marks: their
    /// inbound listener takes it), `always` (every endpoint, `--instances`
    /// included: a fleet without govd) or `off`.
    #[arg(
        long,
        env = "GOV_OUTBOUND_MTLS",
        default_value = "auto",
        value_name = "MODE"
    )]
    outbound_mtls: gov_agent::sidecar::OutboundMtls,

    /// The CA (PEM) that signs other agents' certificates, for mutual TLS
    /// between agents. Default: the CA that signed this agent's own
    /// certificate (with --identity, govd's --identity-ca).
    #[arg(long, env = "GOV_PEER_CA", value_name = "FILE")]
    peer_ca: Option<PathBuf>,

    /// The protocol spoken to upstreams: `http1`, `http2` (prior knowledge, h2c), or
    /// `downstream` (what the client spoke: gRPC clients get HTTP/2 with trailers).
    #[arg(long, env = "GOV_UPSTREAM_PROTOCOL", default_value = "http1")]
    upstream_protocol: UpstreamProtocol,

    /// How long a client may take to send a request head (HTTP/1); also closes idle
    /// keep-alive connections. `0s` disables it.
    #[arg(long, env = "GOV_HEADER_READ_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    header_read_timeout: Duration,

    /// Redis where `scope cluster` limits share their counters: one server
    /// `redis://HOST:PORT[/DB]`, a Redis Cluster `redis+cluster://HOST:PORT[,HOST:PORT...]`,
    /// or the master Sentinel names `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME`.
    /// Unset: configs with such limits are refused. `rediss://` and
    /// `rediss+cluster://`: the same over TLS (see --redis-ca).
    #[arg(long, env = "GOV_REDIS")]
    redis: Option<String>,

    /// The CA (PEM) that signed the Redis servers' certificates, for a
    /// `rediss://` --redis. Unset: the system's roots.
    #[arg(long, env = "GOV_REDIS_CA", value_name = "FILE", requires = "redis")]
    redis_ca: Option<PathBuf>,

    /// This agent's client certificate (PEM) for Redis servers that ask for
    /// one (`tls-auth-clients`); with --redis-key.
    #[arg(long, env = "GOV_REDIS_CERT", value_name = "FILE", requires_all = ["redis", "redis_key"])]
    redis_cert: Option<PathBuf>,

    /// The private key (PEM) of --redis-cert.
    #[arg(
        long,
        env = "GOV_REDIS_KEY",
        value_name = "FILE",
        requires = "redis_cert"
    )]
    redis_key: Option<PathBuf>,

    /// The local service's process id, for lifecycle steps `via signal SIG` (warmup
    /// `start`, shutdown `stop`). Unset: such steps fail with a logged error and the
    /// lifecycle goes on.
    #[arg(long, env = "GOV_SERVICE_PID")]
    service_pid: Option<u32>,

    /// How long a client may stall its request body or stop reading a response
    /// before its connection is closed. `0s` disables it.
    #[arg(long, env = "GOV_CLIENT_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    client_timeout: Duration,

    /// How long, at most, an admitted call whose client left (a disconnect, an
    /// HTTP/2 reset) goes on: its upstream's answer is read and discarded and its
    /// bulkhead permits held until the upstream is done or this passes, so a
    /// client that leaves cannot free a permit the upstream still works under.
    #[arg(long, env = "GOV_CLIENT_GONE_HOLD", default_value = "60s", value_parser = parse_duration)]
    client_gone_hold: Duration,

    /// Most open client connections per proxy listener; a connection accepted over it
    /// is closed at once and counted in `gov_agent_connections_over_cap_total`.
    #[arg(long, env = "GOV_MAX_CONNECTIONS", default_value_t = gov_agent::sidecar::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,

    /// Most open connections of one client address on the inbound listener; one
    /// accepted over it is closed at once and counted in
    /// `gov_agent_connections_over_client_cap_total`.
    #[arg(long, env = "GOV_MAX_CONNECTIONS_PER_CLIENT", default_value_t = gov_agent::sidecar::DEFAULT_MAX_CONNECTIONS_PER_CLIENT)]
    max_connections_per_client: usize,

    /// Most keys (consumers, services, instance scopes) one keyed limit or
    /// bulkhead tracks when its policy names no `max_keys`. Past it, a key
    /// that is engaged is never forgotten: calls of new keys share the rule's
    /// overflow counter (or are refused, `overflow reject`), counted in
    /// `gov_agent_rule_keys_overflowed_total`.
    #[arg(long, env = "GOV_MAX_KEYS_PER_RULE", default_value_t = gov_engine::config::DEFAULT_MAX_KEYS, value_parser = clap::value_parser!(u32).range(1..=i64::from(gov_engine::config::MAX_MAX_KEYS)))]
    max_keys_per_rule: u32,

    /// Runtime worker threads. 1 (the default) runs everything on one thread, which
    /// is the cheapest for a sidecar sharing a core with its service. N above 1: N
    /// threads serve the proxy's connections, each connection whole on one of them
    /// (its own runtime, no work stealing, upstream connections kept per thread),
    /// beside the thread of the agent's own tasks (control plane, admin).
    #[arg(long, env = "GOV_WORKER_THREADS", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    worker_threads: usize,

    /// Write one JSON line per call (time, consumer, method, path, status, latency,
    /// what each rule decided) to this file, for `govc replay`
    /// (docs/decision-log.md). Written off the request path: when the writer is
    /// behind, records are dropped and counted, never a call held. Unset: no log.
    #[arg(long, env = "GOV_DECISION_LOG", value_name = "PATH")]
    decision_log: Option<PathBuf>,

    /// The share of calls the decision log records, above 0 and at most 1.
    #[arg(
        long,
        env = "GOV_DECISION_LOG_SAMPLE",
        value_name = "RATE",
        default_value_t = 1.0,
        requires = "decision_log"
    )]
    decision_log_sample: f64,

    /// The size at which the decision log is rotated (PATH -> PATH.1 -> ...).
    #[arg(long, env = "GOV_DECISION_LOG_MAX_BYTES", value_name = "BYTES", default_value_t = gov_agent::decision_log::DEFAULT_MAX_BYTES, requires = "decision_log")]
    decision_log_max_bytes: u64,

    /// Rotated decision log files kept (PATH.1 is the newest).
    #[arg(long, env = "GOV_DECISION_LOG_KEEP", value_name = "N", default_value_t = gov_agent::decision_log::DEFAULT_KEEP, requires = "decision_log")]
    decision_log_keep: usize,

    /// Log lines on stderr: `text` (the default) or `json` (one object per line).
    /// `GOV_LOG` or `RUST_LOG` filters them (`info` by default).
    #[arg(long, env = "GOV_LOG_FORMAT", default_value = "text", value_parser = str::parse::<LogFormat>)]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    // Freed pages go back to the system while the agent is idle too (see
    // ALLOCATOR). Without it jemalloc purges only on allocator calls.
    if let Err(error) = tikv_jemalloc_ctl::background_thread::write(true) {
        gov_common::errln!(
            "warning: jemalloc's background thread is off ({error}): memory freed after a flood is returned only while the agent works"
        );
    }
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    if let Err(error) = gov_common::log::init(args.log_format) {
        gov_common::report::plain(&error);
        return ExitCode::from(EXIT_USAGE);
    }
    if !args.admin_listen.ip().is_loopback() && !args.admin_allow_remote {
        gov_common::errln!(
            "error: --admin-listen {} is not a loopback address; the admin listener can stop the agent (POST /shutdown)\n  help: listen on 127.0.0.1, or add --admin-allow-remote (GOV_ADMIN_ALLOW_REMOTE) if only the platform can reach that address",
            args.admin_listen
        );
        return ExitCode::from(EXIT_USAGE);
    }

    // One thread: everything on it. More: the agent's own tasks on this
    // one, the proxy's connections on that many workers, each with its own
    // runtime (no work stealing; `sidecar::workers`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            gov_common::errln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    if args.worker_threads > 1
        && let Err(error) = gov_agent::sidecar::workers::start(args.worker_threads)
    {
        gov_common::errln!(
            "error: cannot start {} worker threads: {error}\n  help: lower --worker-threads",
            args.worker_threads
        );
        return ExitCode::FAILURE;
    }
    runtime.block_on(run(args))
}

async fn run(args: Args) -> ExitCode {
    let control = args.control_plane.clone().map(|url| {
        let mut c = gov_agent::control::ControlOptions::new(
            url,
            &args.service,
            args.instance.clone().unwrap_or_default(),
        );
        c.state_dir = args.state_dir.clone();
        c
    });
    let tls = match control_tls(&args, control.as_ref()) {
        Ok(tls) => tls,
        Err(code) => return code,
    };
    let cluster_store = match cluster_store(&args) {
        Ok(store) => store,
        Err(code) => return code,
    };
    let token = match read_token(&args, control.as_ref()) {
        Ok(token) => token,
        Err(code) => return code,
    };
    let decision_log = match decision_log(&args) {
        Ok(log) => log,
        Err(code) => return code,
    };
    let inbound_mtls = args.inbound_mtls;
    let mtls = match peer_tls(&args) {
        Ok(mtls) => mtls,
        Err(code) => return code,
    };
    let options = Options {
        service: args.service,
        listen: args.listen,
        upstream: args.upstream,
        outbound_listen: args.outbound_listen,
        admin_listen: Some(args.admin_listen),
        config: args.config,
        drain_timeout: args.drain_timeout,
        instances: args.instances,
        balance: args.balance,
        control_plane: args.control_plane,
        upstream_protocol: args.upstream_protocol,
        header_read_timeout: (!args.header_read_timeout.is_zero())
            .then_some(args.header_read_timeout),
        cluster_store,
        service_pid: args.service_pid,
        max_connections: args.max_connections,
        max_connections_per_client: args.max_connections_per_client,
        client_gone_hold: args.client_gone_hold,
        max_keys_per_rule: args.max_keys_per_rule,
        client_timeout: (!args.client_timeout.is_zero()).then_some(args.client_timeout),
        state_dir: args.state_dir,
        decision_log,
        mtls,
    };
    // Before the listeners (and the "started" line): see `Signals`.
    let signals = Signals::install(OTHERWISE);
    let sidecar = match Sidecar::start(options).await {
        Ok(sidecar) => sidecar,
        Err(error) => {
            gov_common::report::plain(&error);
            return ExitCode::FAILURE;
        }
    };
    let stopping = sidecar.stopping();
    if let Some(control) = control {
        let credentials = Credentials {
            identity: args.identity,
            files: args.tls_cert.clone().zip(args.tls_key.clone()),
            token,
            tls,
        };
        if let Err(code) = start_control(&sidecar, control, credentials, inbound_mtls, &stopping) {
            return code;
        }
    } else if let (Some(cert), Some(key)) = (args.tls_cert.clone(), args.tls_key.clone()) {
        // No control plane: the files still serve mutual TLS between agents.
        sidecar.use_credentials(gov_agent::identity::watch_files(
            cert,
            key,
            gov_agent::identity::FILE_POLL,
            Some(sidecar.on_certificate()),
            stopping.clone(),
        ));
    }
    if let (Some(cert), Some(key)) = (args.inbound_tls_cert.clone(), args.inbound_tls_key.clone()) {
        sidecar.use_ingress_credentials(gov_agent::identity::watch_files(
            cert,
            key,
            gov_agent::identity::FILE_POLL,
            None,
            stopping.clone(),
        ));
    }
    stop_on_signal(signals, sidecar, &stopping).await;
    ExitCode::SUCCESS
}

/// Runs until a signal (then the config's shutdown steps) or until the
/// sidecar stops of itself, and returns once it has stopped; a second signal
/// while it drains exits at once.
async fn stop_on_signal(
    mut signals: Signals,
    sidecar: Sidecar,
    stopping: &tokio_util::sync::CancellationToken,
) {
    tokio::select! {
        signal = signals.next() => {
            tracing::info!(signal, "received signal");
            // The config's shutdown steps (deregister, wait, stop, drain), or the
            // plain drain when it has none.
            sidecar.terminate();
        }
        () = stopping.cancelled() => {}
    }
    // A second signal while draining means "stop now".
    tokio::spawn(async move {
        let signal = signals.next().await;
        tracing::warn!(signal, "second signal while draining: exiting now");
        std::process::exit(130);
    });
    sidecar.stopped().await;
}

fn parse_authority(s: &str) -> Result<Authority, String> {
    let authority: Authority = s
        .parse()
        .map_err(|e| format!("`{s}` is not `host:port`: {e}"))?;
    if authority.port_u16().is_none() {
        return Err(format!("`{s}` needs a port (`host:port`)"));
    }
    Ok(authority)
}

fn parse_instances(s: &str) -> Result<(String, Vec<Authority>), String> {
    let (name, list) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not `NAME=HOST:PORT,...`"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`{s}` has no service name before `=`"));
    }
    let instances = list
        .split(',')
        .map(|a| parse_authority(a.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_owned(), instances))
}

#[cfg(test)]
use gov_common::testing::deploy_args;

#[cfg(test)]
use gov_common::testing::help_examples;

#[cfg(test)]
mod tests {
    use super::*;
    use gov_agent::sidecar::{DEFAULT_DRAIN_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT};

    #[test]
    fn instances_parse() {
        let (name, list) = parse_instances("inventory=127.0.0.1:9001, 127.0.0.1:9002").unwrap();
        assert_eq!(name, "inventory");
        assert_eq!(list.len(), 2);
        assert!(parse_instances("inventory").is_err());
        assert!(parse_instances("inventory=127.0.0.1").is_err());
    }

    #[test]
    fn default_drain_matches_the_library() {
        let args =
            Args::try_parse_from(["gov-agent", "--service", "s", "--upstream", "127.0.0.1:1"])
                .unwrap();
        assert_eq!(args.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
        assert_eq!(args.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
    }

    /// `--help` shows examples, and each one parses.
    #[test]
    fn help_examples_parse() {
        use clap::CommandFactory as _;
        crate::help_examples::check(Args::command(), |words| {
            Args::try_parse_from(std::iter::once("gov-agent".to_owned()).chain(words)).map(drop)
        });
    }

    /// Every command line `deploy/` gives gov-agent (Kubernetes, systemd) parses.
    #[test]
    fn deploy_invocations_parse() {
        for (place, args) in crate::deploy_args::invocations("gov-agent") {
            let argv = std::iter::once("gov-agent".to_owned()).chain(args);
            if let Err(e) = Args::try_parse_from(argv) {
                panic!("{place}: {e}");
            }
        }
    }
}
