//! How to run a sidecar ([`Options`]) and the defaults of its flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::uri::Authority;

use super::abandoned::DEFAULT_CLIENT_GONE_HOLD;
use super::mtls::PeerTls;
use super::upstream::{Balance, UpstreamProtocol};

/// Default drain deadline: Istio's `terminationDrainDuration`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Default time a client may take to send a request head (nginx's
/// `client_header_timeout` is 60 s).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a client may stall a request body or stop reading a response unless
/// `--client-timeout` says otherwise (nginx's default for both).
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Most open client connections per proxy listener unless `--max-connections` says
/// otherwise: far above what one service instance serves, far below what exhausts
/// the agent's memory (a connection holds about 10 KiB of buffers) or a default
/// file descriptor limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Default most open connections of one client address on the inbound listener:
/// a quarter of the listener's, so one client cannot hold them all.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 1024;

/// How to run a sidecar.
#[derive(Debug, Clone)]
pub struct Options {
    /// The service this agent runs beside (the `service` of its `TargetConfig`).
    pub service: String,
    /// Inbound listener: clients of the local service connect here.
    pub listen: SocketAddr,
    /// The local service.
    pub upstream: Authority,
    /// Outbound listener: the local service calls other services through here.
    pub outbound_listen: Option<SocketAddr>,
    /// Admin listener (`/metrics`, `/ready`, `/live`, `POST /shutdown`).
    pub admin_listen: Option<SocketAddr>,
    /// The `TargetConfig` file (YAML or JSON), reloaded on change.
    pub config: Option<PathBuf>,
    /// How long in-flight requests may take to finish once stopping.
    pub drain_timeout: Duration,
    /// Static instance lists of the services the local service calls (static
    /// discovery; [`Sidecar::directory`](super::Sidecar::directory) replaces a
    /// service's set at run time).
    pub instances: Vec<(String, Vec<Authority>)>,
    /// How the outbound listener chooses among a service's endpoints (`--balance`).
    pub balance: Balance,
    /// The control plane URL (used by the control-plane client; unset: standalone).
    pub control_plane: Option<String>,
    /// The protocol spoken to upstreams (the local service and other services).
    pub upstream_protocol: UpstreamProtocol,
    /// How long an HTTP/1 client of the proxy listeners may take to send a request
    /// head; also closes idle keep-alive connections. `None`: no limit. (The HTTP/1
    /// path keeps one timer per connection for it; hyper's side arms one per request.)
    pub header_read_timeout: Option<Duration>,
    /// Where `scope cluster` limits share their counters (`--redis`). `None`:
    /// configs with such limits are refused.
    pub cluster_store: Option<gov_engine::ClusterStore>,
    /// The local service's process id, for lifecycle `via signal` steps (`--service-pid`).
    pub service_pid: Option<u32>,
    /// The longest a client of the proxy listeners may stall its request body or
    /// stop reading a response before the connection is closed (HTTP/1 path;
    /// nginx's `client_body_timeout` and `send_timeout`). `None`: no limit.
    pub client_timeout: Option<Duration>,
    /// Most open client connections per proxy listener (`--max-connections`); a
    /// connection accepted over it is closed at once.
    pub max_connections: usize,
    /// Most open connections of one client address on the inbound listener
    /// (`--max-connections-per-client`); one accepted over it is closed at once.
    /// The outbound listener's one client is the local service: no such cap.
    pub max_connections_per_client: usize,
    /// How long, at most, an admitted call whose client left goes on, its
    /// upstream's answer read and discarded and its permits held
    /// (`--client-gone-hold`).
    pub client_gone_hold: Duration,
    /// Most keys a keyed limit or bulkhead tracks when its policy names no
    /// `max_keys` (`--max-keys-per-rule`).
    pub max_keys_per_rule: u32,
    /// Where the agent keeps its latches (tripped fuses, engaged limits) and, with a
    /// control plane, the last good config it sent (`--state-dir`): both are in force
    /// again before a restarted agent accepts a connection. `None`: neither survives
    /// a restart.
    pub state_dir: Option<PathBuf>,
    /// Where and how to log each call's decisions (`--decision-log`). `None`: no log.
    pub decision_log: Option<crate::decision_log::LogOptions>,
    /// Mutual TLS between agents (`--inbound-mtls`, `--peer-ca`); the
    /// certificate comes later
    /// ([`Sidecar::use_credentials`](super::Sidecar::use_credentials)).
    pub mtls: Arc<PeerTls>,
}

impl Options {
    /// Options for `service` in front of `upstream`, every listener on an ephemeral
    /// loopback port, no config file, default drain deadline.
    pub fn new(service: impl Into<String>, upstream: Authority) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            service: service.into(),
            listen: any,
            upstream,
            outbound_listen: None,
            admin_listen: None,
            config: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            instances: Vec::new(),
            balance: Balance::default(),
            control_plane: None,
            upstream_protocol: UpstreamProtocol::default(),
            header_read_timeout: Some(DEFAULT_HEADER_READ_TIMEOUT),
            cluster_store: None,
            service_pid: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            client_gone_hold: DEFAULT_CLIENT_GONE_HOLD,
            max_keys_per_rule: gov_engine::config::DEFAULT_MAX_KEYS,
            client_timeout: Some(DEFAULT_CLIENT_TIMEOUT),
            state_dir: None,
            decision_log: None,
            mtls: Arc::new(PeerTls::off()),
        }
    }
}
