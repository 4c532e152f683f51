//! Errors of the control plane (start-up, state on disk). Errors of one RPC
//! are `tonic::Status` values built at the edge (see `server.rs`).

use std::path::Path;

/// Something the control plane could not do.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum Error {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Io(#[from] StateIo),

    #[error("the state file `{path}` is not valid JSON")]
    #[diagnostic(
        code(gov::govd::corrupt_state),
        help("restore it from a backup, or move it away to start with an empty state")
    )]
    CorruptState {
        path: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("the state file `{path}` has format {found}, this govd reads format 1")]
    #[diagnostic(
        code(gov::govd::state_format),
        help("run the govd version that wrote it")
    )]
    StateFormat { path: String, found: u32 },

    #[error("the state file `{path}` refers to a source text it does not hold (`{address}`)")]
    #[diagnostic(
        code(gov::govd::missing_text),
        help("restore it from a backup, or move it away to start with an empty state")
    )]
    MissingText { path: String, address: String },

    #[error(
        "the state file `{path}` names a service's compiled config it does not hold (`{part}`)"
    )]
    #[diagnostic(
        code(gov::govd::missing_config),
        help("restore it from a backup, or move it away to start with an empty state")
    )]
    MissingConfig { path: String, part: String },

    #[error("cannot encode the state")]
    #[diagnostic(code(gov::govd::encode))]
    Encode(#[source] serde_json::Error),

    #[error("cannot read the token file `{path}`")]
    #[diagnostic(
        code(gov::govd::token_file),
        help("the file holds the bearer token on one line")
    )]
    TokenFile {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("the token file `{path}` is empty")]
    #[diagnostic(
        code(gov::govd::empty_token),
        help(
            "write one `name token role` line per person (e.g. `alice $(openssl rand -hex 32) admin`)"
        )
    )]
    EmptyToken { path: String },

    #[error("the token file `{path}`, line {line}: {problem}")]
    #[diagnostic(
        code(gov::govd::token_line),
        help(
            "each line is `name token role`, role one of admin, operator, viewer; `#` starts a comment"
        )
    )]
    TokenLine {
        path: String,
        line: usize,
        problem: String,
    },

    #[error("govd needs tokens: without them anyone who reaches `{addr}` can apply and release")]
    #[diagnostic(
        code(gov::govd::no_auth),
        help(
            "pass --token-file FILE (`name token role` lines), or --insecure to run without tokens on a loopback address"
        )
    )]
    NoAuth { addr: String },

    #[error("--insecure is only allowed on a loopback address, not `{addr}`")]
    #[diagnostic(
        code(gov::govd::insecure_remote),
        help("listen on 127.0.0.1 (or ::1), or pass --token-file FILE instead of --insecure")
    )]
    InsecureRemote { addr: String },

    #[error("cannot listen on `{addr}`")]
    #[diagnostic(
        code(gov::govd::bind),
        help("is another govd running? pick another address with --listen or GOV_LISTEN")
    )]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    #[diagnostic(transparent)]
    TlsFile(#[from] gov_common::tls::TlsError),

    #[error(transparent)]
    #[diagnostic(transparent)]
    TlsConfig(#[from] crate::tls_server::TlsConfigError),

    #[error(transparent)]
    #[diagnostic(transparent)]
    Identity(#[from] crate::identity::IdentityError),

    #[error("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")]
    #[diagnostic(code(gov::govd::client_ca_without_tls))]
    ClientCaWithoutTls,

    #[error("the gRPC server failed")]
    #[diagnostic(code(gov::govd::serve))]
    Serve(#[source] tonic::transport::Error),

    #[error(
        "the state in {store} changed under this write (revision {found}, this replica wrote from {expected}); nothing was written"
    )]
    #[diagnostic(
        code(gov::govd::conflict),
        help("another govd replica wrote first: this one reloads the state; look again and retry")
    )]
    Conflict {
        store: String,
        expected: i64,
        found: i64,
    },

    #[error("this replica is no longer the elected leader of {store}; nothing was written")]
    #[diagnostic(
        code(gov::govd::not_leader),
        help("its lease in etcd expired (a pause, or etcd unreachable): the new leader does this")
    )]
    NotLeader { store: String },

    #[error("`{url}` is not an etcd store URL: {problem}")]
    #[diagnostic(
        code(gov::govd::store_url),
        help(
            "write --store etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (etcds:// for TLS), e.g. etcd://10.0.0.1:2379,10.0.0.2:2379"
        )
    )]
    StoreUrl { url: String, problem: String },

    #[error("{problem}")]
    #[diagnostic(
        code(gov::govd::etcd_tls),
        help(
            "for TLS to etcd write --store etcds://HOST:PORT,... with --etcd-ca CA.pem, and \
             --etcd-cert/--etcd-key when the members run with --client-cert-auth"
        )
    )]
    EtcdTls { problem: String },

    #[error("{flag} {problem}")]
    #[diagnostic(
        code(gov::govd::store_option),
        help(
            "with --store, --replica names this replica (not empty, no `/`) and --leader-lease is at least 2s"
        )
    )]
    StoreOption { flag: &'static str, problem: String },

    #[error("etcd ({endpoints}) failed to {op}")]
    #[diagnostic(code(gov::govd::etcd))]
    Etcd {
        endpoints: String,
        op: &'static str,
        /// What to do: `EtcdError::advice` of the source.
        #[help]
        advice: &'static str,
        #[source]
        source: crate::etcd::client::EtcdError,
    },
}

/// A file operation in the state directory failed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("cannot {op} `{path}`")]
#[diagnostic(
    code(gov::govd::state_io),
    help("check that --state-dir is writable and the disk is not full")
)]
pub struct StateIo {
    pub op: &'static str,
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

impl StateIo {
    pub fn new(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            op,
            path: path.display().to_string(),
            source,
        }
    }
}

/// An error on one line, as a gRPC status message carries it: the error,
/// its causes, then its help.
pub fn one_line(error: &dyn miette::Diagnostic) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    if let Some(help) = error.help() {
        line.push_str(&format!("; {help}"));
    }
    line
}
