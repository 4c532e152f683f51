//! How to run a control plane ([`Options`]): the state directory, the
//! credentials it accepts, TLS, and the bounds on what callers and agents
//! may make it hold.

use std::sync::Arc;
use std::time::Duration;

use crate::auth::NamedToken;
use crate::limits::Limits;

/// How to run a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    pub state_dir: std::path::PathBuf,
    /// Named tokens people present (see `auth`). Empty: every call is
    /// open (`govd --insecure`).
    pub tokens: Vec<NamedToken>,
    /// Bearer token agents present on `Connect`.
    pub agent_token: Option<String>,
    /// How much applied history is kept (versions, bytes of sources).
    pub history: crate::HistoryLimit,
    /// What one `Apply` (or dry run) may ask of the compiler.
    pub limits: Limits,
    /// TLS on the gRPC listener. `None`: plain HTTP/2.
    pub tls: Option<crate::tls_server::ServerTls>,
    /// The TLS listener asks clients for a certificate signed by a client
    /// CA: agents must present one, and its identity must be their service.
    pub agent_certificates: bool,
    /// `--identity-ca`: the CA `Certify` signs agents' certificates with.
    pub identity: Option<Arc<crate::identity::Issuer>>,
    /// Connection cap, handshake deadline, keepalives.
    pub connections: crate::ConnectionLimits,
    /// What agents may make govd hold (instances, labels, strings).
    pub agent_limits: crate::AgentLimits,
    /// How long an audited intent without an outcome may still be in
    /// progress (here or on another replica) before the leader writes its
    /// outcome from the state (`journal`).
    pub intent_grace: Duration,
}

impl Options {
    pub fn new(state_dir: impl Into<std::path::PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            tokens: Vec::new(),
            agent_token: None,
            history: crate::HistoryLimit::default(),
            limits: Limits::default(),
            tls: None,
            agent_certificates: false,
            identity: None,
            connections: crate::ConnectionLimits::default(),
            agent_limits: crate::AgentLimits::default(),
            intent_grace: crate::journal::GRACE,
        }
    }
}
